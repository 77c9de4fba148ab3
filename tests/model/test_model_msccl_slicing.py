"""The MSCCL runtime's slicing, instances and classic shapes, as the model runs them.

Slicing rules are msccl-executor-nccl's (src/device/msccl_kernel.cu, msccl_setup.cc; see
model/formats/msccl/slicing.py); every expected number below is computed by hand from them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from ccltune.api.cluster import ClusterTopology
from ccltune.api.common import Collective
from ccltune.model.cost.protocols import protocol_cost
from ccltune.model.evaluate import published_estimate
from ccltune.model.formats.msccl.classic import allpairs_allreduce, ring_allgather, ring_allreduce
from ccltune.model.formats.msccl.instances import replicate
from ccltune.model.formats.msccl.reader import read_msccl
from ccltune.model.formats.msccl.slicing import (
    SLICE_BYTES,
    expand,
    extrapolate,
    iterations_to_simulate,
    slicing,
    unit_size,
)
from ccltune.model.formats.msccl.writer import MscclFormatError
from ccltune.model.sim.simulate import simulate
from ccltune.topology.presets import load_preset

MIB = 1 << 20


@pytest.fixture(scope="module")
def h100() -> ClusterTopology:
    return load_preset("dgx-h100-1")


def test_slice_sizes_are_the_executors_chunk_sizes() -> None:
    # Simple: 4 MiB buffer / 8 steps x MSCCL_CHUNKSTEPS 4; LL: 512 KiB / 8 / 2 (flags);
    # LL128: 4915200 / 8 x 15/16
    assert SLICE_BYTES == {"Simple": 2 * MIB, "LL": 32768, "LL128": 576000}


@pytest.mark.parametrize(
    ("proto", "size", "chunks", "iterations", "last", "allowed"),
    [
        ("Simple", 64 * MIB, 8, 4, 2 * MIB, 1),  # 8 MiB chunks: 4 full slices
        ("Simple", 3 * MIB, 1, 2, 1 * MIB, 1),  # 2 MiB + the 1 MiB remainder
        ("Simple", 64 << 10, 8, 1, 8192, 71),  # 2 MiB / 8 KiB = 256, capped below MSCCL_MAX_COUNT
        ("LL", 1 * MIB, 8, 4, 32768, 1),  # 128 KiB chunks in 32 KiB slices
        ("LL", 96 << 10, 8, 1, 12288, 2),  # 32768 // 12288
        ("LL128", 2 * 576000 + 1, 1, 3, 1, 1),  # one byte left for a third trip
    ],
)
def test_slicing_counts_follow_the_executor(proto: str, size: int, chunks: int, iterations: int,
                                            last: float, allowed: int) -> None:  # fmt: skip
    sl = slicing(proto, size, chunks)
    assert (sl.iterations, sl.last_bytes, sl.max_allowed_count) == (iterations, last, allowed)
    assert sl.chunk_bytes == size / chunks
    assert sl.calls(5) == -(-5 // allowed)


def test_broadcast_calls_pack_fewer_chunks_under_simple() -> None:
    # BROADCAST_CHUNKSTEPS 1: the host's chunkEffectiveSize is one 512 KiB step, not four
    assert slicing("Simple", 64 << 10, 8, Collective.BROADCAST).max_allowed_count == 64
    assert slicing("Simple", 64 << 10, 8, Collective.ALLREDUCE).max_allowed_count == 71


def test_expansion_repeats_every_transfer_per_iteration_and_conserves_bytes() -> None:
    rb = read_msccl(ring_allreduce(4, 2))
    sl = slicing("Simple", 5 * 4 * MIB + 4 * 4096, rb.chunks_per_loop)
    assert sl.iterations == 3
    sliced = expand(rb, sl, sl.iterations)
    n = len(rb.schedule.transfers)
    assert len(sliced) == 3 * n
    moved = float(sliced.count.sum()) * sliced.chunk_bytes(unit_size(sliced))
    assert moved == pytest.approx(sl.chunk_bytes * sum(t.count for t in rb.schedule.transfers))
    # iteration 0 keeps the file's own dependencies; later ones also wait for the past
    base_deps = [set(t.deps) for t in rb.schedule.transfers]
    got = [
        set(sliced.dep_idx[sliced.dep_ptr[i] : sliced.dep_ptr[i + 1]].tolist()) for i in range(n)
    ]
    assert got == base_deps
    for i in range(n, 3 * n):
        deps = sliced.dep_idx[sliced.dep_ptr[i] : sliced.dep_ptr[i + 1]]
        j = i // n
        assert ((deps // n == j) | (deps // n < j)).all() and (deps // n < j).any()


def test_per_slice_step_costs_grow_with_iterations(h100: ClusterTopology) -> None:
    # One ring threadblock per rank runs all 2(n-1)+1 steps per slice, one iteration after the
    # other: each slice adds the same time, its 15 dependent hops' latencies included, where
    # the unsliced schedule pays each hop's latency once.
    xml = ring_allreduce(8, 1)
    sizes = [8 * 2 * k * MIB for k in (2, 4, 8)]  # 2, 4 and 8 slices per chunk
    t = [published_estimate("allreduce", s, h100, xml).time_us for s in sizes]
    per_slice = (t[2] - t[1]) / 4
    assert t[1] - t[0] == pytest.approx(2 * per_slice, rel=1e-6)
    rb = read_msccl(xml)
    cost = protocol_cost("Simple")
    u = [simulate(rb.schedule, h100, s, cost).time_us for s in sizes]
    unsliced_per_slice = (u[2] - u[1]) / 4
    assert per_slice > 1.02 * unsliced_per_slice


@pytest.mark.parametrize(
    ("xml", "proto", "size"),
    [
        (ring_allreduce(8, 8, "LL"), "LL", 8 * 40 * 32768),  # overlapping threadblocks
        (ring_allgather(8, 2, "LL"), "LL", 8 * 37 * 32768 + 8 * 1000),  # partial last slice
        (allpairs_allreduce(4, "Simple"), "Simple", 16 * 23 * 2 * MIB),
    ],
)
def test_k_iterations_extrapolate_to_the_full_expansion(h100: ClusterTopology, xml: str, proto: str,
                                                         size: int) -> None:  # fmt: skip
    rb = read_msccl(xml)
    sl = slicing(proto, size, rb.chunks_per_loop)
    assert sl.iterations > 20
    cost = protocol_cost(proto)

    def run(k: int) -> float:
        arrays = expand(rb, sl, k)
        return simulate(arrays, h100, unit_size(arrays), cost, engine="heap").time_us

    full = run(sl.iterations)
    ks = iterations_to_simulate(sl, k_max=8)
    assert ks == (8, 4)
    approx = extrapolate(tuple(run(k) for k in ks), ks, sl.iterations)
    assert approx == pytest.approx(full, rel=0.01)  # the documented tolerance


def test_large_files_are_expanded_for_fewer_iterations() -> None:
    sl = slicing("LL", 8 * 100 * 32768, 8)  # 100 iterations
    assert iterations_to_simulate(sl) == (16, 8)
    assert iterations_to_simulate(sl, 20_000) == (10, 5)  # 200k expanded transfers at most
    assert iterations_to_simulate(sl, 150_000) == (2, 1)
    assert iterations_to_simulate(slicing("LL", 8 * 32768, 8), 150_000) == (1,)


def test_extrapolation_is_linear_beyond_k() -> None:
    assert extrapolate((100.0, 60.0), (8, 4), 20) == pytest.approx(100.0 + 12 * 10.0)
    assert extrapolate((55.0,), (3,), 3) == 55.0


@pytest.mark.parametrize("make", [lambda: ring_allreduce(8, 1), lambda: ring_allreduce(8, 4),
                                  lambda: ring_allgather(8, 2), lambda: allpairs_allreduce(8)])  # fmt: skip
def test_instances_double_threadblocks_channels_and_chunks(make: Callable[[], str]) -> None:
    xml = make()
    one, two = read_msccl(xml), read_msccl(replicate(xml, 2))
    assert (two.threadblocks == 2 * one.threadblocks).all()
    assert two.chunks_per_loop == 2 * one.chunks_per_loop
    assert two.schedule.channels == 2 * one.schedule.channels
    assert len(two.schedule.transfers) == 2 * len(one.schedule.transfers)
    # every copy runs on threadblocks of its own: each sending (gpu, tb) appears in one copy
    sched = two.schedule
    senders = {(t.src, int(tb)) for t, tb in zip(sched.transfers, two.send_tb, strict=True)}
    assert len(senders) == 2 * len({(t.src, int(tb)) for t, tb in
                                    zip(one.schedule.transfers, one.send_tb, strict=True)})  # fmt: skip


def test_an_instance_layout_that_misplaces_data_is_refused() -> None:
    # batched copies put rank 0's second half where rank 1's chunk belongs in an allgather
    with pytest.raises(MscclFormatError, match="wrong"):
        read_msccl(replicate(ring_allgather(4, 1), 2, "batched"))
    with pytest.raises(MscclFormatError, match="cnt=1"):
        replicate(allpairs_allreduce(4), 2, "interleaved")
    # a run of chunks across two ranks' blocks has no contiguous copy
    with pytest.raises(MscclFormatError, match="spans two ranks' blocks"):
        replicate(ring_allgather(4, 1).replace('cnt="1"', 'cnt="2"', 1), 2, "blocked")


def test_two_instances_of_a_threadblock_bound_ring_run_about_twice_as_fast(
    h100: ClusterTopology,
) -> None:
    # LL128 caps each threadblock far below NVLink: a second copy of every threadblock halves
    # what each moves
    xml = ring_allreduce(8, 1, "LL128")
    size = 64 * MIB
    t1 = published_estimate("allreduce", size, h100, xml).time_us
    t2 = published_estimate("allreduce", size, h100, replicate(xml, 2)).time_us
    assert 0.45 < t2 / t1 < 0.6


def test_classic_shapes_read_back_as_their_collectives() -> None:
    ar = read_msccl(ring_allreduce(8, 8))
    assert ar.schedule.collective == Collective.ALLREDUCE and ar.chunks_per_loop == 8
    assert len(ar.schedule.transfers) == 8 * 2 * 7  # n chunks x 2(n-1) hops
    ag = read_msccl(ring_allgather(8, 1))
    assert ag.schedule.collective == Collective.ALLGATHER and len(ag.schedule.transfers) == 8 * 7
    ap = read_msccl(allpairs_allreduce(8))
    assert ap.chunks_per_loop == 64 and (ap.threadblocks == 8).all()
    assert np.array_equal(np.sort(np.unique(ap.send_tb)), np.array([p for p in range(8)]))


def test_read_back_names_the_threadblocks_and_steps_of_each_transfer() -> None:
    # ring_allreduce(4, 2): chunk i travels on threadblock i % 2 of every rank; each runs 4 of
    # a rank's 7 ring steps (s, rrs, rrs, rrcs, rcs, rcs, r over 4 chunks), and chunk g leaves
    # rank g first, at step 0 of its threadblock there
    rb = read_msccl(ring_allreduce(4, 2))
    for t, s_tb, r_tb in zip(rb.schedule.transfers, rb.send_tb, rb.recv_tb, strict=True):
        assert s_tb == r_tb == t.chunk % 2 == t.channel
    assert sorted(set(rb.send_step.tolist()) | set(rb.recv_step.tolist())) == [0, 1, 2, 3]
    first = {t.chunk: min(int(s) for u, s in zip(rb.schedule.transfers, rb.send_step, strict=True)
                          if u.src == u.chunk == t.chunk) for t in rb.schedule.transfers}  # fmt: skip
    assert first == {0: 0, 1: 0, 2: 0, 3: 0}
    # the sliced schedule names each connection: one sending and one receiving threadblock
    sliced = expand(rb, slicing("Simple", 4 * MIB, rb.chunks_per_loop), 1)
    tb = getattr(sliced, "tb", None)
    if tb is not None:
        conn = {(int(s), int(d), int(c)) for s, d, c in zip(sliced.src, sliced.dst, sliced.channel,
                                                             strict=True)}  # fmt: skip
        assert len(np.unique(tb)) == len(conn) == 4 * 2


def test_send_first_allpairs_is_limited_to_sizes_its_fifo_holds() -> None:
    # both sides send a whole share (n chunks) before receiving: under Simple the executor
    # blocks once a share needs more than 8 FIFO slots, so the file says where it stops
    xml = allpairs_allreduce(8, "Simple", send_first=True)
    assert 'maxBytes="33554432"' in xml  # 64 chunks x 2 MiB / ceil(8 / 2) calls
    read_msccl(xml)
    with pytest.raises(MscclFormatError, match="deadlock"):
        read_msccl(xml.replace('maxBytes="33554432"', 'maxBytes="0"'))
    read_msccl(allpairs_allreduce(8, "LL", send_first=True))  # 8 calls of 1 slot: always fit
