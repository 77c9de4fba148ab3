"""Read MSCCL algorithm XML (msccl-executor-nccl, RCCL, msccl-tools) into the schedule IR.

The file is read as the executors read it (msccl_parser.cc: every attribute they require, step
positions as step numbers) and then run as they run it (msccl_exec.py: FIFO connections,
dependency flags), so a deadlock is reported only when the threadblocks really block each other.
The data movement is then replayed chunk slot by chunk slot and proven (msccl_replay.py), out of
place and in place as the file claims.

The result is a Schedule whose transfers are the file's sends (one per run of consecutive
chunks), timed by what the executor waits for: a transfer starts after the receives that precede
its send and its receive, never after the sends before it (a send only fills a FIFO slot).
Local steps (`cpy`, `re`; a run of `re`s msccl_parser.cc fuses counts once) are read too
(`ReadBack.timed`): each is a transfer from its GPU to itself that blocks its threadblock as a
receive does, timed when slicing.CHARGE_LOCAL_STEPS is on (docs/cost-model.md "Local steps").
`read_msccl` also keeps each transfer's threadblocks and steps (`ReadBack`), which the runtime's
slicing needs (slicing.py). A file whose ranks are rank 0's translates is parsed through rank 0
(translates.py); the steps are the same, so the run and the proof are too. Its proof and
transfers are then computed once per orbit of its rank maps' automorphisms and moved to every
rank (orbit.py), the same read-back as rank by rank.
"""

from __future__ import annotations

import gc
import hashlib
import re
import xml.etree.ElementTree as ET
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np

from ....api.common import Collective
from ...schedule.ir import Schedule, Transfer
from .executor import (
    LOCAL_TYPES,
    MAX_REDUCE_FUSION,
    READS_SRC,
    RECV_TYPES,
    SEND_TYPES,
    WRITES_DST,
    Program,
    XStep,
    execute,
    slots_per_step,
)
from .limits import MAX_COUNT
from .orbit import (
    merged_preds,
    orbit_order,
    orbit_prove,
    orbit_transfers,
    orbits_of,
    through_local_ops,
)
from .replay import Reach, Value, prove
from .translates import split_gpus, translated_gpus
from .writer import PROTOCOLS, MscclFormatError, _Layout

# Attributes msccl_parser.cc reads with mscclXmlGetAttr* (a missing one fails the load); others
# (TACCL's redop, comments) are ignored as the parser ignores them.
ALGO_ATTRS = (
    "name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace",
    "minBytes", "maxBytes",
)  # fmt: skip
GPU_SIZES = ("i_chunks", "o_chunks", "s_chunks")
STEP_TYPES = SEND_TYPES | RECV_TYPES | {"cpy", "re", "nop"}
_COLLS = {c.value: c for c in Collective}


@dataclass(frozen=True, slots=True)
class ReadBack:
    """An algorithm as read back: its Schedule and, per transfer, the threadblocks that run it.

    Transfer i is sent by step `send_step[i]` of threadblock `send_tb[i]` on its src gpu and
    received by step `recv_step[i]` of `recv_tb[i]` on its dst gpu (gpu-local ids, as in the
    file). The runtime slices by `chunks_per_loop` (msccl_setup.cc sizePerMscclChunk).

    `timed` (None: the file has no local steps) is what is timed: the schedule's transfers, then
    one per local operation (a `cpy`, or a run of `re`s the parser fuses), from its GPU to
    itself on threadblock `local_tb[i]`, ending at step `local_step[i]`; a transfer waits for the
    local operations before it as for receives. A local operation of cnt chunks reads
    `local_traffic[i] - 1` and writes 1 chunk of local memory per chunk.
    """

    schedule: Schedule
    chunks_per_loop: int
    send_tb: np.ndarray  # int32
    recv_tb: np.ndarray
    send_step: np.ndarray
    recv_step: np.ndarray
    threadblocks: np.ndarray  # per gpu
    timed: Schedule | None = None
    local_tb: np.ndarray | None = None  # int32, per local operation
    local_step: np.ndarray | None = None
    local_traffic: np.ndarray | None = None


def from_msccl_xml(text: str) -> Schedule:
    """Read, run and prove an MSCCL algorithm; return it as a Schedule (MscclFormatError if not)."""
    return read_msccl(text).schedule


@dataclass(frozen=True, slots=True)
class _Read:
    attrs: dict[str, str]
    prog: Program
    order: tuple[int, ...]  # step uids in the order execute() completed them
    result: ReadBack
    senders: tuple[int, ...]  # per transfer of `result`: the uid of the step that sends it
    checked: set[str] = field(default_factory=set)  # protocols `check_protocol` ran it with


# The last files read, keyed by their text without the protocol: synthesis times one lowering
# as a file per protocol, and those files differ only there (see `_same_but_protocol`). The key
# holds a digest of the text after the head, not a copy of it (58 MB for a 500k-step file).
_READS: dict[tuple[str, int, bytes], _Read] = {}
_READS_MAX = 4
# A program of more steps (a 512-rank ring file's ~0.5M: 154 MB) is kept only until another
# file is read or a second protocol of it is checked (`check_protocol`); smaller ones until
# every protocol has run, as a re-read of a protocol costs a full read (docs/synthesis-scale.md,
# "Session 10: the rail rings within 2 GB", "Session 12: one read-back per file").
_LARGE_STEPS = 400_000
_PROTO_ATTR = re.compile(r'\sproto="([^"]*)"')
_DIGEST_SLICE = 1 << 20  # characters encoded at a time


def file_key(text: str) -> tuple[str, int, bytes]:
    """Names the file `text` exactly without holding it: its head (the `<algo>` line), the
    length and a blake2b digest of the rest. A cache keyed by the text holds a copy per equal
    text it was asked with (a 512-rank ring file's is 58 MB)."""
    head = text[: text.find(">") + 1]
    digest = hashlib.blake2b(digest_size=32)
    for i in range(len(head), len(text), _DIGEST_SLICE):
        digest.update(text[i : i + _DIGEST_SLICE].encode())
    return head, len(text) - len(head), digest.digest()


def read_msccl(text: str, key: tuple[str, int, bytes] | None = None) -> ReadBack:
    """Read, run and prove an MSCCL algorithm, keeping each transfer's threadblocks. `key`:
    `file_key(text)` if the caller has it (not hashed again)."""
    head, rest, digest = key or file_key(text)
    key = _PROTO_ATTR.sub("", head, count=1), rest, digest  # the file without its protocol
    for other in [k for k, r in _READS.items() if k != key and len(r.prog.steps) > _LARGE_STEPS]:
        del _READS[other]
    again = _same_but_protocol(_READS.get(key), head)
    if again is not None:
        return again
    with _collector_paused():
        attrs, prog, order, out, senders = _first_read(text)
    if len(_READS) >= _READS_MAX:
        _READS.pop(next(iter(_READS)))
    _READS[key] = _Read(attrs, prog, tuple(x.uid for x in order), out, senders)
    return out


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a file is read: the read builds ~10 objects a step
    (steps, lists, sets) that all live to its end, and each collection walked every one built
    so far (a third of a 512-rank ring file's read, CPU). Its few cycles (closures) wait for
    the first collection after it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _first_read(text: str) -> tuple[dict[str, str], Program, list[XStep], ReadBack,
                                     tuple[int, ...]]:  # fmt: skip
    """Parse, run and prove `text`: its attributes, program, completion order, read-back and
    each transfer's sending step."""
    maps: list[np.ndarray] = []
    attrs, sizes, tbs = _parse(text, maps)
    proto = attrs["proto"]
    coll = _COLLS[attrs["coll"]]
    n = len(tbs)
    prog = Program.wire(tbs)
    order = execute(
        prog, slots_per_step(proto, int(attrs["maxBytes"]), int(attrs["nchunksperloop"]))
    )
    c = _chunks_per_rank(coll, n, sizes, attrs)
    root = _broadcast_root(prog) if coll == Collective.BROADCAST else 0
    lay = _Layout(coll, n, c, root)
    preds = prog.preds()
    pos = [0] * len(prog.steps)  # completion position by uid
    for i, x in enumerate(order):
        pos[x.uid] = i
    reach = Reach(preds, pos, prog.steps, prog)
    got = _orbit_result(attrs, prog, order, preds, reach, lay, maps, c) if maps else None
    if got is not None:
        out, senders = got
    else:
        before = reach.before
        sent: dict[int, list[Value]] = {}
        combined: set[int] = set()
        for inplace, claim in ((False, "outofplace"), (True, "inplace")):
            if int(attrs[claim]):
                sent.clear()  # the last proof's are kept: not two at once
                sent, combined = prove(prog, order, before, lay, inplace)
        out, senders = _result(attrs, prog, order, preds, reach, sent, combined, c, root)
    return attrs, prog, order, out, senders


def _result(attrs: dict[str, str], prog: Program, order: list[XStep],
               preds: list[list[XStep]], reach: Reach,
               sent: dict[int, list[Value]], combined: set[int], c: int,
               root: int) -> tuple[ReadBack, tuple[int, ...]]:  # fmt: skip
    """The ReadBack, and the uid of each transfer's sending step."""
    transfers, ends, ops, timed = _transfers(prog, order, preds, reach, sent, combined)
    sched = Schedule(
        name=attrs["name"],
        collective=_COLLS[attrs["coll"]],
        nranks=len(prog.tbs),
        chunks_per_rank=c,
        transfers=transfers,
        root=root,
        protocol=attrs["proto"],
        channels=int(attrs["nchannels"]),
    )

    def column(values: Iterator[int]) -> np.ndarray:
        return np.fromiter(values, dtype=np.int32, count=len(ends))

    def per_op(values: Iterator[int]) -> np.ndarray | None:
        return np.fromiter(values, dtype=np.int32, count=len(ops)) if ops else None

    return ReadBack(
        sched, int(attrs["nchunksperloop"]),
        column(x.tb for x, _ in ends), column(rx.tb for _, rx in ends),
        column(x.idx for x, _ in ends), column(rx.idx for _, rx in ends),
        np.array([len(g) for g in prog.tbs], dtype=np.int32),
        replace(sched, transfers=timed) if ops else None,
        per_op(op[0].tb for op in ops), per_op(op[-1].idx for op in ops),
        # cpy: 1 read + 1 write; a fused reduction also reads its destination
        per_op(2 if op[0].type == "cpy" else len(op) + 2 for op in ops),
    ), tuple(x.uid for x, _ in ends)  # fmt: skip


def _orbit_result(attrs: dict[str, str], prog: Program, order: list[XStep],
                  preds: list[list[XStep]], reach: Reach, lay: _Layout, maps: list[np.ndarray],
                  c: int) -> tuple[ReadBack, tuple[int, ...]] | None:  # fmt: skip
    """`_result` of a file whose ranks are rank 0's translates, proved and built per orbit
    (orbit.py); None where that does not apply or the proof fails (the full read reports it)."""
    orb = orbits_of(maps, prog, lay)
    walk = None if orb is None else orbit_order(prog, preds, orb)
    if orb is None or walk is None:
        return None
    sent: dict[int, list[Value]] = {}
    combined: set[int] = set()
    try:
        for inplace, claim in ((False, "outofplace"), (True, "inplace")):
            if int(attrs[claim]):
                sent.clear()
                sent, combined = orbit_prove(prog, walk, orb, reach.before, lay, inplace)
    except MscclFormatError:
        return None
    got = orbit_transfers(prog, order, preds, reach, walk, orb, sent, combined, _local_ops,
                          _consecutive, _acyclic)  # fmt: skip
    if got is None:
        return None
    sched = Schedule(
        name=attrs["name"], collective=_COLLS[attrs["coll"]], nranks=len(prog.tbs),
        chunks_per_rank=c, transfers=got.transfers, root=0, protocol=attrs["proto"],
        channels=int(attrs["nchannels"]),
    )  # fmt: skip
    return ReadBack(
        sched, int(attrs["nchunksperloop"]), got.send_tb, got.recv_tb, got.send_step,
        got.recv_step, np.array([len(g) for g in prog.tbs], dtype=np.int32),
        replace(sched, transfers=got.timed) if got.timed else None, got.local_tb,
        got.local_step, got.local_traffic,
    ), got.senders  # fmt: skip


def _same_but_protocol(seen: _Read | None, head: str) -> ReadBack | None:
    """A file read before with another protocol: the protocol changes only its FIFO slots
    (slots_per_step). The run itself is repeated (another protocol's slots may deadlock where
    the first did not). With the same completion order the transfers are the same and only the
    schedule's protocol differs. With another order the proof still holds: it found every two
    accesses of a slot ordered by happens-before, which no order changes, so every order reads
    the same values; and so do the transfers (`_renumbered`): only their numbering, in
    completion order, changes."""
    got = _PROTO_ATTR.search(head)
    if seen is None or got is None or got.group(1) not in PROTOCOLS:
        return None  # the full read reports what is wrong
    proto, attrs = got.group(1), seen.attrs
    prog = seen.prog
    order = execute(prog, slots_per_step(proto, int(attrs["maxBytes"]),
                                         int(attrs["nchunksperloop"])))  # fmt: skip
    rb = seen.result
    if tuple(x.uid for x in order) != seen.order:
        return _renumbered(seen, order, proto)
    sched = replace(rb.schedule, protocol=proto, transfers=list(rb.schedule.transfers))
    timed = None if rb.timed is None else replace(rb.timed, protocol=proto,
                                                  transfers=list(rb.timed.transfers))  # fmt: skip
    return replace(rb, schedule=sched, timed=timed)


def same_file(key: tuple[str, int, bytes]) -> tuple[str, int, bytes]:
    """`file_key`'s name without the protocol: one lowering timed as a file per protocol."""
    head, rest, digest = key
    return _PROTO_ATTR.sub("", head, count=1), rest, digest


def protocol_of(key: tuple[str, int, bytes]) -> str | None:
    """The protocol `file_key`'s head names (None: no `proto` attribute)."""
    got = _PROTO_ATTR.search(key[0])
    return None if got is None else got.group(1)


def check_protocol(text: str, key: tuple[str, int, bytes] | None = None) -> None:
    """Raise MscclFormatError where the executor cannot run `text` under its own protocol: a
    deadlock (its FIFO slots are the protocol's) or a protocol it does not know. For a caller
    holding the same file's read-back under another protocol: what reading `text` would add,
    as the proof and the transfers hold in every completion order (`_same_but_protocol`), so
    no second read-back is built (a 512-rank ring file's is ~110 MB)."""
    key = key or file_key(text)
    proto = protocol_of(key)
    if proto is None or proto not in PROTOCOLS:
        read_msccl(text, key)  # says what is wrong
        return
    seen = _READS.get(same_file(key))
    if seen is not None:
        prog, attrs = seen.prog, seen.attrs
        seen.checked.add(proto)
        # its program is kept for the protocols not yet run (a large one's for one more: a
        # third protocol is rare, and parsing again then costs less than holding it)
        if len(prog.steps) > _LARGE_STEPS or {attrs["proto"], *seen.checked} >= set(PROTOCOLS):
            del _READS[same_file(key)]
    else:  # its program was let go (_LARGE_STEPS): the run needs only the program
        with _collector_paused():
            attrs, _, tbs = _parse(text)
            prog = Program.wire(tbs)
    execute(prog, slots_per_step(proto, int(attrs["maxBytes"]),
                                 int(attrs["nchunksperloop"])))  # fmt: skip


def _renumbered(seen: _Read, order: list[XStep], proto: str) -> ReadBack:
    """`seen`'s read-back with its transfers numbered in completion order `order`, as
    `_transfers` numbers them: sends in that order, each send's runs in chunk order. Nothing
    else in `_transfers` depends on the order: a step's nearest receives and sends follow the
    happens-before edges, `before` is happens-before (its pruning by position holds in any
    order the executor can complete), and whether the write-after-read orderings close a cycle
    is a property of the graph, not of its numbering."""
    rb = seen.result
    runs: dict[int, list[int]] = {}  # send uid -> its transfers in `seen`
    for i, uid in enumerate(seen.senders):
        runs.setdefault(uid, []).append(i)
    old = [i for x in order if x.type in SEND_TYPES for i in runs.get(x.uid, ())]
    new = [0] * len(old)
    for j, i in enumerate(old):
        new[i] = j
    was = rb.schedule.transfers
    transfers = [
        Transfer(t.src, t.dst, t.chunk, t.count, t.reduce, tuple(sorted([new[d] for d in t.deps])),
                 t.channel)
        for t in (was[i] for i in old)
    ]  # fmt: skip
    at = np.array(old, dtype=np.int64)
    timed = None
    if rb.timed is not None:  # local operations keep their numbers, after the sends
        n = len(old)
        rt = rb.timed.transfers

        def renamed(t: Transfer) -> Transfer:
            deps = tuple(sorted([new[d] if d < n else d for d in t.deps]))
            return Transfer(t.src, t.dst, t.chunk, t.count, t.reduce, deps, t.channel)

        # a send the local operations do not change is the schedule's (`_transfers`): its
        # renumbered twin is too
        timed = replace(rb.timed, protocol=proto, transfers=[
            *(transfers[j] if rt[i] is was[i] else renamed(rt[i]) for j, i in enumerate(old)),
            *(renamed(t) for t in rt[n:])])  # fmt: skip
    return replace(
        rb, schedule=replace(rb.schedule, protocol=proto, transfers=transfers),
        send_tb=rb.send_tb[at], recv_tb=rb.recv_tb[at], send_step=rb.send_step[at],
        recv_step=rb.recv_step[at], timed=timed,
    )  # fmt: skip


# ---------------------------------------------------------------- parsing


def _int(elem: ET.Element, attr: str, where: str, lo: int | None = None) -> int:
    raw = elem.get(attr)
    if raw is None:
        raise MscclFormatError(f"{where}: missing attribute {attr!r}")
    try:
        val = int(raw)
    except ValueError:
        raise MscclFormatError(f"{where}: attribute {attr}={raw!r} is not an integer") from None
    if lo is not None and val < lo:
        raise MscclFormatError(f"{where}: attribute {attr}={val} must be >= {lo}")
    return val


def _str(elem: ET.Element, attr: str, where: str, allowed: tuple[str, ...] | frozenset[str]) -> str:
    raw = elem.get(attr)
    if raw is None:
        raise MscclFormatError(f"{where}: missing attribute {attr!r}")
    if raw not in allowed:
        raise MscclFormatError(
            f"{where}: {attr}={raw!r} is not one of {', '.join(sorted(allowed))}"
        )
    return raw


def _parse(text: str, maps: list[np.ndarray] | None = None,
           ) -> tuple[dict[str, str], list[dict[str, int]], list[list[list[XStep]]]]:  # fmt: skip
    """`maps` (if given) gets each rank's map when rank r is built as rank 0 moved by it, and
    stays empty when the file is parsed element by element."""
    fast = _parse_translated(text, maps) if maps is not None else _parse_translated(text)
    if fast is None and maps is not None:
        maps.clear()
    return fast if fast is not None else _parse_each(text)


def _parse_translated(
    text: str, maps: list[np.ndarray] | None = None
) -> tuple[dict[str, str], list[dict[str, int]], list[list[list[XStep]]]] | None:
    """A file whose ranks are rank 0's translates, parsed through rank 0 (translates.py); None
    for any other file, including a malformed one (`_parse_each` then says what is wrong)."""
    parts = split_gpus(text)
    if parts is None:
        return None
    head, segs, tail = parts
    try:
        root = ET.fromstring(head + segs[0] + tail)
        attrs, ngpus, nch = _algo(root)
        if len(root) != 1 or root[0].tag != "gpu":
            return None
        gid, sizes, tbs0 = _gpu(root[0], ngpus, nch)
        coll = _COLLS[attrs["coll"]]
        c = _chunks_per_rank(coll, ngpus, [sizes], attrs)
    except (ET.ParseError, MscclFormatError):
        return None
    tbs = translated_gpus(segs, tbs0, coll, ngpus, c, maps) if gid == 0 else None
    if tbs is None:
        return None
    for g in tbs[1:]:
        for t in g:
            for x in t:
                # one slot of a translate is in bounds by construction (the layout maps into
                # the buffer); a run of several may leave it where rank 0's did not
                if x.cnt > 1:
                    _bounds(x, sizes)
    return attrs, [sizes] * ngpus, tbs


def _parse_each(text: str) -> tuple[dict[str, str], list[dict[str, int]], list[list[list[XStep]]]]:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise MscclFormatError(f"not well-formed XML: {exc}") from None
    attrs, ngpus, nch = _algo(root)
    gpus: dict[int, tuple[dict[str, int], list[list[XStep]]]] = {}
    for g_el in root:
        if g_el.tag != "gpu":
            raise MscclFormatError(f"<algo> contains <{g_el.tag}>, expected <gpu>")
        gid = _int(g_el, "id", "<gpu>", 0)
        if gid >= ngpus or gid in gpus:
            raise MscclFormatError(f"<gpu id={gid}>: id is duplicated or not below ngpus={ngpus}")
        gpus[gid] = _gpu(g_el, ngpus, nch)[1:]
    missing = sorted(set(range(ngpus)) - set(gpus))
    if missing:
        raise MscclFormatError(f"<algo>: ngpus={ngpus} but no <gpu id={missing[0]}>")
    return attrs, [gpus[g][0] for g in range(ngpus)], [gpus[g][1] for g in range(ngpus)]


def _algo(root: ET.Element) -> tuple[dict[str, str], int, int]:
    """The <algo> element's attributes, checked; with ngpus and nchannels."""
    if root.tag != "algo":
        raise MscclFormatError(f"root element is <{root.tag}>, expected <algo>")
    for a in ALGO_ATTRS:
        if a not in root.attrib:
            raise MscclFormatError(f"<algo>: missing attribute {a!r} (the executor requires it)")
    attrs = dict(root.attrib)
    ngpus = _int(root, "ngpus", "<algo>", 1)
    nch = _int(root, "nchannels", "<algo>", 1)
    _int(root, "nchunksperloop", "<algo>", 1)
    _int(root, "minBytes", "<algo>", 0)
    _int(root, "maxBytes", "<algo>", 0)
    claims = [_int(root, a, "<algo>", 0) for a in ("inplace", "outofplace")]
    _str(root, "proto", "<algo>", PROTOCOLS)
    if attrs["coll"] not in _COLLS:
        raise MscclFormatError(
            f"<algo>: coll={attrs['coll']!r} is not supported (use {', '.join(_COLLS)})"
        )
    if not any(claims):
        raise MscclFormatError("<algo>: inplace=0 and outofplace=0: the algorithm never runs")
    return attrs, ngpus, nch


def _gpu(g_el: ET.Element, ngpus: int, nch: int) -> tuple[int, dict[str, int], list[list[XStep]]]:
    gid = _int(g_el, "id", "<gpu>", 0)
    where = f"<gpu id={gid}>"
    if gid >= ngpus:
        raise MscclFormatError(f"{where}: id is duplicated or not below ngpus={ngpus}")
    sizes = {a: _int(g_el, a, where, 0) for a in GPU_SIZES}
    tbs: dict[int, list[XStep]] = {}
    for tb_el in g_el:
        if tb_el.tag != "tb":
            raise MscclFormatError(f"{where} contains <{tb_el.tag}>, expected <tb>")
        tid = _int(tb_el, "id", f"{where} <tb>", 0)
        if tid in tbs:
            raise MscclFormatError(f"gpu {gid} tb {tid}: duplicate threadblock id")
        tbs[tid] = _threadblock(tb_el, gid, tid, ngpus, nch, sizes)
    if sorted(tbs) != list(range(len(tbs))):
        raise MscclFormatError(f"{where}: threadblock ids must be 0..{len(tbs) - 1} without gaps")
    return gid, sizes, [tbs[i] for i in range(len(tbs))]


def _threadblock(
    tb_el: ET.Element, gid: int, tid: int, ngpus: int, nch: int, sizes: dict[str, int]
) -> list[XStep]:
    tw = f"gpu {gid} tb {tid}"
    send = _int(tb_el, "send", tw, -1)
    recv = _int(tb_el, "recv", tw, -1)
    chan = _int(tb_el, "chan", tw, 0)
    if gid in (send, recv) or send >= ngpus or recv >= ngpus:
        raise MscclFormatError(f"{tw}: peers send={send} recv={recv} invalid for gpu {gid}")
    if chan >= nch:
        raise MscclFormatError(f"{tw}: chan={chan} is not below nchannels={nch}")
    out: list[XStep] = []
    carried = False  # nops carrying dependencies wait for the next real step
    for i, st_el in enumerate(tb_el):
        sw = f"{tw} step {i}"
        if st_el.tag != "step":
            raise MscclFormatError(f"{tw} contains <{st_el.tag}>, expected <step>")
        # the executor numbers steps by position (dependency flags count nops too)
        if _int(st_el, "s", sw, 0) != i:
            raise MscclFormatError(f"{sw}: s={st_el.get('s')} does not match its position {i}")
        typ = _str(st_el, "type", sw, STEP_TYPES)
        x = XStep(
            gid, tid, i, typ,
            _str(st_el, "srcbuf", sw, ("i", "o", "s")), _int(st_el, "srcoff", sw, -1),
            _str(st_el, "dstbuf", sw, ("i", "o", "s")), _int(st_el, "dstoff", sw, -1),
            _int(st_el, "cnt", sw, 0), _int(st_el, "depid", sw, -1),
            _int(st_el, "deps", sw, -1), _int(st_el, "hasdep", sw, 0), chan, send, recv,
        )  # fmt: skip
        if x.hasdep > 1:
            raise MscclFormatError(f"{sw}: hasdep={x.hasdep} must be 0 or 1")
        if typ in SEND_TYPES and send < 0:
            raise MscclFormatError(f"{sw}: type {typ!r} sends but the tb has send=-1")
        if typ in RECV_TYPES and recv < 0:
            raise MscclFormatError(f"{sw}: type {typ!r} receives but the tb has recv=-1")
        if typ == "nop":
            carried |= x.depid >= 0
        else:
            if not 1 <= x.cnt <= MAX_COUNT:
                raise MscclFormatError(f"{sw}: cnt={x.cnt} must be in 1..{MAX_COUNT}")
            chained = typ == "re" and bool(out) and _continues_reduction(out[-1], x)
            if carried and x.depid < 0 and not chained:
                # msccl_parser.cc: "the last reduction must be a part of the first immediate
                # instruction" - the executor refuses the file
                raise MscclFormatError(
                    f"{sw}: follows nops that carry dependencies but has depid=-1 itself"
                )
            carried = False
            _bounds(x, sizes)
        out.append(x)
    if carried:  # msccl_parser.cc drops nops that no real step follows, with their dependencies
        for x in reversed(out):
            if x.type != "nop":
                break
            x.depid = x.deps = -1
    return out


def _continues_reduction(prev: XStep, x: XStep) -> bool:
    """msccl_parser.cc fuses a re into the previous one on the same destination."""
    return (
        prev.type == "re"
        and not prev.hasdep
        and (prev.dstbuf, prev.dstoff, prev.srcbuf) == (x.dstbuf, x.dstoff, x.srcbuf)
        and x.depid < 0
    )


def _bounds(x: XStep, sizes: dict[str, int]) -> None:
    cap = {"i": sizes["i_chunks"], "o": sizes["o_chunks"], "s": sizes["s_chunks"]}
    for used, buf, off, what in (
        (x.type in READS_SRC, x.srcbuf, x.srcoff, "src"),
        (x.type in WRITES_DST, x.dstbuf, x.dstoff, "dst"),
    ):
        if used and not (off >= 0 and off + x.cnt <= cap[buf]):
            raise MscclFormatError(
                f"{x.where}: {what} {buf}[{off}..{off + x.cnt - 1}] outside the {cap[buf]}-chunk "
                f"'{buf}' buffer of gpu {x.gpu}"
            )


def _chunks_per_rank(
    coll: Collective, n: int, sizes: list[dict[str, int]], attrs: dict[str, str]
) -> int:
    out = max(s["o_chunks"] for s in sizes)
    inplace, outofplace = int(attrs["inplace"]), int(attrs["outofplace"])
    if out == 0 and inplace and coll in (Collective.ALLREDUCE, Collective.BROADCAST):
        out = max(s["i_chunks"] for s in sizes)  # msccl-tools in place: all in the input
        if outofplace:
            raise MscclFormatError("<algo>: outofplace=1 but no gpu has an output buffer")
    per = n if coll in (Collective.ALLGATHER, Collective.ALLTOALL) else 1
    if out < per or out % per:
        raise MscclFormatError(f"<algo>: o_chunks={out} does not fit a {coll} on {n} gpus")
    return out // per


def _broadcast_root(prog: Program) -> int:
    roots = {x.gpu for x in prog.steps if x.type == "s" and x.srcbuf == "i"}
    if len(roots) > 1:
        raise MscclFormatError(f"broadcast reads the input of several gpus {sorted(roots)}")
    return roots.pop() if roots else 0


# ---------------------------------------------------------------- schedule


def _transfers(
    prog: Program,
    order: list[XStep],
    preds: list[list[XStep]],
    reach: Reach,
    sent: dict[int, list[Value]],
    combined: set[int],
) -> tuple[list[Transfer], list[tuple[XStep, XStep]], list[list[XStep]], list[Transfer]]:
    """One transfer per run of consecutive chunks of each send, in completion order, with the
    (send, receive) steps of each; the local operations (`_local_ops`) and their transfers,
    numbered after the sends (their deps in that numbering).

    Dependencies are the nearest receives before the send or before its receive (what the
    executor really waits for). The nearest earlier sends are added too where that cannot
    contradict the execution (their receive is not after this send), because the IR reads a
    transfer's data until it finishes and a later overwrite must wait for it.

    A local operation is waited for as a receive is (it blocks its threadblock), and waits for
    what its first step waits for. The schedule's own deps (sends only) see through it: each
    local operation is replaced by what it waits for.

    A transfer's deps are taken when its receive completes (its send completed before), and a
    step's sets are dropped once every step reading them has: a 500k-step file holds ~30 deps
    a transfer, which sets kept per step cost ~1 GB (docs/synthesis-scale.md, "Session 9:
    reading a 500k-step file").
    """
    ids: dict[int, list[int]] = {}
    raw: list[tuple[XStep, int, int, bool]] = []
    for x in order:
        if x.type in SEND_TYPES:
            rx = prog.receiver_of[x.uid]
            ids[x.uid] = []
            for first, cnt in _consecutive([k for k, _ in sent[x.uid]]):
                ids[x.uid].append(len(raw))
                raw.append((x, sent[x.uid][first][0], cnt, rx.uid in combined))
    sender_of = prog.sender_of
    # per step (by uid) whose successors have yet to read them: the nearest transfers received
    # / sent at or before it; `readers` counts those successors (a send's receive is none: it
    # reads the send's own sets, kept in `sending`)
    got: dict[int, frozenset[int]] = {}
    put: dict[int, frozenset[int]] = {}
    readers = [0] * len(prog.steps)
    for u, ps in enumerate(preds):
        snd = sender_of.get(u)
        for p in ps:
            if p is not snd:
                readers[p.uid] += 1
    # a send's own transfers, and the nearest transfers received and sent before it
    sending: dict[int, tuple[frozenset[int], frozenset[int], frozenset[int]]] = {}
    empty: frozenset[int] = frozenset()
    ops, op_of = _local_ops(prog)
    base = len(raw)
    held = {u: frozenset((base + i,)) for u, i in op_of.items()}
    first_of = {op[0].uid: i for i, op in enumerate(ops)}
    op_deps: list[frozenset[int]] = [empty] * len(ops)
    seen: dict[int, frozenset[int]] = {}

    def through(deps: frozenset[int]) -> frozenset[int]:
        """`deps` with each local operation replaced by what it waits for."""
        if not ops:
            return deps
        return through_local_ops(deps, base, lambda d: op_deps[d - base], seen)

    both: list[tuple[int, ...]] = [()] * base  # sorted deps and write-after-read orderings
    wars: dict[int, set[int]] = {}  # the write-after-read orderings, where there are some
    waits: dict[int, tuple[frozenset[int], set[int]]] = {}  # deps naming local operations
    receiver_of = prog.receiver_of
    recv_of_raw = [receiver_of[x.uid].uid for x, _, _, _ in raw]
    for x in order:
        u = x.uid
        snd = sender_of.get(u)
        gb, sb = merged_preds(preds[u], snd, got, put, readers)
        op = first_of.get(u)
        if op is not None:
            op_deps[op] = gb
        mine = frozenset(ids[u]) if u in ids else None
        got_u = frozenset(ids[snd.uid]) if snd is not None else held.get(u, gb)
        if readers[u]:
            got[u] = got_u
            put[u] = sb if mine is None else mine
        if mine is not None:
            sending[u] = (mine, got_u, sb)
        if snd is None:
            continue
        _, s_got, s_sent = sending.pop(snd.uid)
        # the same for each of the send's transfers
        # a fused step (rcs, rrs, rrcs) forwards what it receives: its own receive first
        wait = s_got | gb
        dep = through(wait)
        # an earlier send already in `dep` stays whatever `before` says: not asked
        earlier = (s_sent | sb) - dep
        war: set[int] = set()
        if earlier:
            after = reach.reached(snd.uid, [recv_of_raw[t] for t in earlier])
            war = {t for t in earlier if recv_of_raw[t] not in after}
        for i in ids[snd.uid]:
            if war:
                wars[i] = war
                both[i] = tuple(sorted((dep | war) - {i}))
            else:
                both[i] = tuple(sorted(dep - {i}))
            if dep is not wait:  # `through` replaced a local operation
                waits[i] = (wait - {i}, war)
    # the write-after-read orderings may close a cycle: then only the real ones are kept
    keep_war = _acyclic(both)
    chosen = both if keep_war else [
        tuple(t for t in d if t not in wars[i]) if i in wars else d for i, d in enumerate(both)
    ]  # fmt: skip
    out = [
        Transfer(x.gpu, x.send, k, cnt, red, chosen[i], x.chan)
        for i, (x, k, cnt, red) in enumerate(raw)
    ]
    timed: list[Transfer] = []
    if ops:
        sends = list(out)
        for i, (w, war) in waits.items():
            sends[i] = replace(out[i], deps=tuple(sorted(w | war if keep_war else w)))
        timed = sends + [
            Transfer(op[0].gpu, op[0].gpu, sent[op[0].uid][0][0], op[0].cnt, op[0].type == "re",
                     tuple(sorted(d)), op[0].chan)
            for op, d in zip(ops, op_deps, strict=True)
        ]  # fmt: skip
    return out, [(x, prog.receiver_of[x.uid]) for x, _, _, _ in raw], ops, timed


def _local_ops(prog: Program) -> tuple[list[list[XStep]], dict[int, int]]:
    """The local operations the executor runs, in step order: each `cpy`, and each run of `re`s
    msccl_parser.cc fuses into one reduction (`_continues_reduction`, at most MAX_REDUCE_FUSION
    reductions counted per threadblock); and the operation of each local step's uid."""
    ops: list[list[XStep]] = []
    op_of: dict[int, int] = {}
    for g in prog.tbs:
        for t in g:
            reduces = 0
            fusing = False
            for i, x in enumerate(t):
                if x.type not in LOCAL_TYPES:
                    fusing = False
                    continue
                if x.type == "re" and fusing and _continues_reduction(t[i - 1], x):
                    ops[-1].append(x)
                else:
                    ops.append([x])
                op_of[x.uid] = len(ops) - 1
                if x.type == "re":
                    reduces += 1
                    fusing = not x.hasdep and reduces != MAX_REDUCE_FUSION
                else:
                    fusing = False
    return ops, op_of


def _acyclic(deps: Sequence[Collection[int]]) -> bool:
    """Whether transfers with these dependencies have a topological order (Kahn's count, as
    schedule.check.topological_order, without building the schedule first)."""
    indeg = [len(d) for d in deps]
    succ: list[list[int]] = [[] for _ in deps]
    for i, d in enumerate(deps):
        for j in d:
            succ[j].append(i)
    ready = [i for i, k in enumerate(indeg) if k == 0]
    done = 0
    while ready:
        u = ready.pop()
        done += 1
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    return done == len(deps)


def _consecutive(chunks: list[int]) -> Iterator[tuple[int, int]]:
    start = 0
    for i in range(1, len(chunks) + 1):
        if i == len(chunks) or chunks[i] != chunks[i - 1] + 1:
            yield start, i - start
            start = i


__all__ = ["MscclFormatError", "ReadBack", "check_protocol", "file_key", "from_msccl_xml",
           "protocol_of", "read_msccl", "same_file"]  # fmt: skip
