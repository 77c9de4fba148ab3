"""Reading MSCCL XML in the forms RCCL ships, msccl-tools writes and msccl-executor-nccl runs.

Every algorithm here is written by these tests (none is copied) in the shapes those projects use:
RCCL's in-place allreduce files (o_chunks=0, contributions received into scratch, nop steps
carrying dependencies, fused `re` chains), msccl-tools' fused ring steps (rrs, rrcs, rcs) and
attribute spellings, threadblocks that send before they receive.
"""

from __future__ import annotations

import math

import pytest

from ccltune.api.common import Collective
from ccltune.model.cost.protocols import LL, SIMPLE
from ccltune.model.formats.msccl.reader import from_msccl_xml
from ccltune.model.formats.msccl.writer import MscclFormatError
from ccltune.model.schedule.check import ScheduleError, check_schedule
from ccltune.model.sim.simulate import simulate
from ccltune.topology.presets import load_preset


def step(s: int, typ: str, src: tuple[str, int] = ("i", -1), dst: tuple[str, int] = ("o", -1),
         cnt: int = 1, dep: tuple[int, int] = (-1, -1), hasdep: int = 0) -> str:  # fmt: skip
    return (
        f'<step s="{s}" type="{typ}" srcbuf="{src[0]}" srcoff="{src[1]}" dstbuf="{dst[0]}" '
        f'dstoff="{dst[1]}" cnt="{cnt}" depid="{dep[0]}" deps="{dep[1]}" hasdep="{hasdep}"/>'
    )


def tb(tid: int, send: int, recv: int, steps: list[str], chan: int = 0) -> str:
    body = "\n".join(f"      {x}" for x in steps)
    return f'    <tb id="{tid}" send="{send}" recv="{recv}" chan="{chan}">\n{body}\n    </tb>'


def gpu(g: int, i: int, o: int, s: int, tbs: list[str]) -> str:
    return (
        f'  <gpu id="{g}" i_chunks="{i}" o_chunks="{o}" s_chunks="{s}">\n'
        + "\n".join(tbs)
        + ("\n  </gpu>")
    )


def algo(head: str, gpus: list[str]) -> str:
    return f"<algo {head}>\n" + "\n".join(gpus) + "\n</algo>\n"


def rccl_allpairs_allreduce(n: int = 8, in_place: bool = True) -> str:
    """RCCL style, every rank owns chunk g. Reduce-scatter: each peer threadblock first SENDS
    the peer's chunk, then receives the peer's contribution to chunk g into scratch; a reduce
    threadblock waits for all of them (nops + its first re) and adds the scratch slots into
    chunk g with one fused `re` chain. Allgather: the peer threadblocks send the reduced chunk
    (waiting on the chain's last step) and receive the peer's chunk. In place everything lives
    in `i` (o_chunks=0); out of place the reducer first copies i[g] to o[g] and works in `o`."""
    out = "i" if in_place else "o"
    copies = 0 if in_place else 1
    last = copies + (n - 2) + (n - 1) - 1  # position of the chain's last re, which signals
    gpus = []
    for g in range(n):
        peers = [p for p in range(n) if p != g]
        reducer = [step(0, "cpy", ("i", g), ("o", g), hasdep=1)] if copies else []
        base = copies
        reducer += [step(base + k, "nop", cnt=0, dep=(1 + k, 1)) for k in range(n - 2)]
        for j in range(n - 1):
            reducer.append(
                step(base + n - 2 + j, "re", ("s", j), (out, g),
                     dep=(n - 1, 1) if j == 0 else (-1, -1), hasdep=int(j == n - 2))
            )  # fmt: skip
        tbs = [tb(0, -1, -1, reducer)]
        for j, p in enumerate(peers):
            tbs.append(
                tb(1 + j, p, p, [
                    step(0, "s", ("i", p), ("s", peers.index(g) if g in peers else 0)),
                    step(1, "r", ("i", g), ("s", j), hasdep=1),
                    step(2, "s", (out, g), (out, g), dep=(0, last)),
                    step(3, "r", (out, p), (out, p)),
                ])
            )  # fmt: skip
        gpus.append(gpu(g, n, 0 if in_place else n, n - 1, tbs))
    head = (
        f'name="allreduce_allpairs" proto="Simple" nchannels="1" nchunksperloop="{n}" '
        f'ngpus="{n}" coll="allreduce" inplace="{int(in_place)}" '
        f'outofplace="{int(not in_place)}" minBytes="0" maxBytes="{n << 20}"'
    )
    return algo(head, gpus)


def msccl_tools_ring_allreduce(n: int = 4, proto: str = "LL", stage: bool = False) -> str:
    """msccl-tools style (its attribute order, TACCL's extra redop, 2^63-1 as 'no limit'): one
    threadblock per rank that sends first - s, then rrs, rrcs, rcs, r - valid in and out of
    place. At reduce-scatter step k rank g forwards chunk g-k; the chunk it completes is g+1.
    `stage`: gpu 0 first parks i[1] in o[2], harmless out of place only."""
    gpus = []
    for g in range(n):
        nxt, prv = (g + 1) % n, (g - 1) % n
        ops: list[tuple[str, tuple[str, int], tuple[str, int]]] = []
        if stage and g == 0:
            ops.append(("cpy", ("i", 1), ("o", 2)))
        ops.append(("s", ("i", g), ("s", 0)))
        for k in range(1, n - 1):
            ops.append(("rrs", ("i", (g - k) % n), ("s", 0)))
        ops.append(("rrcs", ("i", (g + 1) % n), ("o", (g + 1) % n)))
        for m in range(n - 1):
            ch = (g - m) % n
            ops.append(("rcs" if m < n - 2 else "r", ("o", ch), ("o", ch)))
        steps = [step(i, typ, src, dst) for i, (typ, src, dst) in enumerate(ops)]
        gpus.append(gpu(g, n, n, 1, [tb(0, nxt, prv, steps)]))
    head = (
        f'name="ring" nchunksperloop="{n}" nchannels="1" proto="{proto}" '
        f'maxBytes="{2**63 - 1}" minBytes="0" coll="allreduce" inplace="1" outofplace="1" '
        f'redop="nop" ngpus="{n}"'
    )
    return algo(head, gpus)


def exchange_allgather(proto: str, cnt_per_step: int, max_bytes: int, c: int = 3) -> str:
    """2 ranks: each sends its c chunks to the other before receiving any (steps of
    `cnt_per_step` chunks), then copies its own chunks into place."""
    gpus = []
    for g in range(2):
        p = 1 - g
        sends = [step(k, "s", ("i", j), ("o", g * c + j), cnt_per_step)
                 for k, j in enumerate(range(0, c, cnt_per_step))]  # fmt: skip
        recvs = [step(len(sends) + k, "r", ("i", j), ("o", p * c + j), cnt_per_step)
                 for k, j in enumerate(range(0, c, cnt_per_step))]  # fmt: skip
        copy = step(len(sends) + len(recvs), "cpy", ("i", 0), ("o", g * c), c)
        gpus.append(gpu(g, c, 2 * c, 0, [tb(0, p, p, [*sends, *recvs, copy])]))
    head = (
        f'name="xchg" proto="{proto}" nchannels="1" nchunksperloop="{2 * c}" ngpus="2" '
        f'coll="allgather" inplace="0" outofplace="1" minBytes="0" maxBytes="{max_bytes}"'
    )
    return algo(head, gpus)


@pytest.mark.parametrize("in_place", [True, False])
def test_rccl_style_allreduce_with_local_reductions_is_read_proven_and_simulated(
    in_place: bool,
) -> None:
    xml = rccl_allpairs_allreduce(8, in_place)
    s = from_msccl_xml(xml)  # raises unless the replay proves the allreduce
    assert (s.collective, s.nranks, s.chunks_per_rank, s.protocol) == ("allreduce", 8, 8, "Simple")
    assert len(s.transfers) == 8 * 7 * 2
    # reduce-scatter: contributions land in scratch and are reduced by `re` (reduce=True);
    # allgather: the reduced chunk is stored (reduce=False) and waits for the reduction
    contrib = [t for t in s.transfers if t.reduce]
    result = [t for t in s.transfers if not t.reduce]
    assert len(contrib) == len(result) == 56
    assert all(t.chunk == t.dst for t in contrib) and all(t.chunk == t.src for t in result)
    assert all(not t.deps for t in contrib)  # sent before anything is received: no false wait
    into = {r: {i for i, t in enumerate(s.transfers) if t.reduce and t.dst == r} for r in range(8)}
    # the reduced chunk leaves after the sender's reduction and lands after the receiver's own
    # (its receive follows the send of its reduced chunk in the same threadblock)
    assert all(into[t.src] | into[t.dst] <= set(t.deps) for t in result)
    assert all(s.transfers[d].reduce for t in result for d in t.deps)
    # the IR checker agrees once the seven contributions into a chunk may land in any order
    # (in the file each has its own scratch slot and one `re` chain adds them up)
    check_schedule(s, reduces_commute=True)
    with pytest.raises(ScheduleError, match="both write rank"):
        check_schedule(s)
    res = simulate(s, load_preset("dgx-h100-1"), 64 << 20, SIMPLE)
    assert 0 < res.time_us < math.inf


def test_allreduce_proof_catches_a_missing_or_repeated_reduction_and_a_race() -> None:
    xml = rccl_allpairs_allreduce(4)
    # gpu 0's chain (tb 0) loses its last re: chunk 0 misses one contribution
    lines = xml.splitlines()
    first_gpu_chain = [i for i, ln in enumerate(lines) if 'type="re"' in ln][:3]
    dropped = lines.copy()
    dropped[first_gpu_chain[1]] = dropped[first_gpu_chain[1]].replace('srcoff="1"', 'srcoff="0"')
    with pytest.raises(
        MscclFormatError, match=r"gpu 0 tb 0 step 3: reduction counts ranks \{1\} twice"
    ):
        from_msccl_xml("\n".join(dropped))
    # a contribution reduced before it has certainly arrived (its nop is gone): a race
    assert xml.count('type="nop"') == 4 * 2
    racy = xml.replace('<step s="0" type="nop" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" '
                       'cnt="0" depid="1" deps="1" hasdep="0"/>',
                       '<step s="0" type="nop" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" '
                       'cnt="0" depid="-1" deps="-1" hasdep="0"/>', 1)  # fmt: skip
    with pytest.raises(
        MscclFormatError, match=r"race \(in place\): gpu 0 tb 0 step \d reads s\[0\]"
    ):
        from_msccl_xml(racy)


def test_msccl_tools_style_ring_sends_before_it_receives_and_is_no_deadlock() -> None:
    for n, proto, cost in ((4, "LL", LL), (8, "Simple", SIMPLE)):
        s = from_msccl_xml(msccl_tools_ring_allreduce(n, proto))  # in place and out of place
        assert (s.collective, s.nranks, s.protocol) == ("allreduce", n, proto)
        assert len(s.transfers) == n * (2 * n - 2)
        check_schedule(s)  # this one maps one-to-one onto the IR: the IR checker agrees
        assert sum(t.reduce for t in s.transfers) == n * (n - 1)
        res = simulate(s, load_preset("dgx-h100-1"), 1 << 20, cost)
        assert 0 < res.time_us < math.inf


def test_fifo_slots_decide_whether_sends_before_receives_deadlock() -> None:
    # three one-chunk sends before any receive: 3 x 1 slot fits NCCL_STEPS=8 with LL ...
    s = from_msccl_xml(exchange_allgather("LL", 1, 0))
    check_schedule(s)
    # ... but with Simple every call takes MSCCL_CHUNKSTEPS=4 slots: 12 > 8, both ranks block
    with pytest.raises(MscclFormatError) as err:
        from_msccl_xml(exchange_allgather("Simple", 1, 0))
    msg = str(err.value)
    assert msg.startswith("deadlock: ")
    assert "gpu 0 tb 0 step 2 (s to gpu 1) waits for a free FIFO slot to gpu 1 on channel 0" in msg
    assert "gpu 1 tb 0 step 2 (s to gpu 0) waits for a free FIFO slot to gpu 0 on channel 0" in msg
    # one three-chunk step is one primitive call while the chunks are small (maxAllowedCount >= 3)
    from_msccl_xml(exchange_allgather("Simple", 3, 6 << 10))
    # and three calls, 12 slots, once a chunk fills a call (maxBytes 0: no upper bound)
    with pytest.raises(MscclFormatError, match=r"deadlock: .*waits for a free FIFO slot"):
        from_msccl_xml(exchange_allgather("Simple", 3, 0))


def test_a_real_receive_cycle_is_reported_with_ranks_threadblocks_and_steps() -> None:
    gpus = []
    for g in range(2):
        p = 1 - g
        gpus.append(gpu(g, 1, 2, 0, [tb(0, p, p, [
            step(0, "r", ("i", 0), ("o", p)),
            step(1, "s", ("i", 0), ("o", g)),
            step(2, "cpy", ("i", 0), ("o", g)),
        ])]))  # fmt: skip
    head = ('name="cycle" proto="LL" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" '
            'inplace="0" outofplace="1" minBytes="0" maxBytes="0"')  # fmt: skip
    with pytest.raises(MscclFormatError) as err:
        from_msccl_xml(algo(head, gpus))
    assert str(err.value) == (
        "deadlock: gpu 0 tb 0 step 0 (r from gpu 1) waits for data from gpu 1 on channel 0; "
        "gpu 1 tb 0 step 0 (r from gpu 0) waits for data from gpu 0 on channel 0 "
        "(2 threadblocks stuck)"
    )


def _waiting_allgather(signal_at: int) -> str:
    """gpu 0's send tb waits (depid/deps) on step 0 of its copy tb; `signal_at` says which copy
    step has hasdep=1 (-1: none)."""
    gpus = []
    for g in range(2):
        p = 1 - g
        if g == 0:
            copies = [step(k, "cpy", ("i", 0), ("o", 0), hasdep=int(k == signal_at))
                      for k in range(2)]  # fmt: skip
            tbs = [tb(0, -1, -1, copies),
                   tb(1, p, p, [step(0, "s", ("i", 0), ("o", 0), dep=(0, 0)),
                                step(1, "r", ("i", 0), ("o", 1))])]  # fmt: skip
        else:
            tbs = [tb(0, p, p, [step(0, "s", ("i", 0), ("o", 1)), step(1, "r", ("i", 0), ("o", 0)),
                                step(2, "cpy", ("i", 0), ("o", 1))])]  # fmt: skip
        gpus.append(gpu(g, 1, 2, 0, tbs))
    head = ('name="wait" proto="LL" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" '
            'inplace="0" outofplace="1" minBytes="0" maxBytes="0"')  # fmt: skip
    return algo(head, gpus)


def test_a_dependency_is_released_by_any_later_signalling_step_as_in_the_executor() -> None:
    # the executor waits until the flag of tb 0 is >= deps; step 1 publishes 1 >= 0
    s = from_msccl_xml(_waiting_allgather(signal_at=1))
    check_schedule(s)
    with pytest.raises(MscclFormatError, match="hasdep=0 and so never signals"):
        from_msccl_xml(_waiting_allgather(signal_at=-1))
    # a nop that no real step follows is dropped by the parser, dependency and all
    trailing = _waiting_allgather(signal_at=1).replace(
        "</tb>",
        step(2, "nop", cnt=0, dep=(1, 1)) + "</tb>",
        1,
    )
    assert 'type="nop"' in trailing
    check_schedule(from_msccl_xml(trailing))


def test_nops_carrying_dependencies_need_a_dependent_step_after_them() -> None:
    # msccl_parser.cc refuses a chain of nop dependencies whose next real step has depid=-1
    xml = rccl_allpairs_allreduce(4).replace(
        'dstbuf="i" dstoff="0" cnt="1" depid="3" deps="1"',
        'dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1"',
        1,
    )
    with pytest.raises(MscclFormatError, match="gpu 0 tb 0 step 2: follows nops"):
        from_msccl_xml(xml)


def test_in_place_layouts_are_proven_separately() -> None:
    # gpu 0 parks input chunk 1 in output slot 2 before the ring starts: out of place that slot
    # is overwritten by the allgather later, in place it is input chunk 2, still to be reduced
    staged = msccl_tools_ring_allreduce(4, "LL", stage=True)
    s = from_msccl_xml(staged.replace('inplace="1"', 'inplace="0"'))
    check_schedule(s)
    with pytest.raises(
        MscclFormatError, match=r"gpu 0 tb 0 step \d+: reduces chunk 2 with chunk 1 \(in place\)"
    ):
        from_msccl_xml(staged)


def test_executor_spelling_rules_still_apply() -> None:
    ring = msccl_tools_ring_allreduce(4, "LL")
    with pytest.raises(MscclFormatError, match="missing attribute 'outofplace'"):
        from_msccl_xml(ring.replace(' outofplace="1"', ""))
    with pytest.raises(MscclFormatError, match="coll='reduce_scatter' is not supported"):
        from_msccl_xml(ring.replace('coll="allreduce"', 'coll="reduce_scatter"'))
    with pytest.raises(MscclFormatError, match="inplace=0 and outofplace=0"):
        from_msccl_xml(ring.replace('inplace="1"', 'inplace="0"').replace(
            'outofplace="1"', 'outofplace="0"'))  # fmt: skip
    with pytest.raises(MscclFormatError, match=r"cnt=72 must be in 1\.\.71"):
        from_msccl_xml(ring.replace('cnt="1"', 'cnt="72"', 1))
    assert from_msccl_xml(ring).collective == Collective.ALLREDUCE
