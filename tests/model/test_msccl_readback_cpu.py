"""Reading back and lowering for less CPU: the fast paths give what the plain ones give.

- `execute` (numbered threadblocks and connections) completes steps in the same order as the
  dict-keyed run it replaced (`_reference_execute` below), or fails with the same message.
- `Reach.reached` (one forward search per send) answers as `Reach.before` (one backward search
  per pair) does.
- `_Layout.input_offs` / `output_offs` are `input_off` / `output_off` on arrays, and a
  translated lowering moves rank 0's slots on arrays (`_Mover.slots_of`) to the same file as
  slot by slot.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from collections.abc import Callable

import numpy as np
import pytest

from ccltune.api.common import Collective
from ccltune.model.formats.msccl import writer
from ccltune.model.formats.msccl.executor import (
    NCCL_STEPS,
    RECV_TYPES,
    SEND_TYPES,
    Program,
    XStep,
    _deadlock_message,
    execute,
)
from ccltune.model.formats.msccl.replay import Reach
from ccltune.model.formats.msccl.writer import MscclFormatError, _Layout, lower_msccl
from ccltune.model.schedule.ir import Schedule, Transfer


def _reference_execute(prog: Program, slots: Callable[[XStep], int]) -> list[XStep]:
    """The executor's run as it was written before (state in dicts keyed by tuples)."""
    tbs = prog.tbs
    flag = {(g, t): -1 for g, gt in enumerate(tbs) for t in range(len(gt))}
    pc = dict.fromkeys(flag, 0)
    moved = dict.fromkeys(flag, 0)
    fill: dict[tuple[int, int, int], int] = defaultdict(int)
    waiting: dict[tuple[str, int, int, int], set[tuple[int, int]]] = defaultdict(set)
    blocked: dict[tuple[int, int], tuple[str, int, int, int]] = {}
    order: list[XStep] = []
    work = deque(flag)

    def wake(key: tuple[str, int, int, int]) -> None:
        for who in waiting.pop(key, ()):
            blocked.pop(who, None)
            work.append(who)

    def block(who: tuple[int, int], key: tuple[str, int, int, int]) -> None:
        waiting[key].add(who)
        blocked[who] = key

    while work:
        who = work.popleft()
        g, t = who
        steps = tbs[g][t]
        while pc[who] < len(steps):
            x = steps[pc[who]]
            if moved[who] == 0 and x.depid >= 0 and flag[(g, x.depid)] < x.deps:
                block(who, ("flag", g, x.depid, 0))
                break
            inq = (x.recv, g, x.chan) if x.type in RECV_TYPES else None
            outq = (g, x.send, x.chan) if x.type in SEND_TYPES else None
            need = slots(x) if inq or outq else 0
            while moved[who] < need:
                room = need - moved[who]
                if inq:
                    room = min(room, fill[inq])
                if outq:
                    room = min(room, NCCL_STEPS - fill[outq])
                if room == 0:
                    if inq and fill[inq] == 0:
                        block(who, ("data", *inq))
                    elif outq:
                        block(who, ("room", *outq))
                    break
                if inq:
                    fill[inq] -= room
                    wake(("room", *inq))
                if outq:
                    fill[outq] += room
                    wake(("data", *outq))
                moved[who] += room
            if moved[who] < need:
                break
            order.append(x)
            moved[who] = 0
            pc[who] += 1
            if x.hasdep and x.type != "nop":
                flag[who] = x.idx
                wake(("flag", g, t, 0))
    if len(order) < len(prog.steps):
        raise MscclFormatError(_deadlock_message(prog, pc, blocked))
    return order


def _random_program(rng: random.Random) -> Program | None:
    """A few gpus whose threadblocks send and receive on random connections, with random
    dependency flags (many deadlock); None where the flags name no signalling step."""
    n = rng.randint(2, 4)
    plan: list[list[tuple[int, int]]] = []  # per gpu: (send peer, recv peer) per tb
    for g in range(n):
        peers = [p for p in range(n) if p != g]
        outs, ins = rng.sample(peers, len(peers)), rng.sample(peers, len(peers))
        ntb = rng.randint(1, 4)
        plan.append([(outs[t] if t < len(outs) and rng.random() < 0.8 else -1,
                      ins[t] if t < len(ins) and rng.random() < 0.8 else -1)
                     for t in range(ntb)])  # fmt: skip
    receives = {(q, g) for g, metas in enumerate(plan) for _, q in metas if q >= 0}
    sends = {
        (g, p): [rng.randint(1, 3) for _ in range(rng.randint(1, 4))]
        for g, metas in enumerate(plan)
        for p, _ in metas
        if (g, p) in receives
    }
    tbs: list[list[list[XStep]]] = []
    for g, metas in enumerate(plan):
        gpu = []
        for t, (send, recv) in enumerate(metas):
            out = sends.get((g, send), [])
            inc = sends.get((recv, g), [])
            kinds = ["s"] * len(out) + ["r"] * len(inc) + ["cpy", "nop"][: rng.randint(0, 2)]
            rng.shuffle(kinds)
            si = ri = 0  # the k-th send meets the k-th receive
            steps = []
            for i, kind in enumerate(kinds):
                cnt = 1
                if kind == "s":
                    cnt, si = out[si], si + 1
                elif kind == "r":
                    cnt, ri = inc[ri], ri + 1
                steps.append(XStep(g, t, i, kind, "i", 0, "o", 0, cnt, -1, -1,
                                   int(rng.random() < 0.6), 0, send, recv))  # fmt: skip
            gpu.append(steps)
        for steps in gpu:
            for x in steps:
                if rng.random() < 0.4:
                    x.depid = rng.randrange(len(gpu))
                    x.deps = rng.randrange(max(1, len(gpu[x.depid])))
        tbs.append(gpu)
    try:
        return Program.wire(tbs)
    except MscclFormatError:
        return None


def _run(run: Callable[..., list[XStep]], prog: Program, slots: Callable[[XStep], int]
         ) -> list[int] | str:  # fmt: skip
    try:
        return [x.uid for x in run(prog, slots)]
    except MscclFormatError as exc:
        return str(exc)


def test_execute_completes_steps_in_the_reference_order() -> None:
    rng = random.Random(7)
    runs = deadlocks = 0
    for _ in range(8000):
        prog = _random_program(rng)
        if prog is None:
            continue
        for per_chunk in (1, 3, 4):  # 3 and 4: steps larger than a FIFO's 8 slots
            slots = lambda x, k=per_chunk: x.cnt * k  # noqa: E731
            want = _run(_reference_execute, prog, slots)
            assert _run(execute, prog, slots) == want
            runs += 1
            deadlocks += isinstance(want, str)
    # both outcomes are exercised
    assert runs > 3000 and 300 < deadlocks < runs - 300


def test_reached_answers_as_before() -> None:
    rng = random.Random(11)
    asked = hits = 0
    for _ in range(1500):
        prog = _random_program(rng)
        if prog is None:
            continue
        try:
            order = execute(prog, lambda x: x.cnt)
        except MscclFormatError:
            continue
        pos = [0] * len(prog.steps)
        for i, x in enumerate(order):
            pos[x.uid] = i
        preds = prog.preds()
        uids = list(range(len(prog.steps)))
        for a in uids:
            bs = rng.sample(uids, min(len(uids), 6))
            want = {b for b in bs if Reach(preds, pos, prog.steps).before(a, b)}
            # a fresh Reach, and one whose memo holds some pairs already
            assert Reach(preds, pos, prog.steps, prog).reached(a, bs) == want
            warm = Reach(preds, pos, prog.steps, prog)
            for b in bs[:2]:
                warm.before(a, b)
            assert warm.reached(a, bs) == want
            asked += len(bs)
            hits += len(want)
    assert hits > 150 and asked - hits > 150


@pytest.mark.parametrize("coll", list(Collective))
def test_layout_offsets_on_arrays(coll: Collective) -> None:
    n, c = 4, 3
    lay = _Layout(coll, n, c, root=2)
    ks = np.arange(n * n * c, dtype=np.int64)
    for r in range(n):
        for scalar, vector in ((lay.input_off, lay.input_offs), (lay.output_off, lay.output_offs)):
            want = [scalar(r, k) for k in ks.tolist()]
            assert vector(r, ks).tolist() == [-1 if w is None else w for w in want]


def _ring(coll: Collective, n: int) -> Schedule:
    """A ring allgather (or reducescatter, reducing on the way): its own translates."""
    c = 2  # two chunks per translation block
    s = Schedule("ring", coll, n, c)
    reduce = coll == Collective.REDUCESCATTER
    for o in range(n):
        for j in range(c):
            prev: tuple[int, ...] = ()
            for step in range(n - 1):
                r = (o + step + (1 if reduce else 0)) % n
                prev = (s.add(Transfer(r, (r + 1) % n, o * c + j, reduce=reduce, deps=prev)),)
    return s


@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.REDUCESCATTER])
def test_translated_lowering_moves_slots_on_arrays_to_the_same_file(
    coll: Collective, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = _ring(coll, 6)
    used: list[bool] = []
    fast = writer._Mover.slots_of

    def spy(self: writer._Mover, r: int, locs0: writer._Slots0) -> dict | None:
        got = fast(self, r, locs0)
        used.append(got is not None)
        return got

    monkeypatch.setattr(writer._Mover, "slots_of", spy)
    want = lower_msccl(s).render(name="ring", proto="Simple")
    assert used and all(used)  # rank 0 translated on arrays for every other rank
    monkeypatch.setattr(writer._Mover, "slots_of", lambda *_: None)  # slot by slot
    assert lower_msccl(s).render(name="ring", proto="Simple") == want


def test_each_dependency_is_released_by_the_first_signal_at_or_after_it() -> None:
    rng = random.Random(5)
    checked = 0
    for _ in range(500):
        prog = _random_program(rng)
        if prog is None:
            continue
        for x in prog.steps:
            if x.depid >= 0:
                target = prog.tbs[x.gpu][x.depid]
                want = next(y for y in target[x.deps :] if y.hasdep and y.type != "nop")
                assert prog.released_by[x.uid] is want
                checked += 1
    assert checked > 200
