"""check_schedule: correct schedules of every collective pass; each kind of bug is named."""

from __future__ import annotations

import pytest

from ccltune.api.common import Collective
from ccltune.model.schedule.check import ScheduleError, check_schedule, topological_order
from ccltune.model.schedule.ir import Schedule, Transfer

AG, RS, AR, A2A, BC = (
    Collective.ALLGATHER,
    Collective.REDUCESCATTER,
    Collective.ALLREDUCE,
    Collective.ALLTOALL,
    Collective.BROADCAST,
)


def ring_allgather(n: int, c: int) -> Schedule:
    s = Schedule("ring-ag", AG, n, c)
    for o in range(n):
        for j in range(c):
            prev: tuple[int, ...] = ()
            for step in range(n - 1):
                r = (o + step) % n
                prev = (s.add(Transfer(r, (r + 1) % n, o * c + j, deps=prev)),)
    return s


def ring_reducescatter(n: int, c: int) -> Schedule:
    s = Schedule("ring-rs", RS, n, c)
    for d in range(n):
        for j in range(c):
            prev: tuple[int, ...] = ()
            for step in range(n - 1):
                r = (d + 1 + step) % n
                prev = (s.add(Transfer(r, (r + 1) % n, d * c + j, reduce=True, deps=prev)),)
    return s


def ring_allreduce(n: int, per_rank: int) -> Schedule:
    """Reduce-scatter then allgather around the ring; chunk k is reduced at rank k % n."""
    c = n * per_rank
    s = Schedule("ring-ar", AR, n, c)
    for k in range(c):
        owner = k % n
        prev: tuple[int, ...] = ()
        for step in range(n - 1):
            r = (owner + 1 + step) % n
            prev = (s.add(Transfer(r, (r + 1) % n, k, reduce=True, deps=prev)),)
        for step in range(n - 1):
            r = (owner + step) % n
            prev = (s.add(Transfer(r, (r + 1) % n, k, deps=prev)),)
    return s


def direct_alltoall(n: int, c: int) -> Schedule:
    s = Schedule("direct-a2a", A2A, n, c)
    for src in range(n):
        for dst in range(n):
            if src != dst:
                s.add(Transfer(src, dst, (src * n + dst) * c, count=c))
    return s


def tree_broadcast(n: int, c: int, root: int) -> Schedule:
    """Binomial tree over ranks relabelled so that root is 0."""
    s = Schedule("tree-bc", BC, n, c, root=root)
    got: dict[int, int] = {}  # relabelled rank -> transfer that delivered the data
    span = 1
    while span < n:
        for v in range(span):
            if v + span < n:
                deps = (got[v],) if v in got else ()
                got[v + span] = s.add(
                    Transfer((v + root) % n, (v + span + root) % n, 0, count=c, deps=deps)
                )
        span *= 2
    return s


def reduce_then_broadcast_allreduce(n: int, c: int) -> Schedule:
    s = Schedule("star-ar", AR, n, c)
    into_root = [s.add(Transfer(r, 0, 0, count=c, reduce=True)) for r in range(1, n)]
    # each reduce into rank 0 must be ordered against the others: chain them
    for i in range(1, len(into_root)):
        t = s.transfers[into_root[i]]
        s.transfers[into_root[i]] = Transfer(
            t.src, t.dst, t.chunk, t.count, True, (into_root[i - 1],)
        )
    for r in range(1, n):
        s.add(Transfer(0, r, 0, count=c, deps=(into_root[-1],)))
    return s


@pytest.mark.parametrize(
    "schedule",
    [
        ring_allgather(4, 2),
        ring_allgather(2, 1),
        ring_reducescatter(5, 2),
        ring_allreduce(4, 2),
        ring_allreduce(3, 1),
        direct_alltoall(4, 3),
        tree_broadcast(7, 2, root=3),
        tree_broadcast(2, 1, root=1),
        reduce_then_broadcast_allreduce(4, 3),
    ],
    ids=lambda s: f"{s.name}-{s.nranks}",
)
def test_correct_schedules_pass(schedule: Schedule) -> None:
    check_schedule(schedule)


def test_trivial_single_rank_allreduce_needs_no_transfers() -> None:
    check_schedule(Schedule("one", AR, 1, 4))
    with pytest.raises(ScheduleError, match=r"rank 0 ends with chunk 0 wrong: missing .*\{1\}"):
        check_schedule(Schedule("none", AR, 2, 1))


def without(s: Schedule, drop: int) -> Schedule:
    """The schedule with transfer `drop` removed and dep indices renumbered."""
    out = Schedule(s.name, s.collective, s.nranks, s.chunks_per_rank, root=s.root)
    for i, t in enumerate(s.transfers):
        if i == drop:
            continue
        deps = tuple(d - (d > drop) for d in t.deps if d != drop)
        out.add(Transfer(t.src, t.dst, t.chunk, t.count, t.reduce, deps, t.channel))
    return out


def test_missing_last_hop_is_named() -> None:
    s = ring_allgather(4, 1)
    # chunk 0's chain is transfers 0,1,2 (ranks 0->1->2->3): drop the last hop
    with pytest.raises(ScheduleError, match=r"rank 3 ends with chunk 0 wrong: missing .*\{0\}"):
        check_schedule(without(s, 2))


def test_missing_middle_hop_means_sending_data_not_held() -> None:
    s = ring_allgather(4, 1)
    with pytest.raises(ScheduleError, match="rank 2 sends chunk 0 but holds no data"):
        check_schedule(without(s, 1))


def test_double_count_is_caught() -> None:
    s = ring_reducescatter(3, 1)
    # rank 1 reduces chunk 0 into rank 2 a second time, after the chain has passed it on
    s.add(Transfer(1, 2, 0, reduce=True, deps=(0, 1)))
    with pytest.raises(ScheduleError, match="double-counts contributions of ranks"):
        check_schedule(s)


def test_reduce_into_empty_buffer_and_reduce_in_allgather() -> None:
    s = Schedule("bad", AG, 2, 1)
    s.add(Transfer(0, 1, 0, reduce=True))
    with pytest.raises(ScheduleError, match="holds no data for it"):
        check_schedule(s)


def test_concurrent_writes_are_a_race() -> None:
    s = Schedule("race-ww", BC, 3, 1, root=0)
    a = s.add(Transfer(0, 1, 0))
    s.add(Transfer(0, 2, 0))
    s.add(Transfer(1, 2, 0, deps=(a,)))  # also writes rank 2, unordered with transfer 1
    with pytest.raises(ScheduleError, match=r"race: transfers 1 and 2 both write rank 2 chunk 0"):
        check_schedule(s)


def _gather_reduces() -> Schedule:
    """Ranks 1 and 2 reduce into rank 0 with no order between them; rank 0 then stores the
    result back to both."""
    s = Schedule("gather", AR, 3, 1)
    a = s.add(Transfer(1, 0, 0, reduce=True))
    b = s.add(Transfer(2, 0, 0, reduce=True))
    s.add(Transfer(0, 1, 0, deps=(a, b)))
    s.add(Transfer(0, 2, 0, deps=(a, b)))
    return s


def test_unordered_reduces_commute_only_when_asked() -> None:
    s = _gather_reduces()
    with pytest.raises(ScheduleError, match=r"race: transfers 0 and 1 both write rank 0 chunk 0"):
        check_schedule(s)
    check_schedule(s, reduces_commute=True)


def test_commuting_reduces_still_order_reads_stores_and_counts() -> None:
    # a read after only one of the two reduces sees a timing-dependent sum
    s = _gather_reduces()
    s.transfers[3] = Transfer(0, 2, 0, deps=(0,))
    with pytest.raises(ScheduleError, match=r"race: transfer 3 reads rank 0 chunk 0 .* transfer 1"):
        check_schedule(s, reduces_commute=True)
    # a plain store racing a reduce is still a race
    s = _gather_reduces()
    s.transfers[1] = Transfer(2, 0, 0)
    with pytest.raises(ScheduleError, match=r"race: transfers 0 and 1 both write rank 0 chunk 0"):
        check_schedule(s, reduces_commute=True)
    # and the same contribution added twice is counted twice in either order
    s = _gather_reduces()
    s.transfers.insert(2, Transfer(1, 0, 0, reduce=True))
    s.transfers[3] = Transfer(0, 1, 0, deps=(0, 1, 2))
    s.transfers[4] = Transfer(0, 2, 0, deps=(0, 1, 2))
    with pytest.raises(ScheduleError, match=r"double-counts contributions of ranks \{1\}"):
        check_schedule(s, reduces_commute=True)


def test_forward_without_dependency_is_a_race() -> None:
    s = Schedule("race-rw", BC, 3, 1, root=0)
    s.add(Transfer(0, 1, 0))
    s.add(Transfer(1, 2, 0))  # forgot deps=(0,)
    with pytest.raises(ScheduleError, match=r"race: transfer 1 reads rank 1 chunk 0 .* transfer 0"):
        check_schedule(s)


def test_overwrite_while_being_read_is_a_race() -> None:
    s = Schedule("race-wr", AR, 3, 1)
    s.add(Transfer(1, 2, 0, reduce=True))  # reads rank 1
    s.add(Transfer(0, 1, 0, reduce=True))  # writes rank 1 concurrently
    with pytest.raises(
        ScheduleError, match=r"race: transfer 1 writes rank 1 chunk 0 .* transfer 0"
    ):
        check_schedule(s)


def test_cycle_is_a_deadlock() -> None:
    s = Schedule("cycle", AG, 2, 1)
    s.add(Transfer(0, 1, 0, deps=(1,)))
    s.add(Transfer(1, 0, 1, deps=(0,)))
    with pytest.raises(
        ScheduleError, match=r"deadlock: dependency cycle (0 -> 1 -> 0|1 -> 0 -> 1)"
    ):
        check_schedule(s)
    with pytest.raises(ScheduleError, match="deadlock"):
        topological_order(s)
    with pytest.raises(ScheduleError, match=r"0: rank 0 -> 1 chunk 0; 1: rank 1 -> 0 chunk 1|"
                       r"1: rank 1 -> 0 chunk 1; 0: rank 0 -> 1 chunk 0"):  # fmt: skip
        check_schedule(s)


def test_wrong_final_owner_is_caught() -> None:
    s = direct_alltoall(3, 1)
    # chunk for (0 -> 1) delivered to rank 2 instead
    s.transfers[0] = Transfer(0, 2, s.transfers[0].chunk)
    with pytest.raises(ScheduleError, match=r"rank 1 ends with chunk 1 wrong: missing .*\{0\}"):
        check_schedule(s)


@pytest.mark.parametrize(
    ("transfer", "message"),
    [
        (Transfer(0, 5, 0), "transfer 0: dst rank 5 not in 0..2"),
        (Transfer(-1, 1, 0), "transfer 0: src rank -1 not in 0..2"),
        (Transfer(1, 1, 0), "rank 1 sends to itself"),
        (Transfer(0, 1, 5), r"chunks 5..5 outside 0..2"),
        (Transfer(0, 1, 2, count=2), r"chunks 2..3 outside 0..2"),
        (Transfer(0, 1, 0, deps=(3,)), "dependency 3 is not another transfer"),
        (Transfer(0, 1, 0, deps=(0,)), "dependency 0 is not another transfer"),
    ],
)
def test_invalid_transfers(transfer: Transfer, message: str) -> None:
    s = Schedule("bad", AG, 3, 1, transfers=[transfer])
    with pytest.raises(ScheduleError, match=message):
        check_schedule(s)


def test_bad_broadcast_root() -> None:
    with pytest.raises(ScheduleError, match="root 4"):
        check_schedule(Schedule("bad", BC, 3, 1, root=4))
