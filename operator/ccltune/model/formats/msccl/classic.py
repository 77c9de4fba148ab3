"""Hand-written MSCCL algorithms in the shapes of msccl-tools' examples, as XML.

Written here from the shapes' descriptions (no msccl-tools code is copied), to compare our
synthesized files with the classics under the same model and to sweep their variants:
- `ring_allreduce(n, channels)`: microsoft/msccl-tools examples/mscclang/allreduce_a100_ring.py:
  n chunks; chunk i is reduced around the ring starting at rank i and then propagated, on
  channel and threadblock i % channels (channels=1: one ring threadblock per rank).
- `allpairs_allreduce(n)`: examples/mscclang/allreduce_a100_allpairs.py: n*n chunks; every
  rank sends peer p its n chunks of p's share into p's scratch (threadblock p), reduces its share
  over n threadblocks, then sends the reduced share to every peer.
- `ring_allgather(n, channels)`: examples/mscclang/allgather_ring.py: rank r's chunk travels the
  ring, on channel r % channels.
Instances are applied afterwards (formats/msccl/instances.py), as msccl-tools does when it
lowers a program.

A threadblock's steps are listed in program order; a step that waits for several others gets
nop steps carrying the extra dependencies first (msccl-tools `dependence_nop`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ....api.common import Collective


@dataclass
class _Op:
    type: str
    src: tuple[str, int]
    dst: tuple[str, int]
    cnt: int = 1
    deps: list[tuple[int, int]] = field(default_factory=list)  # (tb, op index in that tb)


@dataclass
class _Tb:
    send: int
    recv: int
    chan: int
    ops: list[_Op] = field(default_factory=list)

    def add(self, op: _Op) -> int:
        self.ops.append(op)
        return len(self.ops) - 1


@dataclass
class _Gpu:
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: list[_Tb] = field(default_factory=list)


def _render(name: str, coll: Collective, proto: str, nchunks: int, gpus: list[_Gpu],
            inplace: bool, outofplace: bool, max_bytes: int = 0) -> str:  # fmt: skip
    nchannels = 1 + max(t.chan for g in gpus for t in g.tbs)
    lines = [
        f'<algo name="{name}" proto="{proto}" nchannels="{nchannels}" nchunksperloop="{nchunks}" '
        f'ngpus="{len(gpus)}" coll="{coll.value}" inplace="{int(inplace)}" '
        f'outofplace="{int(outofplace)}" minBytes="0" maxBytes="{max_bytes}">'
    ]
    for gid, g in enumerate(gpus):
        # step position of every op once nops are inserted; who signals
        pos: list[list[int]] = []
        signals: set[tuple[int, int]] = {d for t in g.tbs for op in t.ops for d in op.deps}
        for t in g.tbs:
            at, row = 0, []
            for op in t.ops:
                at += max(len(op.deps) - 1, 0)
                row.append(at)
                at += 1
            pos.append(row)
        lines.append(f'  <gpu id="{gid}" i_chunks="{g.i_chunks}" o_chunks="{g.o_chunks}" '
                     f's_chunks="{g.s_chunks}">')  # fmt: skip
        for tid, t in enumerate(g.tbs):
            lines.append(f'    <tb id="{tid}" send="{t.send}" recv="{t.recv}" chan="{t.chan}">')
            s = 0
            for k, op in enumerate(t.ops):
                deps = [(d, pos[d][j]) for d, j in op.deps]
                for d, at in deps[:-1]:
                    lines.append(_step(s, "nop", ("i", -1), ("o", -1), 0, d, at, 0))
                    s += 1
                d, at = deps[-1] if deps else (-1, -1)
                lines.append(_step(s, op.type, op.src, op.dst, op.cnt, d, at,
                                   int((tid, k) in signals)))  # fmt: skip
                s += 1
            lines.append("    </tb>")
        lines.append("  </gpu>")
    lines.append("</algo>")
    return "\n".join(lines) + "\n"


def _step(s: int, typ: str, src: tuple[str, int], dst: tuple[str, int], cnt: int, depid: int,
          deps: int, hasdep: int) -> str:  # fmt: skip
    return (f'      <step s="{s}" type="{typ}" srcbuf="{src[0]}" srcoff="{src[1]}" '
            f'dstbuf="{dst[0]}" dstoff="{dst[1]}" cnt="{cnt}" depid="{depid}" deps="{deps}" '
            f'hasdep="{hasdep}"/>')  # fmt: skip


def ring_allreduce(n: int, channels: int = 1, proto: str = "Simple") -> str:
    """In-place ring allreduce over n chunks, chunk i on channel/threadblock i % channels."""
    if not 1 <= channels <= n:
        raise ValueError(f"channels={channels} must be in 1..{n}")
    gpus = []
    for g in range(n):
        nxt, prv = (g + 1) % n, (g - 1) % n
        tbs = [_Tb(nxt, prv, c) for c in range(channels)]
        seq: list[tuple[str, int]] = [("s", g)]
        seq += [("rrs", (g - k) % n) for k in range(1, n - 1)]
        seq.append(("rrcs", (g + 1) % n))
        seq += [("rcs" if m < n - 2 else "r", (g - m) % n) for m in range(n - 1)]
        for typ, idx in seq:
            tbs[idx % channels].add(_Op(typ, ("i", idx), ("i", idx)))
        gpus.append(_Gpu(n, 0, 0, tbs))
    return _render(f"allreduce_ring_{channels}ch", Collective.ALLREDUCE, proto, n, gpus,
                   inplace=True, outofplace=False)  # fmt: skip


def ring_allgather(n: int, channels: int = 1, proto: str = "Simple") -> str:
    """Out-of-place ring allgather, rank r's chunk on channel/threadblock r % channels."""
    if not 1 <= channels <= n:
        raise ValueError(f"channels={channels} must be in 1..{n}")
    gpus = []
    for g in range(n):
        nxt, prv = (g + 1) % n, (g - 1) % n
        tbs = [_Tb(nxt, prv, c) for c in range(channels)] + [_Tb(-1, -1, 0)]
        tbs[-1].add(_Op("cpy", ("i", 0), ("o", g)))
        tbs[g % channels].add(_Op("s", ("i", 0), ("o", g)))
        for m in range(1, n):
            src = (g - m) % n
            tbs[src % channels].add(_Op("rcs" if m < n - 1 else "r", ("o", src), ("o", src)))
        gpus.append(_Gpu(1, n, 0, tbs))
    return _render(f"allgather_ring_{channels}ch", Collective.ALLGATHER, proto, n, gpus,
                   inplace=False, outofplace=True)  # fmt: skip


def allpairs_allreduce(n: int, proto: str = "Simple", send_first: bool = False) -> str:
    """In-place all-pairs allreduce over n*n chunks (rank r owns chunks r*n .. r*n+n-1).

    A peer threadblock sends and receives its peer's share. By default the lower rank of a pair
    sends first, so the file runs at every size; `send_first` sends first on both sides (the
    exchanges overlap), which the executor runs only while a share fits the connection's FIFO:
    maxBytes is then the largest such size (Simple: 2 calls of 4 slots, i.e. at least n/2
    chunks per call; LL, LL128: n calls of 1 slot always fit)."""
    max_bytes = 0
    if send_first and proto == "Simple":
        max_bytes = n * n * (2 << 20) // -(-n // 2)  # chunk <= chunkEffectiveSize / ceil(n/2)
    gpus = []
    for r in range(n):
        peers = [p for p in range(n) if p != r]
        # threadblock p talks to peer p; threadblock r only reduces
        tbs = [_Tb(p, p, 0) if p != r else _Tb(-1, -1, 0) for p in range(n)]
        got: dict[int, tuple[int, int]] = {}  # scratch slot -> (tb, op) that received it
        # send p's share, receive p's contribution to mine; the lower rank sends first, so
        # that a FIFO too small for a whole share cannot block both sides
        for k, p in enumerate(peers):
            send = _Op("s", ("i", p * n), ("s", 0), n)
            recv = _Op("r", ("i", 0), ("s", k * n), n)
            if r < p or send_first:
                tbs[p].add(send)
            got[k] = (p, tbs[p].add(recv))
            if r > p and not send_first:
                tbs[p].add(send)
        reduced: list[tuple[int, int]] = []
        for index in range(n * (n - 1)):
            k, j = divmod(index, n)
            tb = index % n
            src_tb, src_op = got[k]
            at = tbs[tb].add(_Op("re", ("s", index), ("i", r * n + j), 1, [(src_tb, src_op)]))
            reduced.append((tb, at))
        last = {tb: at for tb, at in reduced}  # each reducing tb's last reduction
        for p in peers:
            deps = [(tb, at) for tb, at in sorted(last.items()) if tb != p]
            send = _Op("s", ("i", r * n), ("i", r * n), n, deps)
            recv = _Op("r", ("i", p * n), ("i", p * n), n)
            for op in (send, recv) if r < p or send_first else (recv, send):
                tbs[p].add(op)
        gpus.append(_Gpu(n * n, 0, (n - 1) * n, tbs))
    return _render("allreduce_allpairs", Collective.ALLREDUCE, proto, n * n, gpus,
                   inplace=True, outofplace=False, max_bytes=max_bytes)  # fmt: skip


__all__ = ["allpairs_allreduce", "ring_allgather", "ring_allreduce"]
