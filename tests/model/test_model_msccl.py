"""MSCCL XML: round trip IR -> XML -> IR on random correct schedules, schema sanity, errors."""

from __future__ import annotations

import random
import xml.etree.ElementTree as ET
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ccltune.api.common import Collective
from ccltune.model.formats.msccl.limits import (
    MAX_XML_NODES,
    callable_sizes,
    first_selected,
    selected,
    size_multiplier,
    xml_nodes,
)
from ccltune.model.formats.msccl.reader import from_msccl_xml
from ccltune.model.formats.msccl.writer import (
    MscclFormatError,
    MscclLowering,
    lower_msccl,
    to_msccl_xml,
)
from ccltune.model.schedule.check import ScheduleError, check_schedule
from ccltune.model.schedule.ir import Schedule, Transfer

ALGO = ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace",
        "minBytes", "maxBytes")  # fmt: skip
STEP = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")
SENDS = {"s", "rcs", "rrs", "rrcs"}
RECVS = {"r", "rcs", "rrs", "rrc", "rrcs"}


def _extra(rng: random.Random, i: int) -> tuple[int, ...]:
    return (rng.randrange(i),) if i and rng.random() < 0.2 else ()


def random_copy_schedule(rng: random.Random, coll: Collective, n: int, c: int) -> Schedule:
    """allgather / broadcast / alltoall: chunks spread along random trees (relays for alltoall)."""
    root = rng.randrange(n) if coll == Collective.BROADCAST else 0
    s = Schedule("rand", coll, n, c, root=root)
    if coll == Collective.BROADCAST and rng.random() < 0.5:
        got: dict[int, int | None] = {root: None}  # the whole buffer as one block per hop
        while len(got) < n:
            h = rng.choice(sorted(got))
            x = rng.choice([r for r in range(n) if r not in got])
            before = got[h]
            deps = ((before,) if before is not None else ()) + _extra(rng, len(s.transfers))
            got[x] = s.add(Transfer(h, x, 0, c, deps=tuple(sorted(set(deps))),
                                    channel=rng.randrange(2)))  # fmt: skip
        return s
    holders: dict[int, dict[int, int | None]] = {}
    targets: dict[int, set[int]] = {}
    for k in range(s.total_chunks):
        if coll == Collective.ALLGATHER:
            holders[k], targets[k] = {k // c: None}, set(range(n))
        elif coll == Collective.BROADCAST:
            holders[k], targets[k] = {root: None}, set(range(n))
        else:
            src, dst = k // (n * c), (k // c) % n
            holders[k], targets[k] = {src: None}, {dst}
    todo = [k for k in holders if not targets[k] <= set(holders[k])]
    while todo:
        k = rng.choice(todo)
        have = holders[k]
        h = rng.choice(sorted(have))
        missing = sorted(targets[k] - set(have))
        others = [r for r in range(n) if r not in have]
        x = rng.choice(missing) if rng.random() < 0.7 or len(have) > 3 else rng.choice(others)
        came = have[h]
        deps = ((came,) if came is not None else ()) + _extra(rng, len(s.transfers))
        have[x] = s.add(Transfer(h, x, k, deps=tuple(sorted(set(deps))), channel=rng.randrange(2)))
        todo = [k for k in holders if not targets[k] <= set(holders[k])]
    return s


def _reduce_up(
    rng: random.Random,
    s: Schedule,
    k: int,
    v: int,
    parent: dict[int, int],
    order: list[int],
    into: dict[int, list[int]],
) -> None:
    """Post-order: v's subtree reduces into v, then v reduces into its parent."""
    kids = [u for u in order if parent.get(u) == v]
    rng.shuffle(kids)
    for u in kids:
        _reduce_up(rng, s, k, u, parent, order, into)
    if v not in parent:
        return
    p = parent[v]
    deps = set(into[v][-1:]) | set(into[p][-1:]) | set(_extra(rng, len(s.transfers)))
    into[p].append(s.add(Transfer(v, p, k, reduce=True, deps=tuple(sorted(deps)),
                                  channel=rng.randrange(2))))  # fmt: skip


def random_reduce_schedule(rng: random.Random, coll: Collective, n: int, c: int) -> Schedule:
    """reducescatter / allreduce: a random reduction tree per chunk, then (allreduce) a random
    broadcast tree back out. Reduces into one rank are chained so writes stay ordered."""
    s = Schedule("rand", coll, n, c)
    for k in range(s.total_chunks):
        owner = k // c if coll == Collective.REDUCESCATTER else rng.randrange(n)
        order = [owner, *rng.sample([r for r in range(n) if r != owner], n - 1)]
        parent = {v: rng.choice(order[:i]) for i, v in enumerate(order) if i}
        into: dict[int, list[int]] = {v: [] for v in order}  # transfers reducing into v
        _reduce_up(rng, s, k, owner, parent, order, into)
        if coll == Collective.ALLREDUCE:
            got = {owner: into[owner][-1] if into[owner] else None}
            while len(got) < n:
                h = rng.choice(sorted(got))
                x = rng.choice([r for r in range(n) if r not in got])
                deps = {d for d in (got[h], *into[x][-1:]) if d is not None}
                got[x] = s.add(
                    Transfer(h, x, k, deps=tuple(sorted(deps)), channel=rng.randrange(2))
                )
    return s


@st.composite
def correct_schedules(draw: st.DrawFn) -> Schedule:
    coll = draw(st.sampled_from(list(Collective)))
    n = draw(st.integers(2, 5))
    c = draw(st.integers(1, 3))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    if coll in (Collective.REDUCESCATTER, Collective.ALLREDUCE):
        return random_reduce_schedule(rng, coll, n, c)
    return random_copy_schedule(rng, coll, n, c)


def per_chunk(s: Schedule) -> Counter[tuple[int, int, int, bool, int]]:
    return Counter(
        (t.src, t.dst, k, t.reduce, t.channel)
        for t in s.transfers
        for k in range(t.chunk, t.chunk + t.count)
    )


def schema_problems(xml: str) -> list[str]:
    """Independent sanity check of what the executor needs (not using msccl.py's parser)."""
    out: list[str] = []
    algo = ET.fromstring(xml)
    out += [f"algo lacks {a}" for a in ALGO if a not in algo.attrib]
    sends: dict[tuple[int, int, int], list[int]] = {}
    recvs: dict[tuple[int, int, int], list[int]] = {}
    for gpu in algo.iter("gpu"):
        g = int(gpu.get("id", -1))
        out += [f"gpu {g} lacks {a}" for a in ("id", "i_chunks", "o_chunks", "s_chunks")
                if a not in gpu.attrib]  # fmt: skip
        size = {"i": int(gpu.get("i_chunks", 0)), "o": int(gpu.get("o_chunks", 0)),
                "s": int(gpu.get("s_chunks", 0))}  # fmt: skip
        tbs = gpu.findall("tb")
        if [int(tb.get("id", -1)) for tb in tbs] != list(range(len(tbs))):
            out.append(f"gpu {g} tb ids not 0..{len(tbs) - 1}")
        seen: set[tuple[str, int, int]] = set()
        for tb in tbs:
            out += [
                f"gpu {g} tb lacks {a}"
                for a in ("id", "send", "recv", "chan")
                if a not in tb.attrib
            ]
            t, snd, rcv, ch = (int(tb.get(a, -9)) for a in ("id", "send", "recv", "chan"))
            for kind, peer in (("send", snd), ("recv", rcv)):
                if peer >= 0:
                    if (kind, peer, ch) in seen:
                        out.append(f"gpu {g}: two tbs {kind} peer {peer} chan {ch}")
                    seen.add((kind, peer, ch))
            for i, stp in enumerate(tb.findall("step")):
                out += [f"gpu {g} tb {t} step {i} lacks {a}" for a in STEP if a not in stp.attrib]
                typ, cnt = stp.get("type"), int(stp.get("cnt", 0))
                if int(stp.get("s", -1)) != i:
                    out.append(f"gpu {g} tb {t} step {i}: s={stp.get('s')}")
                if typ in SENDS:
                    if snd < 0:
                        out.append(f"gpu {g} tb {t} step {i}: send without send peer")
                    sends.setdefault((g, snd, ch), []).append(cnt)
                if typ in RECVS:
                    if rcv < 0:
                        out.append(f"gpu {g} tb {t} step {i}: recv without recv peer")
                    recvs.setdefault((rcv, g, ch), []).append(cnt)
                dep_tb, dep_s = int(stp.get("depid", -1)), int(stp.get("deps", -1))
                if dep_tb >= 0:
                    target = tbs[dep_tb].findall("step")[dep_s]
                    if target.get("hasdep") != "1" or dep_tb == t:
                        out.append(f"gpu {g} tb {t} step {i}: bad dependency {dep_tb}/{dep_s}")
                for b, o, used in (("srcbuf", "srcoff", typ in {"s", "rrc", "cpy"}),
                                   ("dstbuf", "dstoff", typ in {"r", "rrc", "cpy"})):  # fmt: skip
                    buf, off = stp.get(b, "?"), int(stp.get(o, -1))
                    if used and not (off >= 0 and off + cnt <= size.get(buf, -1)):
                        out.append(f"gpu {g} tb {t} step {i}: {b} {buf}[{off}+{cnt}] out of bounds")
    if sends != recvs:
        out.append(f"unmatched sends/recvs: {set(sends) ^ set(recvs)} or counts differ")
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(correct_schedules(), st.sampled_from(["Simple", "LL", "LL128"]), st.booleans())
def test_round_trip_random_correct_schedules(s: Schedule, proto: str, inplace: bool) -> None:
    check_schedule(s)  # the generator makes correct schedules; the checker must agree
    inplace = inplace and s.collective != Collective.ALLTOALL
    xml = to_msccl_xml(
        s, name="rt", proto=proto, inplace=inplace, min_bytes=1024, max_bytes=1 << 20
    )
    assert schema_problems(xml) == []
    back = from_msccl_xml(xml)
    check_schedule(back)
    assert back.collective == s.collective and back.nranks == s.nranks
    assert back.chunks_per_rank == s.chunks_per_rank and back.root == s.root
    assert back.protocol == proto
    assert per_chunk(back) == per_chunk(s)
    # the imported schedule exports again (its deps are now what each rank can enforce)
    again = from_msccl_xml(to_msccl_xml(back, name="rt", proto=proto, inplace=inplace))
    assert per_chunk(again) == per_chunk(s)


def ring_allgather(n: int) -> Schedule:
    s = Schedule("ring", Collective.ALLGATHER, n, 1)
    for o in range(n):
        prev: tuple[int, ...] = ()
        for step in range(n - 1):
            r = (o + step) % n
            prev = (s.add(Transfer(r, (r + 1) % n, o, deps=prev)),)
    return s


def test_ring_allgather_lowering_is_what_msccl_tools_would_write() -> None:
    xml = to_msccl_xml(ring_allgather(3), name="ring3", proto="Simple", max_bytes=65536)
    algo = ET.fromstring(xml)
    assert dict(algo.attrib) == {
        "name": "ring3", "proto": "Simple", "nchannels": "1", "nchunksperloop": "3", "ngpus": "3",
        "coll": "allgather", "inplace": "0", "outofplace": "1", "minBytes": "0",
        "maxBytes": "65536",
    }  # fmt: skip
    gpu0 = algo.find("gpu")
    assert gpu0 is not None
    assert dict(gpu0.attrib) == {"id": "0", "i_chunks": "1", "o_chunks": "3", "s_chunks": "0"}
    tbs = gpu0.findall("tb")
    # one tb for the ring neighbours (send 1, recv 2); the local input->output copy rides on it
    # instead of taking a threadblock (an SM) of its own
    assert [(tb.get("send"), tb.get("recv")) for tb in tbs] == [("1", "2")]
    ring = [(x.get("type"), x.get("srcbuf"), x.get("srcoff"), x.get("dstbuf"), x.get("dstoff"))
            for x in tbs[0].findall("step")]  # fmt: skip
    # steps in dependency-depth order, sends first at a depth: the forward goes out before the
    # next arrival, which it does not need, blocks the threadblock
    assert ring == [
        ("s", "i", "0", "o", "0"),  # own chunk straight from the input
        # the copy waits for nothing: it runs while the first arrival is a hop away
        ("cpy", "i", "0", "o", "0"),
        ("r", "i", "0", "o", "2"),  # src names the sender's slot (gpu 2's input)
        ("s", "o", "2", "o", "2"),  # forward what arrived from gpu 2
        ("r", "o", "1", "o", "1"),  # gpu 1's chunk, forwarded by gpu 2 from its output
    ]
    assert "/>" in xml and " />" not in xml


def test_cross_threadblock_dependencies_use_nops_and_hasdep() -> None:
    # rank 1 receives chunks 0, 2, 3 from three peers (three recv tbs, at most one shared with
    # its send tb), then sends chunk 0 to rank 4 waiting on all three: >= 1 nop is needed.
    n = 5
    s = Schedule("join", Collective.ALLGATHER, n, 1)
    recvd = [s.add(Transfer(k, 1, k)) for k in (0, 2, 3)]
    s.add(Transfer(1, 4, 0, deps=tuple(recvd)))
    have = {0: {0, 1, 4}, 1: {1}, 2: {2, 1}, 3: {3, 1}, 4: {4}}
    for k in range(n):
        for r in range(n):
            if r not in have[k]:
                s.add(Transfer(k, r, k))
    check_schedule(s)
    xml = to_msccl_xml(s, name="join", proto="LL")
    assert schema_problems(xml) == []
    gpu1 = ET.fromstring(xml).findall("gpu")[1]
    steps = [(tb.get("send"), tb.get("recv"), x.attrib) for tb in gpu1.findall("tb")
             for x in tb.findall("step")]  # fmt: skip
    nops = [x for _, _, x in steps if x["type"] == "nop"]
    assert len(nops) == 1 and nops[0]["depid"] != "-1"
    assert sum(x["hasdep"] == "1" for _, _, x in steps) >= 2
    back = from_msccl_xml(xml)
    check_schedule(back)
    assert per_chunk(back) == per_chunk(s)


def test_relay_through_scratch() -> None:
    # alltoall chunk 0->2 relayed by rank 1, which does not output it: it must sit in scratch.
    n, c = 3, 1
    s = Schedule("relay", Collective.ALLTOALL, n, c)
    hop = s.add(Transfer(0, 1, 2))  # chunk (0*3+2) = 2 goes 0 -> 1 ...
    s.add(Transfer(1, 2, 2, deps=(hop,)))  # ... -> 2
    for src in range(n):
        for dst in range(n):
            if src != dst and (src, dst) != (0, 2):
                s.add(Transfer(src, dst, (src * n + dst) * c))
    check_schedule(s)
    xml = to_msccl_xml(s, name="relay", proto="Simple")
    gpu1 = ET.fromstring(xml).findall("gpu")[1]
    assert gpu1.get("s_chunks") == "1"
    bufs = {(x.get("type"), x.get("dstbuf")) for x in gpu1.iter("step")}
    assert ("r", "s") in bufs
    assert per_chunk(from_msccl_xml(xml)) == per_chunk(s)


def test_export_refuses_wrong_schedules_and_bad_options() -> None:
    bad = ring_allgather(3)
    bad.transfers.pop()
    with pytest.raises(ValueError, match="wrong: missing"):
        to_msccl_xml(bad, name="x", proto="Simple")
    with pytest.raises(MscclFormatError, match="proto 'fast'"):
        to_msccl_xml(ring_allgather(3), name="x", proto="fast")
    with pytest.raises(MscclFormatError, match="nchannels=1 but the schedule uses 2"):
        s = ring_allgather(3)
        s.transfers[0] = Transfer(0, 1, 0, channel=1)
        to_msccl_xml(s, name="x", proto="Simple", nchannels=1)
    a2a = Schedule("a", Collective.ALLTOALL, 2, 1, [Transfer(0, 1, 1), Transfer(1, 0, 2)])
    with pytest.raises(MscclFormatError, match="in-place alltoall"):
        to_msccl_xml(a2a, name="x", proto="Simple", inplace=True)


def _two_rank_stream(c: int) -> Schedule:
    """2 ranks swap c chunks one at a time (scattered so that no two merge into one step)."""
    s = Schedule("long", Collective.ALLGATHER, 2, c)
    for k in range(2 * c):
        s.add(Transfer(k // c, 1 - k // c, k, deps=(k - 1,) if k % c else ()))
    return s


def test_export_enforces_executor_step_limit() -> None:
    # The send and receive streams are independent: each gets a threadblock of its own ...
    assert (lower_msccl(_two_rank_stream(31)).threadblocks) == 2
    # ... unless the budget is one: 31 sends + 31 receives + 1 copy, 63 steps, fit the 64 ...
    low = lower_msccl(_two_rank_stream(31), max_threadblocks=1)
    assert (low.max_steps, low.threadblocks) == (63, 1)
    to_msccl_xml(_two_rank_stream(31), name="x", proto="Simple", max_threadblocks=1)
    # ... 65 do not (MSCCL_MAX_NUM_STEPS defaults to 64), unless the executor is built for more
    with pytest.raises(MscclFormatError, match="needs 65 steps; the executor allows 64"):
        to_msccl_xml(_two_rank_stream(32), name="x", proto="Simple", max_threadblocks=1)
    to_msccl_xml(_two_rank_stream(32), name="x", proto="Simple", max_steps=256,
                 max_threadblocks=1)  # fmt: skip


def test_export_enforces_the_threadblock_budget() -> None:
    s = ring_allgather(3)
    s.transfers[0] = Transfer(0, 1, 0, channel=1)  # a second channel: a second threadblock
    assert lower_msccl(s).threadblocks == 2
    with pytest.raises(MscclFormatError, match="gpu 0 needs 2 threadblocks; the limit is 1"):
        to_msccl_xml(s, name="x", proto="Simple", max_threadblocks=1)
    to_msccl_xml(s, name="x", proto="Simple", max_threadblocks=2)


def test_export_counts_xml_nodes_per_rank_as_the_parser_does() -> None:
    # The executor parses one rank at a time: <algo>, every <gpu>, that rank's <tb>s and <step>s
    # (msccl_parser.h MAX_NODES 4096).
    low = lower_msccl(ring_allgather(3))
    assert low.max_xml_nodes == 1 + 3 + 1 + 5
    assert xml_nodes(1020, 4, 3071) == MAX_XML_NODES
    low.require()
    low.schedule = Schedule("big", Collective.ALLGATHER, 1025, 1)
    with pytest.raises(MscclFormatError, match="1025 gpus"):
        low.require()


GOOD = to_msccl_xml(ring_allgather(3), name="ring3", proto="Simple")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda x: x.replace(' maxBytes="0"', ""), "<algo>: missing attribute 'maxBytes'"),
        (lambda x: x.replace('ngpus="3"', 'ngpus="three"'), "ngpus='three' is not an integer"),
        (
            lambda x: x.replace('coll="allgather"', 'coll="gather"'),
            "coll='gather' is not supported",
        ),
        (lambda x: x.replace('proto="Simple"', 'proto="XL"'), "proto='XL'"),
        (lambda x: x.replace("<algo", "<alg").replace("</algo>", "</alg>"), "expected <algo>"),
        (lambda x: x[:-20], "not well-formed XML"),
        (lambda x: x.replace('type="r"', 'type="q"', 1), "type='q' is not one of"),
        (
            lambda x: x.replace('hasdep="0"/>', 'hasdep="0" />').replace(
                ' cnt="1" depid', " depid", 1
            ),
            "missing attribute 'cnt'",
        ),
        (
            lambda x: x.replace('<step s="2" type="r"', '<step s="2" type="s"', 1),
            "gpu 0 sends 3 times to gpu 1 on channel 0 but gpu 1 receives 2 times from it",
        ),
        (
            lambda x: x.replace('depid="-1" deps="-1"', 'depid="0" deps="7"', 1),
            "depends on tb 0 step 7, which does not exist",
        ),
        (
            lambda x: x.replace('srcoff="0" dstbuf="o"', 'srcoff="5" dstbuf="o"', 1),
            r"src i\[5..5\] outside the 1-chunk 'i' buffer",
        ),
        (lambda x: x.replace('<step s="1"', '<step s="4"', 1), "s=4 does not match its position 1"),
        (lambda x: x.replace('<gpu id="2"', '<gpu id="1"'), "id is duplicated"),
    ],
)
def test_import_errors_name_the_element(mutate, message: str) -> None:
    with pytest.raises(MscclFormatError, match=message):
        from_msccl_xml(mutate(GOOD))


def _two_threadblock_ring() -> str:
    """ring3 with gpu 0's first send on channel 1: gpu 0 has tb 0 (s, cpy) and tb 1 (r, s, r):
    the copy goes to the side with the fewest chunks (tb 0 sends one, tb 1 receives two)."""
    s = ring_allgather(3)
    s.transfers[0] = Transfer(0, 1, 0, channel=1)
    return to_msccl_xml(s, name="ring3", proto="Simple")


def test_import_detects_deadlock_and_silent_dependencies() -> None:
    # gpu 0's ring tb first waits on the copy in tb 0, which never signals (hasdep=0)
    algo = ET.fromstring(_two_threadblock_ring())
    gpu0 = algo.findall("gpu")[0]
    first_tb, ring_tb = gpu0.findall("tb")
    first = ring_tb.findall("step")[0]
    first.set("depid", "0")
    first.set("deps", "1")
    with pytest.raises(MscclFormatError, match="hasdep=0 and so never signals"):
        from_msccl_xml(ET.tostring(algo, encoding="unicode"))
    # and if it does signal but tb 0's send waits for the ring's last step: a cycle
    first_tb.findall("step")[1].set("hasdep", "1")
    send = first_tb.findall("step")[0]
    send.set("depid", "1")
    send.set("deps", "2")
    ring_tb.findall("step")[2].set("hasdep", "1")
    with pytest.raises(MscclFormatError, match="deadlock"):
        from_msccl_xml(ET.tostring(algo, encoding="unicode"))


def test_import_rejects_reading_empty_buffers() -> None:
    # gpu 0 forwards from output slot 1 before anything arrived there
    text = GOOD.replace(
        '<step s="0" type="s" srcbuf="i" srcoff="0"',
        '<step s="0" type="s" srcbuf="o" srcoff="1"',
        1,
    )
    with pytest.raises(
        MscclFormatError, match=r"gpu 0 tb 0 step 0: reads o\[1\], which holds no data"
    ):
        from_msccl_xml(text)


@settings(max_examples=40, deadline=None)
@given(correct_schedules(), st.data())
def test_checker_rejects_a_dropped_or_duplicated_transfer(s: Schedule, data: st.DataObject) -> None:
    """Every transfer of these generators is needed (alltoall may relay to a dead end, so not it):
    dropping one must fail the check; repeating a reduce must double count or race."""
    if s.collective == Collective.ALLTOALL or not s.transfers:
        return
    i = data.draw(st.integers(0, len(s.transfers) - 1))
    dropped = Schedule(s.name, s.collective, s.nranks, s.chunks_per_rank, root=s.root)
    for j, t in enumerate(s.transfers):
        if j != i:
            deps = tuple(d - (d > i) for d in t.deps if d != i)
            dropped.add(Transfer(t.src, t.dst, t.chunk, t.count, t.reduce, deps, t.channel))
    with pytest.raises(ScheduleError):
        check_schedule(dropped)
    t = s.transfers[i]
    if t.reduce:
        again = Schedule(s.name, s.collective, s.nranks, s.chunks_per_rank, list(s.transfers))
        again.add(Transfer(t.src, t.dst, t.chunk, t.count, True, (len(s.transfers) - 1,)))
        with pytest.raises(ScheduleError, match=r"double-counts|race|wrong"):
            check_schedule(again)


def foreign_inplace_allgather(n: int, c: int) -> str:
    """An algorithm in the style of msccl-executor-nccl's shipped ndv5 allgather files: in place
    (i_chunks=0, sends read the aliased output), one send-only or recv-only tb per peer and
    chunk, chunk j of every rank on channel j, every rank sending straight to every peer."""
    lines = [
        f'<algo name="ag_direct" proto="LL" nchannels="{c}" nchunksperloop="{n * c}" ngpus="{n}" '
        f'coll="allgather" inplace="1" outofplace="0" minBytes="0" maxBytes="0">'
    ]
    step = 'depid="-1" deps="-1" hasdep="0"'
    for g in range(n):
        lines.append(f'  <gpu id="{g}" i_chunks="0" o_chunks="{n * c}" s_chunks="0">')
        tb = 0
        for p in range(n):
            for j in range(c):
                if p != g:
                    off = p * c + j
                    lines.append(
                        f'    <tb id="{tb}" send="-1" recv="{p}" chan="{j}"><step s="0" type="r" '
                        f'srcbuf="o" srcoff="{off}" dstbuf="o" dstoff="{off}" cnt="1" {step}/></tb>'
                    )
                    tb += 1
        for p in range(n):
            for j in range(c):
                if p != g:
                    off = g * c + j
                    lines.append(
                        f'    <tb id="{tb}" send="{p}" recv="-1" chan="{j}"><step s="0" type="s" '
                        f'srcbuf="o" srcoff="{off}" dstbuf="o" dstoff="{off}" cnt="1" {step}/></tb>'
                    )
                    tb += 1
        lines.append("  </gpu>")
    lines.append("</algo>")
    return "\n".join(lines)


def test_import_foreign_inplace_algorithm() -> None:
    xml = foreign_inplace_allgather(4, 2)
    assert schema_problems(xml) == []
    s = from_msccl_xml(xml)
    assert (s.collective, s.nranks, s.chunks_per_rank, s.protocol) == ("allgather", 4, 2, "LL")
    check_schedule(s)
    assert len(s.transfers) == 4 * 3 * 2
    assert {t.channel for t in s.transfers} == {0, 1}
    # and back out in our own lowering, which is valid out of place and in place
    again = from_msccl_xml(to_msccl_xml(s, name="again", proto="LL", inplace=True))
    assert per_chunk(again) == per_chunk(s)


def test_selection_rule_is_the_executors() -> None:
    # allgather on 16 ranks, 2 chunks per rank: nchunksperloop 32; the executor runs a call of
    # `count` elements per rank when count * 16 % 32 == 0, i.e. for even counts
    assert selected(Collective.ALLGATHER, 16, 32, 16 * 2 * 2, 2)  # count 2
    assert not selected(Collective.ALLGATHER, 16, 32, 16 * 2 * 1, 2)  # count 1
    assert selected(Collective.ALLGATHER, 16, 32, 1000, 2)  # no call has 1000 bytes on 16 ranks
    # allreduce (sizeMultiplier 1): count % nchunksperloop
    assert selected(Collective.ALLREDUCE, 16, 64, 256, 4) and not selected(
        Collective.ALLREDUCE, 16, 64, 128, 4
    )


def test_first_selected_covers_every_size_a_framework_calls() -> None:
    # 16-rank allgather with 4 chunks per rank: fp32 calls of 1 KiB have 16 elements per rank,
    # 512 B have 8: both divisible by 4; 256 B (4) too; 128 B (2 elements) is not
    assert first_selected(Collective.ALLGATHER, 16, 64, 64) == 129
    assert first_selected(Collective.ALLGATHER, 16, 64, 1024) == 1024
    # the range's upper end bounds the search; a range with nothing selectable is None
    assert first_selected(Collective.ALLGATHER, 16, 64, 64, 128) is None
    # 12 ranks: 12 x e x 2^k are the calls (powers of two are no whole number of elements)
    assert callable_sizes(Collective.ALLGATHER, 12, 40, 100) == [48, 64, 96]
    # 2 chunks per rank: fp32 with 1 element per rank (48 B) is the largest call it misses
    assert first_selected(Collective.ALLGATHER, 12, 24, 1) == 49
    # a non-power-of-two chunk count divides no power-of-two size: allreduce on 12 ranks
    assert first_selected(Collective.ALLREDUCE, 12, 12, 1024) is None
    assert size_multiplier(Collective.REDUCESCATTER, 8) == 8
    assert size_multiplier(Collective.BROADCAST, 8) == 1


def _relay_and_chains(c: int) -> Schedule:
    """3-rank allgather, c chunks per rank sent one at a time: gpu 0 relays gpu 1's chunks to
    gpu 2 (each forward depends on its receive) and sends its own to gpu 2 on channel 1."""
    s = Schedule("relay", Collective.ALLGATHER, 3, c)

    def chain(src: int, dst: int, owner: int, chan: int = 0) -> list[int]:
        got: list[int] = []
        for j in range(c):
            deps = (got[-1],) if got else ()
            got.append(s.add(Transfer(src, dst, owner * c + j, deps=deps, channel=chan)))
        return got

    for j, t in enumerate(chain(1, 0, 1)):
        s.add(Transfer(0, 2, c + j, deps=(t,)))
    chain(0, 1, 0)
    chain(0, 2, 0, chan=1)
    chain(2, 0, 2)
    chain(2, 1, 2)
    return s


def _tbs(low: MscclLowering, rank: int) -> list[tuple[int, int, int]]:
    return sorted(low.tb_meta[rank])


def test_independent_streams_keep_their_threadblocks() -> None:
    # gpu 0: sends to 1, forwards to 2, sends to 2 on channel 1; receives from 1 and from 2.
    # Only the receive from 1 and the sends forwarding it are ordered by dependencies: that
    # pair shares a threadblock (it adds no wait, as msccl-tools' fused rcs); the rest stay apart.
    s = _relay_and_chains(4)
    low = lower_msccl(s)
    assert _tbs(low, 0) == [(-1, 2, 0), (1, -1, 0), (2, -1, 1), (2, 1, 0)]
    # Over budget, the fewest pairs that wait are merged: one more, the only one left on chan 0.
    low3 = lower_msccl(s, max_threadblocks=3)
    assert _tbs(low3, 0) == [(1, 2, 0), (2, -1, 1), (2, 1, 0)]
    assert low3.threadblocks == 3
    # The channel-1 send has no receive to pair with: 3 is the least gpu 0 can have.
    with pytest.raises(MscclFormatError, match="gpu 0 needs 3 threadblocks; the limit is 2"):
        lower_msccl(s, max_threadblocks=2)
    for low_ in (low, low3):  # both are files the executor runs and that compute the collective
        xml = low_.render(name="relay", proto="Simple")
        check_schedule(from_msccl_xml(xml))


def test_merged_threadblock_waits_only_for_what_it_needs() -> None:
    # The free pair's sends each come after exactly the receives they forward.
    low = lower_msccl(_relay_and_chains(4))
    tb = low.tb_meta[0].index((2, 1, 0))
    kinds = [step.type for _, step, _ in low.items_of[0][tb] if step is not None]
    assert kinds == ["cpy"] + ["r", "s"] * 4  # the free copy first: it receives first


def test_transfers_ready_together_become_one_step() -> None:
    # Each gpu sends its 4 chunks to the other one transfer at a time, none waiting for another:
    # one step of cnt 4 each way (the executor moves them in one go) ...
    s = Schedule("swap", Collective.ALLGATHER, 2, 4)
    for k in range(8):
        s.add(Transfer(k // 4, 1 - k // 4, k))
    algo = ET.fromstring(to_msccl_xml(s, name="swap", proto="Simple"))
    moves = [(st.get("type"), st.get("cnt")) for st in algo.iter("step")
             if st.get("type") in ("s", "r")]  # fmt: skip
    assert Counter(moves) == {("s", "4"): 2, ("r", "4"): 2}
    check_schedule(from_msccl_xml(ET.tostring(algo, encoding="unicode")))
    # ... but a chain (each waits for the previous) keeps a step per transfer
    assert lower_msccl(_two_rank_stream(4)).max_steps == 5
