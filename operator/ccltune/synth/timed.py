"""Files whose threadblocks run their steps in the engine schedule's own time order.

A file's threadblock runs its steps in order, so a send placed after a receive it does not need
waits for it; the engine's schedule has no such wait. On h800-rail-64 AllGather that wait was
all of a file's extra time over its schedule (64 MiB: 471 vs 414 us, a session-7 diagnosis).
The writer's "timed" order keys each send at its transfer's start in the schedule's simulation
and each receive at its finish (writer.py `_time_keys`), so a threadblock blocks on a receive
only when the schedule had the data there. The keys come from one size, the largest asked for
(Simple, where bytes bind): one file serves a range of sizes, and on rail-64 keys from 1 GiB
give within 1% of keys from 64 MiB at 64 MiB (docs/synthesis.md, "Steps in the schedule's time
order"). Where a pairing has such a file, the engine times it instead of the "early" one.
"""

from __future__ import annotations

from ..api.cluster import ClusterTopology
from ..model.cost.gpu import gpu_physics
from ..model.cost.protocols import protocol_cost
from ..model.formats.msccl.writer import MscclFormatError, MscclLowering, lower_timed
from ..model.nccl.default import nccl_graph
from ..model.schedule.ir import Schedule, ScheduleArrays
from ..model.sim.routing import Router
from ..model.sim.simulate import simulate

KEY_PROTOCOL = "Simple"
# Whether a pairing's "early" file is still timed where it has a time-ordered twin. No: on the
# 9 rows measured the engine's choices at every size were the same either way, and timing both
# cost 25-40% more CPU on h800-rail-64 (docs/synthesis.md, "Steps in the schedule's time order").
ALSO_EARLY = False
TIMED = "timed"  # the label suffix of a time-ordered file


def file_label(label: str, pairing: str, timed: bool) -> str:
    """The label of `label`'s file with that pairing and order: the schedule's own label for
    the forwarding pairing in "early" order, else with a suffix saying what differs."""
    marks = [m for m, on in ((pairing, pairing != "forwarding"), (TIMED, timed)) if on]
    return f"{label} [{', '.join(marks)}]" if marks else label


def schedule_label(name: str) -> str:
    """The schedule a file label (`file_label`) was lowered from."""
    return name.split(" [", 1)[0]


def is_timed(name: str) -> bool:
    return name.endswith(f"{TIMED}]")


def pairing_of(name: str) -> str:
    """The writer's pairing named in a file label (`file_label`)."""
    marks = name.removesuffix("]").split(" [", 1)[1].split(", ") if " [" in name else []
    return next((m for m in marks if m != TIMED), "forwarding")


def key_times(arr: ScheduleArrays, topo: ClusterTopology, router: Router,
              size: int) -> tuple[list[float], list[float]]:  # fmt: skip
    """Per transfer of `arr`: its start and finish (us) in the engine's simulation at `size`."""
    g = nccl_graph(topo)
    cost = protocol_cost(KEY_PROTOCOL, link_kind=g.intra_kind, gpu=gpu_physics(topo.gpu_model))
    sim = simulate(arr, topo, size, cost, router, engine="symmetric")
    return sim.start_us.tolist(), sim.finish_us.tolist()


def timed_lowering(arr: ScheduleArrays, budget: int, pairing: str,
                   times: tuple[list[float], list[float]],
                   schedule: Schedule | None = None) -> MscclLowering | None:  # fmt: skip
    """The time-ordered lowering with that pairing, within the budget and the executor's step
    limit; None where the times give no such file (the "early" one is timed already) or it
    does not fit. `schedule`: `arr.to_schedule()` where the caller has it."""
    try:
        low = lower_timed(arr.to_schedule() if schedule is None else schedule, times,
                          max_threadblocks=budget, pairing=pairing)  # fmt: skip
        if low is not None:
            low.require(max_threadblocks=budget)
    except MscclFormatError:
        return None
    return low
