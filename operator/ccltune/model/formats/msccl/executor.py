"""How msccl-executor-nccl runs an MSCCL algorithm: threadblocks, connection FIFOs, dependencies.

Semantics followed (RCCL src/device/msccl_kernel_impl.h `mscclRunInterpreter`, the same
interpreter msccl-executor-nccl runs; msccl_parser.cc; RCCL msccl_setup.cc `mscclSetupCount`):
- Each threadblock runs its steps in order. A step with depid/deps first waits until threadblock
  `depid` has published a flag >= `deps`; a threadblock publishes its position after every
  non-nop step with hasdep=1 (nops only carry dependencies for the next step).
- A threadblock sends on the connection (its send peer, its channel) and receives on (its recv
  peer, its channel). A connection is a FIFO of NCCL_STEPS = 8 slots: a send blocks only while
  the FIFO is full, a receive only while it is empty. A step moves `cnt` chunks in
  ceil(cnt / maxAllowedCount) primitive calls of MSCCL_CHUNKSTEPS = 4 slots (Simple) or 1 slot
  (LL, LL128). maxAllowedCount = chunkEffectiveSize / bytes per chunk, at least 1, below 72, so
  large calls (few chunks per slot) block soonest: the analysis uses the largest size the
  algorithm is selected for (`maxBytes`; 0 = unbounded, maxAllowedCount 1).
Buffer sizes behind chunkEffectiveSize: NCCL's default buffSizes (Simple 4 MiB; LL 8 lines x
512 threads x 8 steps x 16 B, half of it payload; LL128 120 x 640 x 8 x 8 B, 15 of 16 words
payload), divided by NCCL_STEPS, times the chunk steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .writer import MscclFormatError

NCCL_STEPS = 8
CHUNK_SLOTS = {"Simple": 4, "LL": 1, "LL128": 1}
CHUNK_EFFECTIVE_BYTES = {
    "Simple": (1 << 22) // NCCL_STEPS * 4,
    "LL": 8 * 512 * NCCL_STEPS * 16 // NCCL_STEPS // 2,
    "LL128": 120 * 640 * NCCL_STEPS * 8 // NCCL_STEPS // 16 * 15,
}
MAX_ALLOWED_COUNT = 71
SEND_TYPES = frozenset({"s", "rcs", "rrs", "rrcs"})
RECV_TYPES = frozenset({"r", "rcs", "rrs", "rrc", "rrcs"})
REDUCING_TYPES = frozenset({"rrs", "rrc", "rrcs", "re"})
READS_SRC = frozenset({"s", "rrs", "rrc", "rrcs", "cpy", "re"})
WRITES_DST = frozenset({"r", "rcs", "rrc", "rrcs", "cpy", "re"})
LOCAL_TYPES = frozenset({"cpy", "re"})  # steps that move data within the GPU only
# msccl_struct.h MSCCL_MAX_REDUCE_FUSION: msccl_parser.cc ends a fused run of `re`s when its
# threadblock's reductions so far reach 16 (it counts them per threadblock, not per run)
MAX_REDUCE_FUSION = 16


_Key = tuple[str, int, int, int]  # ("flag", gpu, tb, 0) / ("data"|"room", src, dst, chan)


@dataclass(eq=False, slots=True)  # ~0.5M of them in a 512-GPU file
class XStep:
    """One <step> of one threadblock, with its threadblock's peers and channel."""

    gpu: int
    tb: int
    idx: int
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    depid: int
    deps: int
    hasdep: int
    chan: int
    send: int
    recv: int
    uid: int = -1  # position in Program.steps

    @property
    def where(self) -> str:
        return f"gpu {self.gpu} tb {self.tb} step {self.idx}"

    @property
    def what(self) -> str:
        peers = []
        if self.type in RECV_TYPES:
            peers.append(f"from gpu {self.recv}")
        if self.type in SEND_TYPES:
            peers.append(f"to gpu {self.send}")
        return f"{self.where} ({' '.join([self.type, *peers])})"


@dataclass
class Program:
    """The parsed algorithm: gpus -> threadblocks -> steps, wired as the executor runs them."""

    tbs: list[list[list[XStep]]]
    steps: list[XStep]
    sender_of: dict[int, XStep]  # receiving step uid -> the step whose data it receives
    receiver_of: dict[int, XStep]  # sending step uid -> the step that receives its data
    released_by: dict[int, XStep]  # uid of a step with depid -> the step whose flag releases it

    @classmethod
    def wire(cls, tbs: list[list[list[XStep]]]) -> Program:
        steps = [x for g in tbs for t in g for x in t]
        for i, x in enumerate(steps):
            x.uid = i
        sender_of, receiver_of = _match(tbs)
        return cls(tbs, steps, sender_of, receiver_of, _releases(tbs))

    def preds(self) -> list[list[XStep]]:
        """Happens-before edges of each step: its tb's previous step, its release, its send."""
        out: list[list[XStep]] = [[] for _ in self.steps]
        for g in self.tbs:
            for t in g:
                for i, x in enumerate(t):
                    p = out[x.uid]
                    if i:
                        p.append(t[i - 1])
                    if x.uid in self.released_by:
                        p.append(self.released_by[x.uid])
                    if x.type in RECV_TYPES:
                        p.append(self.sender_of[x.uid])
        return out


def _match(tbs: list[list[list[XStep]]]) -> tuple[dict[int, XStep], dict[int, XStep]]:
    """Pair the k-th send on each connection (gpu, peer, channel) with the k-th receive."""
    sends: dict[tuple[int, int, int], list[XStep]] = {}
    recvs: dict[tuple[int, int, int], list[XStep]] = {}
    for g in tbs:
        for t in g:
            if not t:
                continue
            x0 = t[0]
            for peer, table, kind in ((x0.send, sends, SEND_TYPES), (x0.recv, recvs, RECV_TYPES)):
                if peer < 0:
                    continue
                conn = (x0.gpu, peer, x0.chan) if table is sends else (peer, x0.gpu, x0.chan)
                if conn in table:
                    side = "sending to" if table is sends else "receiving from"
                    # two threadblocks on one connection would interleave its FIFO steps
                    raise MscclFormatError(
                        f"gpu {x0.gpu} has two threadblocks {side} gpu {peer} on channel {x0.chan}"
                    )
                table[conn] = [x for x in t if x.type in kind]
    sender_of: dict[int, XStep] = {}
    receiver_of: dict[int, XStep] = {}
    for conn in sorted(set(sends) | set(recvs)):
        ss, rr = sends.get(conn, []), recvs.get(conn, [])
        if len(ss) != len(rr):
            src, dst, chan = conn
            raise MscclFormatError(
                f"gpu {src} sends {len(ss)} times to gpu {dst} on channel {chan} but gpu {dst} "
                f"receives {len(rr)} times from it"
            )
        for a, b in zip(ss, rr, strict=True):
            if a.cnt != b.cnt:
                raise MscclFormatError(
                    f"{a.where} sends cnt={a.cnt} but {b.where} receives cnt={b.cnt}"
                )
            receiver_of[a.uid] = b
            sender_of[b.uid] = a
    return sender_of, receiver_of


def _releases(tbs: list[list[list[XStep]]]) -> dict[int, XStep]:
    """The first step whose published flag satisfies each dependency (flag >= deps)."""
    out: dict[int, XStep] = {}
    for g in tbs:
        signals: dict[int, list[XStep | None]] = {}  # per tb asked: its first signal from i on
        for t in g:
            for x in t:
                if x.depid < 0:
                    continue
                if x.depid >= len(g) or not 0 <= x.deps < len(g[x.depid]):
                    raise MscclFormatError(
                        f"{x.where}: depends on tb {x.depid} step {x.deps}, which does not exist "
                        f"(it would wait forever)"
                    )
                target = g[x.depid]
                if x.depid not in signals:
                    signals[x.depid] = _first_signals(target)
                signal = signals[x.depid][x.deps]
                if signal is None:
                    raise MscclFormatError(
                        f"deadlock: {x.where} depends on {target[x.deps].where}, which has "
                        f"hasdep=0 and so never signals (nor does a later step of tb {x.depid})"
                    )
                out[x.uid] = signal
    return out


def _first_signals(steps: list[XStep]) -> list[XStep | None]:
    """Per position i, the first step at or after i that publishes its flag (None: none does)."""
    out: list[XStep | None] = [None] * len(steps)
    nxt: XStep | None = None
    for i in range(len(steps) - 1, -1, -1):
        y = steps[i]
        if y.hasdep and y.type != "nop":
            nxt = y
        out[i] = nxt
    return out


def slots_per_step(proto: str, max_bytes: int, chunks_per_loop: int) -> Callable[[XStep], int]:
    """FIFO slots a step's transfer occupies at the largest size the algorithm runs."""
    if max_bytes <= 0:
        allowed = 1
    else:
        per_chunk = -(-max_bytes // max(chunks_per_loop, 1))
        allowed = max(1, CHUNK_EFFECTIVE_BYTES[proto] // per_chunk)
    allowed = min(allowed, MAX_ALLOWED_COUNT)
    k = CHUNK_SLOTS[proto]
    return lambda x: -(-x.cnt // allowed) * k


def execute(prog: Program, slots: Callable[[XStep], int]) -> list[XStep]:
    """Run every threadblock to completion under the executor's blocking rules.

    Returns the steps in an order they can complete in; raises MscclFormatError naming the
    cycle of threadblocks (gpu, tb, step, and what each waits for) when they cannot.

    Threadblocks and connections are numbered and each step's FIFO slots and connections taken
    once, before the run (a step blocked on a FIFO is looked at again when woken); `slots` is
    asked once per step count (every caller's depends on the count alone). The order is
    the same as keeping them in dicts keyed by tuples: threadblocks are woken in the same
    order (a flag's waiters are kept in a set of (gpu, tb) as before; a connection has one
    sending and one receiving threadblock (`_match`), so at most one waits on its data or room).
    """
    tbs = prog.tbs
    whos = [(g, t) for g, gt in enumerate(tbs) for t in range(len(gt))]
    first_tb = [0] * len(tbs)  # number of each gpu's threadblock 0
    for g in range(1, len(tbs)):
        first_tb[g] = first_tb[g - 1] + len(tbs[g - 1])
    steps_of = [tbs[g][t] for g, t in whos]
    conns: dict[tuple[int, int, int], int] = {}
    nsteps = len(prog.steps)
    in_of, out_of, need_of = [-1] * nsteps, [-1] * nsteps, [0] * nsteps
    need_by_cnt: dict[int, int] = {}
    for (g, _), steps in zip(whos, steps_of, strict=True):
        if not steps:
            continue
        x0 = steps[0]  # a threadblock's steps share its peers and channel: so its connections
        cin = conns.setdefault((x0.recv, g, x0.chan), len(conns))
        cout = conns.setdefault((g, x0.send, x0.chan), len(conns))
        for x in steps:
            t = x.type
            takes = t in RECV_TYPES
            gives = t in SEND_TYPES
            if takes or gives:
                u = x.uid
                if takes:
                    in_of[u] = cin
                if gives:
                    out_of[u] = cout
                need = need_by_cnt.get(x.cnt)
                if need is None:
                    need = need_by_cnt[x.cnt] = slots(x)
                need_of[u] = need
    conn_key = list(conns)
    ntb = len(whos)
    flag = [-1] * ntb
    pc = [0] * ntb
    moved = [0] * ntb
    fill = [0] * len(conns)
    flag_waiters: dict[int, set[tuple[int, int]]] = {}
    data_waiter = [-1] * len(conns)  # the threadblock waiting for data on a connection
    room_waiter = [-1] * len(conns)  # ... for a free slot on it
    blocked: list[_Key | None] = [None] * ntb
    order: list[XStep] = []
    append = order.append
    work = deque(range(ntb))
    popleft, push = work.popleft, work.append

    while work:
        w = popleft()
        steps = steps_of[w]
        n = len(steps)
        p = pc[w]
        while p < n:
            x = steps[p]
            m = moved[w]
            if m == 0 and x.depid >= 0:
                src = first_tb[x.gpu] + x.depid
                if flag[src] < x.deps:
                    flag_waiters.setdefault(src, set()).add(whos[w])
                    blocked[w] = ("flag", x.gpu, x.depid, 0)
                    break
            u = x.uid
            need = need_of[u]
            if m < need:
                i, o = in_of[u], out_of[u]
                while m < need:
                    room = need - m
                    if i >= 0 and fill[i] < room:
                        room = fill[i]
                    if o >= 0 and NCCL_STEPS - fill[o] < room:
                        room = NCCL_STEPS - fill[o]
                    if room == 0:
                        if i >= 0 and fill[i] == 0:
                            data_waiter[i] = w
                            blocked[w] = ("data", *conn_key[i])
                        elif o >= 0:
                            room_waiter[o] = w
                            blocked[w] = ("room", *conn_key[o])
                        break
                    if i >= 0:
                        fill[i] -= room
                        v = room_waiter[i]
                        if v >= 0:
                            room_waiter[i] = -1
                            blocked[v] = None
                            push(v)
                    if o >= 0:
                        fill[o] += room
                        v = data_waiter[o]
                        if v >= 0:
                            data_waiter[o] = -1
                            blocked[v] = None
                            push(v)
                    m += room
                if m < need:
                    moved[w] = m
                    break
            append(x)
            moved[w] = 0
            p += 1
            if x.hasdep and x.type != "nop":
                flag[w] = x.idx
                woken = flag_waiters.pop(w, None)
                if woken:
                    for who in woken:
                        v = first_tb[who[0]] + who[1]
                        blocked[v] = None
                        push(v)
        pc[w] = p
    if len(order) < nsteps:
        raise MscclFormatError(_deadlock_message(
            prog, dict(zip(whos, pc, strict=True)),
            {whos[w]: key for w, key in enumerate(blocked) if key is not None}))  # fmt: skip
    return order


def _deadlock_message(
    prog: Program,
    pc: dict[tuple[int, int], int],
    blocked: dict[tuple[int, int], _Key],
) -> str:
    sender: dict[tuple[int, int, int], tuple[int, int]] = {}
    receiver: dict[tuple[int, int, int], tuple[int, int]] = {}
    for g, gt in enumerate(prog.tbs):
        for t, steps in enumerate(gt):
            if steps:
                x0 = steps[0]
                sender[(g, x0.send, x0.chan)] = (g, t)
                receiver[(x0.recv, g, x0.chan)] = (g, t)

    def waits_on(who: tuple[int, int]) -> tuple[tuple[int, int], str]:
        kind, a, b, c = blocked[who]
        if kind == "flag":
            x = prog.tbs[who[0]][who[1]][pc[who]]
            return (a, b), f"waits for tb {b} to signal step {x.deps}"
        conn = (a, b, c)
        if kind == "data":
            return sender[conn], f"waits for data from gpu {conn[0]} on channel {conn[2]}"
        return receiver[conn], f"waits for a free FIFO slot to gpu {conn[1]} on channel {conn[2]}"

    start = min(blocked)
    seen: dict[tuple[int, int], int] = {}
    path: list[tuple[tuple[int, int], str]] = []
    who = start
    while who in blocked and who not in seen:
        seen[who] = len(path)
        nxt, why = waits_on(who)
        path.append((who, why))
        who = nxt
    cycle = path[seen[who] :] if who in seen else path
    parts = [f"{prog.tbs[g][t][pc[(g, t)]].what} {why}" for (g, t), why in cycle]
    stuck = sum(1 for g, gt in enumerate(prog.tbs) for t in range(len(gt)) if (g, t) in blocked)
    return "deadlock: " + "; ".join(parts) + f" ({stuck} threadblocks stuck)"
