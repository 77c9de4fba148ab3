"""The same answers for less work on bundled 512-GPU rows (issue 18, session 8): the channel
deals counted on each distinct link instead of each transfer, and happens-before searches that
stop on reaching the earlier step's threadblock."""

from __future__ import annotations

import numpy as np
import pytest
from synth_helpers import make_cluster

from ccltune.api.cluster import ClusterTopology
from ccltune.model.formats.msccl import reader
from ccltune.model.formats.msccl.executor import Program, XStep, execute, slots_per_step
from ccltune.model.formats.msccl.replay import Reach
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import lower_msccl
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.synth import assemble as asm
from ccltune.synth import engine
from ccltune.synth.milp import solve
from ccltune.synth.sketch import search
from ccltune.topology.presets import load_preset


def _assembled(topo_name: str, coll: str) -> dict[str, ScheduleArrays]:
    topo = load_preset(topo_name)
    return engine.synthesize(topo, coll, [1 << 10, 1 << 26], evaluate=False).schedules


def _streams_by_transfer(arr: ScheduleArrays, chans: int) -> tuple[np.ndarray, np.ndarray]:
    """`engine._streams` as defined, one transfer at a time: per (rank, channel mod chans),
    threadblocks = the larger of its send and receive peers, steps = the larger of its busiest
    stream and its transfers spread over those threadblocks."""
    n = arr.nranks
    sends: dict[tuple[int, int], dict[int, int]] = {}
    recvs: dict[tuple[int, int], dict[int, int]] = {}
    for s, d, c in zip(arr.src.tolist(), arr.dst.tolist(), arr.channel.tolist(), strict=True):
        per_s = sends.setdefault((s, c % chans), {})
        per_s[d] = per_s.get(d, 0) + 1
        per_r = recvs.setdefault((d, c % chans), {})
        per_r[s] = per_r.get(s, 0) + 1
    tbs = np.zeros(n, dtype=np.int64)
    floor = np.zeros(n * chans, dtype=np.int64)
    for r in range(n):
        for c in range(chans):
            s, v = sends.get((r, c), {}), recvs.get((r, c), {})
            k = max(len(s), len(v))
            tbs[r] += k
            most = max([*s.values(), *v.values(), 0])
            floor[r * chans + c] = max(most, -(-(sum(s.values()) + sum(v.values())) // max(k, 1)))
    return tbs, floor


def _random_channels(arr: ScheduleArrays, channels: int, seed: int) -> ScheduleArrays:
    rng = np.random.default_rng(seed)
    ch = rng.integers(0, channels, size=len(arr)).astype(np.int32)
    return ScheduleArrays(
        name=arr.name, collective=arr.collective, nranks=arr.nranks,
        chunks_per_rank=arr.chunks_per_rank, src=arr.src, dst=arr.dst, chunk=arr.chunk,
        count=arr.count, reduce=arr.reduce, channel=ch, dep_ptr=arr.dep_ptr,
        dep_idx=arr.dep_idx, channels=channels,
    )  # fmt: skip


def test_streams_counted_on_links_are_the_transfers_own() -> None:
    """Threadblocks and step floors from the distinct links equal the per-transfer definition
    (channels dealt at random, so links carry different numbers of transfers)."""
    arrs = list(_assembled("dgx-h100-2", "allreduce").values())[:3]
    assert arrs
    for k, arr in enumerate(arrs):
        for channels in (1, 3, 8):
            dealt = _random_channels(arr, channels, k)
            links = engine._Links.of(dealt)
            assert int(links.transfers.sum()) == len(dealt)
            for chans in range(1, channels + 2):
                got_tbs, got_floor = engine._streams(links, chans)
                want_tbs, want_floor = _streams_by_transfer(dealt, chans)
                assert np.array_equal(got_tbs, want_tbs)
                assert np.array_equal(got_floor, want_floor)
                assert engine._apart(links, chans) == max(
                    len({(d, c % chans) for s, d, c in
                         zip(dealt.src.tolist(), dealt.dst.tolist(), dealt.channel.tolist(),
                             strict=True) if s == r})
                    + len({(s, c % chans) for s, d, c in
                           zip(dealt.src.tolist(), dealt.dst.tolist(), dealt.channel.tolist(),
                               strict=True) if d == r})
                    for r in range(dealt.nranks)
                )  # fmt: skip


def test_weighted_counts_are_repeated_keys() -> None:
    rng = np.random.default_rng(5)
    for span in (9, 1 << 10, (1 << 24) + 3):
        keys = rng.integers(0, span, size=400)
        weight = rng.integers(1, 50, size=400)
        got = engine._counted(keys, span, weight)
        want = np.unique(np.repeat(keys, weight), return_counts=True)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        assert got[1].dtype == np.int64


def _ancestors(preds: list[list[XStep]], nsteps: int) -> list[int]:
    """Each step's strict ancestors under happens-before, as a bitset (the definition)."""
    anc = [0] * nsteps
    order = _topological(preds, nsteps)
    for u in order:
        bits = 0
        for p in preds[u]:
            bits |= anc[p.uid] | (1 << p.uid)
        anc[u] = bits
    return anc


def _topological(preds: list[list[XStep]], nsteps: int) -> list[int]:
    indeg = [len(p) for p in preds]
    succ: list[list[int]] = [[] for _ in range(nsteps)]
    for u, ps in enumerate(preds):
        for p in ps:
            succ[p.uid].append(u)
    ready = [u for u in range(nsteps) if indeg[u] == 0]
    out = []
    while ready:
        u = ready.pop()
        out.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    assert len(out) == nsteps
    return out


def _bundle(topo: ClusterTopology) -> ScheduleArrays:
    """The engine's bundled AllGather of the first split sketch within 4 peers per GPU."""
    dims = topo.dimensions
    assert dims is not None
    sketches, stats = search(dims, max_peers=4)
    assert stats.split
    sk = next(sk for sk in sketches if sk.relay is None and asm.split_columns([asm.Column(sk, 1)]))
    pats = asm.Patterns({asm.stage_demand(dims, st, True, 1).key():
                         solve(asm.stage_demand(dims, st, True, 1).canonical())
                         for st in sk.stages})  # fmt: skip
    return asm.allgather_bundled(asm.Fabric(dims), [asm.Column(sk, 1)], pats, 1, "t")


@pytest.mark.parametrize("budget", [4, 16])
def test_happens_before_is_reachability_on_a_bundled_file(budget: int) -> None:
    """`Reach.before(a, b)` is "a is an ancestor of b" for every pair of steps of a bundled
    file read back (runs of several chunks; threadblocks that wait on each other through
    dependencies and FIFOs), lowered on one and on several channels."""
    topo = make_cluster(4, 4)
    arr = _bundle(topo)
    assert arr.count.max() > 1
    low = lower_msccl(arr.to_schedule(), max_threadblocks=budget, order="early")
    low.require(max_threadblocks=budget)
    text = render_lowering(low, name="t", proto="Simple", nchannels=arr.channels)
    attrs, _, tbs = reader._parse(text)
    prog = Program.wire(tbs)
    order = execute(prog, slots_per_step("Simple", int(attrs["maxBytes"]),
                                         int(attrs["nchunksperloop"])))  # fmt: skip
    preds = prog.preds()
    pos = {x.uid: i for i, x in enumerate(order)}
    nsteps = len(prog.steps)
    anc = _ancestors(preds, nsteps)
    before = Reach(preds, pos, prog.steps).before
    hits = 0
    for b in range(nsteps):
        for a in range(nsteps):
            want = bool(anc[b] >> a & 1)
            assert before(a, b) == want, (prog.steps[a].where, prog.steps[b].where)
            hits += want
    assert 0 < hits < nsteps * nsteps // 2
    assert any(x.depid >= 0 for x in prog.steps)  # waits across threadblocks
