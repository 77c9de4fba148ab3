"""Work beside the search, in a second process where `workers` allow: NCCL's default choice
and the lower bound at each size (they depend on nothing synthesis does), and part of the
published files' timing. The same code runs on the same inputs in either process, so no number
depends on `workers` (tests/synth/test_synth_speed_workers.py); on 2 cores the user waits for
the longer of the two, not their sum (docs/synthesis-scale.md, "The second core")."""

from __future__ import annotations

import multiprocessing
import os
import resource
import sys
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor

from ..api.cluster import ClusterTopology
from ..api.common import Collective
from ..api.plan import Estimate
from ..model.cost.bounds import lower_bound
from ..model.cost.protocols import protocol_cost
from ..model.formats.msccl.stream import render_lowering
from ..model.formats.msccl.writer import MscclLowering
from ..model.nccl.default import default_estimate, nccl_graph
from ..model.schedule.ir import ScheduleArrays
from ..model.sim.routing import Router
from .grid import as_protocol, file_time


def bound_us(coll: Collective, size: int, topo: ClusterTopology) -> float:
    """The lower bound under the most favourable protocol (so it bounds every choice)."""
    g = nccl_graph(topo)
    return min(
        lower_bound(coll, size, topo,
                    protocol_cost(p, link_kind=g.intra_kind, arch=g.arch, nnodes=g.nnodes)).time_us
        for p in ("LL", "LL128", "Simple")
    )  # fmt: skip



Reference = tuple[Estimate, float]  # NCCL's default choice simulated; the lower bound (us)


def side_process(initializer: Callable[..., None], *initargs: object) -> ProcessPoolExecutor:
    """One process beside this one, forked where the platform allows: it inherits the cluster,
    routes and schedules, and only task arguments and results are pickled."""
    fork = "fork" in multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if fork else None)
    sys.stdout.flush()
    sys.stderr.flush()
    return ProcessPoolExecutor(1, mp_context=ctx, initializer=_silenced,
                               initargs=(initializer, initargs))  # fmt: skip


def _silenced(initializer: Callable[..., None], initargs: tuple[object, ...]) -> None:
    """A forked process inherits the terminal's buffered output (a progress frame being drawn)
    and multiprocessing flushes sys.stdout and sys.stderr when it exits: a second copy would
    reach the terminal. It writes nothing, so it gets streams of its own."""
    sys.stdout = sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
    initializer(*initargs)


def reference(coll: Collective, size: int, topo: ClusterTopology, router: Router) -> Reference:
    nccl = default_estimate(coll, size, topo, router=router, with_bound=False)
    return nccl, bound_us(coll, size, topo)


_ADOPTED: list[tuple[ClusterTopology, Router]] = []  # the reference process' cluster


def _adopt(topo: ClusterTopology, router: Router) -> None:
    _ADOPTED[:] = [(topo, router)]


def _adopted_reference(coll: Collective, size: int) -> Reference:
    return reference(coll, size, *_ADOPTED[0])


class References:
    """NCCL's default choice and the bound at each size. They depend on nothing synthesis does,
    so with `workers` > 1 one process computes them (in evaluation order) while this one
    synthesizes: on 2 cores the user waits for the longer of the two, not their sum. The same
    code runs on the same inputs either way, so every number is the same (tests/synth/
    test_synth_speed_workers.py). Forked where the platform allows: the cluster and its routes
    are inherited, and only (size, result) pairs cross."""

    def __init__(self, coll: Collective, topo: ClusterTopology, router: Router,
                 in_order: list[int], workers: int) -> None:  # fmt: skip
        """`in_order`: the sizes in the order the engine asks for them."""
        self.coll, self.topo, self.router = coll, topo, router
        self._pool: ProcessPoolExecutor | None = None
        self._pending: dict[int, Future[Reference]] = {}
        if workers > 1 and len(in_order) > 1:
            self._pool = side_process(_adopt, topo, router)
            self._pending = {s: self._pool.submit(_adopted_reference, coll, s)
                             for s in in_order}  # fmt: skip

    def at(self, size: int) -> Reference:
        pending = self._pending.pop(size, None)
        if pending is not None:
            return pending.result()
        return reference(self.coll, size, self.topo, self.router)

    def close(self) -> None:
        """Stops the process (sizes never asked for are not computed)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._pending = None, {}


# The file process' state: (collective, cluster, router, lowerings, schedules, texts rendered).
_FILES_ADOPTED: list[tuple[Collective, ClusterTopology, Router, dict[str, MscclLowering],
                           dict[str, ScheduleArrays], dict[tuple[str, str], str]]] = []  # fmt: skip


def _adopt_files(coll: Collective, topo: ClusterTopology, router: Router,
                 lowered: dict[str, MscclLowering],
                 arrs: dict[str, ScheduleArrays]) -> None:  # fmt: skip
    _FILES_ADOPTED[:] = [(coll, topo, router, lowered, arrs, {})]


def _adopted_file_time(label: str, proto: str, size: int) -> float | str:
    coll, topo, router, lowered, arrs, texts = _FILES_ADOPTED[0]
    rendered = next((t for (lb, _), t in texts.items() if lb == label), None)
    if (label, proto) not in texts and rendered is not None:
        texts[(label, proto)] = as_protocol(rendered, proto)
    if (label, proto) not in texts:
        texts[(label, proto)] = render_lowering(lowered[label], name=label, proto=proto,
                                                nchannels=arrs[label].channels)  # fmt: skip
    return file_time(coll, size, topo, router, texts[(label, proto)])


# A forked process shares this one's pages until either writes them, and each process keeps the
# arrays of the files it reads back (the second process added ~0.7 GB on a 512-rank row). h800-rail-512 ReduceScatter
# forked at 732 MB resident and the two reached 2,165 MB PSS (2,060 with gc.freeze() before the
# fork), for no wall gain (215 s with one process or two; BENCHMARKS.md "Session 6"). Above this
# resident size the files are timed in this process, so a synthesis stays within issue 18's
# 2 GB. A measured rule, not a derived one: only 512-GPU rows reach it (BENCHMARKS.md "Session 7").
FILES_APART_MAX_RSS = 512 << 20


def resident_bytes() -> int:
    """This process' resident set now (Linux), else its peak so far (a conservative stand-in)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class FilesApart:
    """Files timed in a second process. Reading a file back is most of a file's cost and is
    cached per process, so the files are shared out whole: by variant where the look ahead
    (`ahead`: (label, protocol, size) in evaluation order) names several (the other protocol
    reuses the parse), else by protocol; this process keeps the first, the other the second,
    and so on. The other's share is queued in order at once; any later size of its files is
    asked for when needed. The times are the same code's on the same file, so nothing depends
    on `workers` (tests/synth/test_synth_speed_workers.py). No process is started when this one
    is already large (FILES_APART_MAX_RSS)."""

    def __init__(self, coll: Collective, topo: ClusterTopology, router: Router,
                 lowered: dict[str, MscclLowering], arrs: dict[str, ScheduleArrays],
                 ahead: list[tuple[str, str, int]]) -> None:  # fmt: skip
        self._by_label = len({lb for lb, _, _ in ahead}) > 1
        units = list(dict.fromkeys(self._unit(lb, pr) for lb, pr, _ in ahead))
        self._theirs = set(units[1::2])
        self._pool: ProcessPoolExecutor | None = None
        self._pending: dict[tuple[str, str, int], Future[float | str]] = {}
        if self._theirs and resident_bytes() > FILES_APART_MAX_RSS:
            self._theirs = set()  # handles() is False: every file is timed in this process
        if self._theirs:
            self._pool = side_process(_adopt_files, coll, topo, router, lowered, arrs)
            for lb, pr, s in ahead:
                if self._unit(lb, pr) in self._theirs:
                    self._pending[(lb, pr, s)] = self._pool.submit(_adopted_file_time, lb, pr, s)

    def _unit(self, label: str, proto: str) -> tuple[str, str]:
        return (label, "") if self._by_label else (label, proto)

    def handles(self, label: str, proto: str) -> bool:
        return self._pool is not None and self._unit(label, proto) in self._theirs

    def time(self, label: str, proto: str, size: int) -> float | str:
        assert self._pool is not None
        key = (label, proto, size)
        pending = self._pending.pop(key, None) or self._pool.submit(_adopted_file_time, *key)
        return pending.result()

    def done_with(self, size: int) -> None:
        """The loop has passed `size`: files it did not time there are not timed."""
        for key in [k for k in self._pending if k[2] == size]:
            self._pending.pop(key).cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._pending = None, {}
