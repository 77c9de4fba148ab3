"""Which sizes get the full evaluation, and a file's time as published: shared by the sketch
engine (engine.py), its side process (side.py) and the single-server meshes (mesh.py)."""

from __future__ import annotations

import math

from ..api.cluster import ClusterTopology
from ..api.common import Collective
from ..model.evaluate import published_estimate
from ..model.formats.msccl.writer import MscclFormatError
from ..model.sim.routing import Router
from ..model.sim.simulate import Slower

GRID = 4  # every GRID-th size (and the last) tries every finalist; sizes between, their winners
FILE_FINALISTS = 2  # per grid size, the best (variant, protocol)s by schedule timed as files


def evaluation_order(n: int) -> tuple[list[int], list[int]]:
    """Grid sizes' indices (every GRID-th and the last), and every index in evaluation order:
    the grid first, since a size between grid points is evaluated from its neighbours."""
    grid = sorted({*range(0, n, GRID), n - 1})
    return grid, grid + [i for i in range(n) if i not in grid]


def as_protocol(text: str, proto: str) -> str:
    """A rendered file with `proto` instead of its own: the protocol is one attribute of the
    `<algo>` line, and the first ` proto="` of the text is it (the name before it is escaped,
    so it holds no `"`). One lowering is timed with several protocols: rendered once."""
    at = text.index(' proto="') + len(' proto="')
    return text[:at] + proto + text[text.index('"', at) :]


class AtLeast(float):
    """A file's time known only to be at least this (`file_time`'s `give_up_at`)."""


def file_time(coll: Collective, size: int, topo: ClusterTopology, router: Router,
              text: str, give_up_at: float = math.inf) -> float | str:  # fmt: skip
    """The file `text` read back and timed as published at `size` (us); or why the executor
    cannot run it (MscclFormatError's message). Once its time is known to be at least
    `give_up_at` (a caller that keeps only a faster file), that bound, as AtLeast."""
    try:
        return published_estimate(coll, size, topo, text, router=router,
                                  give_up_at=give_up_at).time_us  # fmt: skip
    except MscclFormatError as exc:
        return str(exc)
    except Slower as slower:
        return AtLeast(slower.bound_us)
