"""What the files built directly (scratch.py, rail_ring.py, rail_ring_reduce.py, tier_ring.py)
share: a threadblock is (its peers and channel as `meta`, its items in order), and a rank's
threadblocks are handed to an MscclLowering with every step told its threadblock and position."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .writer import Item, Loc, _Step

TbMeta = tuple[int, int, int]  # (send peer, recv peer, channel)


class Threadblock(Protocol):
    meta: TbMeta
    items: list[Item]


class OneDepThreadblock:
    """A threadblock whose steps each wait on at most one step (its depid): no nops."""

    def __init__(self, send: int, recv: int, chan: int = 0) -> None:
        self.meta = (send, recv, chan)
        self.items: list[Item] = []

    def add(self, rank: int, typ: str, src: Loc, dst: Loc, dep: _Step | None = None,
            cnt: int = 1) -> _Step:  # fmt: skip
        st = _Step(rank, ("copy", -1, 0), (), typ, src, dst, cnt)
        if dep is not None:
            dep.hasdep = True
        self.items.append(("step", st, dep))
        return st


def add_rank(tbs: Sequence[Threadblock], tb_meta: list[list[TbMeta]],
             items_of: list[dict[int, list[Item]]]) -> None:  # fmt: skip
    """Append one rank's threadblocks, numbering each step by its threadblock and position (nops
    count: the executor numbers steps by position)."""
    for i, tb in enumerate(tbs):
        for pos, (_, step, _) in enumerate(tb.items):
            if step is not None:
                step.tb, step.index = i, pos
    tb_meta.append([tb.meta for tb in tbs])
    items_of.append({i: tb.items for i, tb in enumerate(tbs)})
