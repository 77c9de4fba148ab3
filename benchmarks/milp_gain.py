"""What the sub-demand MILP gains over its greedy start (every time simulated, event simulator).

Two kinds of rows:
- `synthesize` (SyCCL's pipeline on symmetric fabrics): run twice, once keeping the greedy
  patterns (`milp_nodes=(0, 0)`) and once with the default work limits; per size, the best
  synthesized schedule's time and % of the lower bound (even where NCCL's default would win).
  MILP calls / nodes: distinct sub-demands the MILP ran on (the greedy start missed their bound)
  and the branch-and-bound nodes HiGHS explored over all of them.
- `mesh` (one server whose GPU links have no symmetry, e.g. the DGX-1 hybrid cube-mesh, which
  `synthesize` leaves to NCCL): AllGather as one sub-demand on the server's NVLink/xGMI graph,
  every GPU the origin of its k pieces (k = 1, 2, 4; the fastest per size), the pattern turned
  into a schedule (each send waits for its piece to arrive; one queue per GPU pair) and simulated (heap engine).

Run: .venv/bin/python benchmarks/milp_gain.py > benchmarks/results/milp-gain.md
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ccltune.api.cluster import ClusterTopology
from ccltune.api.common import Collective, format_size
from ccltune.model.cost.bounds import lower_bound
from ccltune.model.cost.protocols import protocol_cost
from ccltune.model.nccl.default import default_estimate, nccl_graph
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import simulate
from ccltune.synth import assemble as asm
from ccltune.synth.engine import synthesize
from ccltune.synth.group import GroupTopo
from ccltune.synth.milp import SubDemand, SubSchedule, solve
from ccltune.topology.load import load_cluster, load_text
from machine import cpu_model, load_average

ROOT = Path(__file__).resolve().parents[1]
SIZES = [1 << 20, 1 << 26, 1 << 30]
# A ring dimension inside the server (ASTRA-sim network YAML; innermost first).
RING_FABRIC = """\
topology: [ Ring, Switch ]
npus_count: [ 8, 2 ]
bandwidth: [ 100.0, 25.0 ]
latency: [ 600.0, 7000.0 ]
"""
SYMMETRIC = [
    ("mi300x-8 (full mesh)", "mi300x-8", ["allgather", "broadcast"]),
    ("a100-rail-4node (2:1 spine)", str(ROOT / "examples/clusters/a100-rail-4node.yaml"),
     ["allgather", "broadcast"]),
    ("ring 8 x switch 2", RING_FABRIC, ["allgather", "broadcast"]),
    ("h800-rail-64", "h800-rail-64", ["broadcast"]),
]  # fmt: skip
MESHES = [
    ("v100-cubemesh-4", "v100-cubemesh-4"),
    ("dgx1-v100-cubemesh", str(ROOT / "examples/clusters/dgx1-v100-cubemesh.yaml")),
    ("mi300x-8 as a mesh", "mi300x-8"),
]


def _load(ref: str) -> ClusterTopology:
    return load_text(ref, "ring-fabric.yaml") if "\n" in ref else load_cluster(ref)


def _protocols(size: int) -> tuple[str, ...]:
    return ("LL", "LL128", "Simple") if size <= 1 << 20 else ("LL128", "Simple")


def _bound(coll: Collective, size: int, topo: ClusterTopology) -> float:
    g = nccl_graph(topo)
    return min(lower_bound(coll, size, topo, protocol_cost(p, link_kind=g.intra_kind, arch=g.arch,
                                                           nnodes=g.nnodes)).time_us
               for p in ("LL", "LL128", "Simple"))  # fmt: skip


def _calls(subs: list[SubSchedule]) -> tuple[int, int]:
    return sum(s.milp for s in subs), sum(s.nodes for s in subs)


def _row(fabric: str, coll: str, size: int, greedy_us: float, milp_us: float, bound: float,
         nccl_us: float, calls: int, nodes: int, wall: str) -> str:  # fmt: skip
    gain = 100.0 * (greedy_us / milp_us - 1.0)
    return (f"| {fabric} | {coll} | {format_size(size)} | {greedy_us:.1f} | "
            f"{100 * bound / greedy_us:.1f}% | {milp_us:.1f} | {100 * bound / milp_us:.1f}% | "
            f"{gain:+.1f}% | {nccl_us:.1f} | {calls} | {nodes} | {wall} |")  # fmt: skip


def symmetric_rows() -> None:
    for fabric, ref, colls in SYMMETRIC:
        topo = _load(ref)
        for coll in colls:
            runs = []
            for nodes in ((0, 0), None):
                t0 = time.perf_counter()
                kw = {} if nodes is None else {"milp_nodes": nodes}
                res = synthesize(topo, coll, SIZES, time_budget_s=3600.0, **kw)  # type: ignore[arg-type]
                runs.append((res, time.perf_counter() - t0))
            (greedy, wg), (milp, wm) = runs
            calls, nodes_explored = _calls(milp.subschedules)
            for a, b in zip(greedy.sizes, milp.sizes, strict=True):
                if a.synthesized is None or b.synthesized is None:
                    continue
                print(_row(fabric, coll, a.size_bytes, a.synthesized.time_us,
                           b.synthesized.time_us, b.bound_us, b.default.time_us, calls,
                           nodes_explored, f"{wg:.1f} / {wm:.1f} s"))  # fmt: skip
            sys.stdout.flush()


def mesh_allgather(topo: ClusterTopology, pattern: SubSchedule, k: int) -> ScheduleArrays:
    """The pattern's sends as an AllGather schedule: piece p is chunk p (rank p // k's)."""
    b = asm.Builder()
    arrival: dict[tuple[int, int], int] = {}
    for _, p, u, v in sorted(pattern.sends):
        dep = arrival.get((p, u))
        arrival[(p, v)] = b.add(u, v, p, () if dep is None else (dep,), stream=0)
    return b.arrays(f"mesh-allgather-k{k}", Collective.ALLGATHER, topo.world_size, k)


def mesh_rows() -> None:
    coll = Collective.ALLGATHER
    for fabric, ref in MESHES:
        topo = load_cluster(ref)
        group = GroupTopo.gpu_mesh(topo)
        ranks = tuple(range(group.size))
        router = Router(topo)
        g = nccl_graph(topo)
        built: dict[str, dict[int, ScheduleArrays]] = {"greedy": {}, "milp": {}}
        calls = nodes = 0
        t0 = time.perf_counter()
        for k in (1, 2, 4):
            demand = SubDemand(group, ranks, ranks, False, group.size * k,
                               tuple(r for r in ranks for _ in range(k)))  # fmt: skip
            for mode, limit in (("greedy", 0), ("milp", None)):
                sub = solve(demand, node_limit=0) if limit == 0 else solve(demand)
                if mode == "milp":
                    calls, nodes = calls + sub.milp, nodes + sub.nodes
                built[mode][k] = mesh_allgather(topo, sub, k)
        wall = f"{time.perf_counter() - t0:.1f} s (solves)"
        for size in SIZES:
            best: dict[str, tuple[float, int]] = {}
            for mode, arrs in built.items():
                best[mode] = min(
                    (simulate(arr, topo, size, protocol_cost(p, link_kind=g.intra_kind,
                                                             arch=g.arch, nnodes=g.nnodes),
                              router, engine="heap").time_us, k)
                    for k, arr in arrs.items() for p in _protocols(size))  # fmt: skip
            nccl = default_estimate(coll, size, topo, router=router, with_bound=False).time_us
            label = f"{coll.value} (mesh; k {best['greedy'][1]} / {best['milp'][1]})"
            print(_row(fabric, label, size, best["greedy"][0], best["milp"][0],
                       _bound(coll, size, topo), nccl, calls, nodes, wall))  # fmt: skip
            sys.stdout.flush()


def main() -> None:
    print(f"Machine: {cpu_model()}, load average {load_average()} at start. Every time below is "
          "simulated (ccltune's event simulator), none measured; the bound is the analytic lower "
          "bound under the most favourable protocol. Command: "
          "`.venv/bin/python benchmarks/milp_gain.py`\n")  # fmt: skip
    print("| fabric | collective | size | greedy us | greedy % bound | MILP us | MILP % bound | "
          "MILP gain | NCCL default us | MILP calls | B&B nodes | wall (greedy / MILP run) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    mesh_rows()
    symmetric_rows()


if __name__ == "__main__":
    main()
