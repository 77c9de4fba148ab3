"""Sub-demand MILP: move pieces from sources to receivers inside one group, in epochs.

Formulation (TE-CCL-style epochs, as SyCCL §5.1 uses for sub-demands): the data a sub-demand
carries is split into `pieces`; time is cut into epochs of the time one piece takes on one link, so
every link (switch: every port; mesh: every lane of a pair) carries at most one piece per epoch.
With `origins` each piece starts at one GPU (an AllGather inside a server). Store-and-forward:
a piece sent in epoch t can be forwarded from epoch t+1. Variables:
  x[p,u,v,t] in {0,1}   piece p crosses link u->v in epoch t
  h[p,v,t]   in [0,1]   v holds p at the start of epoch t (integral at the optimum)
  y[t]       in {0,1}   some demand is still unmet at the start of epoch t (makespan = sum y)
Symmetric mode models collective symmetry (AllGather = N broadcasts mapped by translation): every
translate of the pattern runs at once, so the load of one link class (orbit under translation)
summed over the pattern must fit one link's capacity.

A greedy list schedule gives the horizon and a warm start, so a solve cut short by its work limit
still returns a valid (greedy or better) pattern and says so in `status`. The limits count work
(branch-and-bound nodes, simplex iterations), never seconds: one single-threaded HiGHS run with
the same limits gives the same pattern on any machine under any load.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import highspy
import numpy as np

from .group import GroupTopo
from .quiet import new_highs

# Largest model (binary x variables) we hand to HiGHS; above it the greedy pattern is used.
MAX_VARS = 12000
# Work limits per sub-demand MILP (branch-and-bound nodes; simplex iterations over the whole
# solve). Results depend on these counts only; the time limit is a hang guard no test reaches.
NODE_LIMIT = 2000
SIMPLEX_ITERATION_FACTOR = 200  # x the number of columns
HANG_GUARD_S = 3600.0


@dataclass(frozen=True, slots=True)
class SubDemand:
    """Every receiver needs every piece, which every source holds (one-to-all sub-demand); or,
    with `origins`, piece p starts at origins[p] alone (all-to-all, e.g. an AllGather inside
    one server: every GPU is a source and a receiver)."""

    group: GroupTopo
    sources: tuple[int, ...]
    receivers: tuple[int, ...]
    symmetric: bool
    pieces: int = 1
    origins: tuple[int, ...] = ()

    def holders(self, piece: int) -> set[int]:
        """Who holds `piece` at the start."""
        return {self.origins[piece]} if self.origins else set(self.sources)

    def key(self) -> tuple[object, ...]:
        """Isomorphic sub-demands share a key: solved once, mapped everywhere else."""
        c = self.canonical()
        return (c.group, c.sources, c.receivers, c.symmetric, c.pieces, c.origins)

    def canonical(self) -> SubDemand:
        if self.group.kind == "mesh" or self.origins:
            return self  # no symmetry assumed
        shift = min(self.sources)
        g = self.group.size
        src = tuple(sorted((s - shift) % g for s in self.sources))
        rcv = tuple(sorted((r - shift) % g for r in self.receivers))
        if self.group.kind != "ring":
            # Any permutation fixing the sources is an automorphism of a switch / full mesh.
            src = tuple(range(len(src)))
            rcv = tuple(range(len(src), len(src) + len(rcv)))
        return SubDemand(self.group, src, rcv, self.symmetric, self.pieces)


@dataclass(frozen=True, slots=True)
class SubSchedule:
    demand: SubDemand
    sends: tuple[tuple[int, int, int, int], ...]  # (epoch, piece, src, dst), group positions
    epochs: int
    status: str  # "optimal" | "work-limit" | "greedy" | "trivial"
    solve_s: float  # informational: wall time spent; nothing depends on it
    milp: bool = False  # HiGHS ran (the greedy start missed the lower bound)
    nodes: int = 0  # branch-and-bound nodes HiGHS explored
    greedy_epochs: int = 0  # the greedy start's makespan, for comparison

    def time_us(self, volume_bytes: float, multiplicity: float = 1.0) -> float:
        """Estimated duration when the whole sub-demand carries `volume_bytes`.

        `multiplicity` scales the load when several copies share the links (symmetric mode).
        """
        piece = volume_bytes / self.demand.pieces
        link = self.demand.group.link_gbps() * 1e3  # bytes per microsecond
        hops = max((self.demand.group.hops(u, v) for _, _, u, v in self.sends), default=0)
        return self.epochs * piece * multiplicity / link + hops * self.demand.group.latency_us

    def sends_per_piece(self) -> float:
        return len(self.sends) / max(1, self.demand.pieces)

    def mapped(self, demand: SubDemand) -> SubSchedule:
        """This pattern for an isomorphic demand (other sources/receivers, same key)."""
        own = self.demand
        perm = _position_map(own, demand)
        sends = tuple((t, p, perm[u], perm[v]) for t, p, u, v in self.sends)
        return SubSchedule(demand, sends, self.epochs, self.status, self.solve_s, self.milp,
                           self.nodes, self.greedy_epochs)  # fmt: skip


def _position_map(a: SubDemand, b: SubDemand) -> dict[int, int]:
    g = a.group.size
    if a.group.kind == "ring":
        shift = (min(b.sources) - min(a.sources)) % g
        return {u: (u + shift) % g for u in range(g)}
    order_a = sorted(a.sources) + sorted(a.receivers)
    order_b = sorted(b.sources) + sorted(b.receivers)
    perm = dict(zip(order_a, order_b, strict=True))
    rest_a = [u for u in range(g) if u not in perm]
    rest_b = [u for u in range(g) if u not in perm.values()]
    perm.update(zip(rest_a, rest_b, strict=True))
    return perm


class _Capacity:
    """Per-epoch capacity bookkeeping shared by the greedy and the MILP rows."""

    def __init__(self, demand: SubDemand) -> None:
        self.d = demand
        self.switch = demand.group.kind == "switch" or (
            demand.group.size == 2 and demand.group.kind != "mesh"
        )

    def limit(self, res: tuple[str, int]) -> int:
        """Pieces a resource carries per epoch (a mesh link: its lanes)."""
        if res[0] == "link":
            g = self.d.group
            return g.capacity(res[1] // g.size, res[1] % g.size)
        return 1

    def resources(self, u: int, v: int) -> list[tuple[str, int]]:
        g = self.d.group
        if g.kind == "mesh":
            return [("link", u * g.size + v)]
        if self.switch:
            if self.d.symmetric:
                return [("all", 0)]  # egress and ingress orbits both hold every port
            return [("out", u), ("in", v)]
        if self.d.symmetric:
            return [("class", g.link_class(u, v))]
        return [("link", u * g.size + v)]


def greedy(demand: SubDemand) -> list[tuple[int, int, int, int]]:
    """Epidemic list schedule: every free link forwards the rarest useful piece (rarest-first
    spreads different pieces to different GPUs, so receivers can relay to each other)."""
    cap = _Capacity(demand)
    g = demand.group
    links = g.links()
    hold = [demand.holders(p) for p in range(demand.pieces)]
    need = {(p, r) for p in range(demand.pieces) for r in demand.receivers if r not in hold[p]}
    # A switch's sub-group in symmetric mode (a virtual split's stage, synth/sketch.py): direct
    # sends meet the bound, and receivers relaying to each other would add peer offsets the
    # stage does not have (i - j for j > i), each a threadblock more.
    direct = (cap.switch and demand.symmetric and not demand.origins
              and len(demand.sources) + len(demand.receivers) < g.size)  # fmt: skip
    sends: list[tuple[int, int, int, int]] = []
    t = 0
    while need:
        used: dict[tuple[str, int], int] = {}
        arriving: set[tuple[int, int]] = set()
        shift = t % max(1, len(links))
        order = links[shift:] + links[:shift]
        for u, v in [lk for lk in order for _ in range(g.capacity(*lk))]:
            if direct and u not in demand.sources:
                continue
            res = cap.resources(u, v)
            if any(used.get(r, 0) >= cap.limit(r) for r in res):
                continue
            best = None
            for p in range(demand.pieces):
                if u not in hold[p] or v in hold[p] or (p, v) in arriving:
                    continue
                targets = [r for r in demand.receivers if (p, r) in need]
                if not targets:
                    continue
                if v not in targets and not any(g.hops(v, r) < g.hops(u, r) for r in targets):
                    continue
                rank = (len(hold[p]) + sum(1 for q, _ in arriving if q == p), p)
                if best is None or rank < best[0]:
                    best = (rank, p)
            if best is None:
                continue
            p = best[1]
            for r in res:
                used[r] = used.get(r, 0) + 1
            arriving.add((p, v))
            sends.append((t, p, u, v))
        if not arriving:
            raise RuntimeError(f"greedy made no progress on {demand}")  # disconnected group
        for p, v in arriving:
            hold[p].add(v)
            need.discard((p, v))
        t += 1
    return sends


Send = tuple[int, int, int, int]  # (epoch, piece, src, dst)


def _prune(demand: SubDemand, sends: list[Send]) -> list[Send]:
    """Keep first arrivals only and drop sends whose data never reaches a receiver."""
    first: dict[tuple[int, int], tuple[int, int, int, int]] = {}
    held = [demand.holders(p) for p in range(demand.pieces)]
    for s in sorted(sends):
        _, p, _, v = s
        if v in held[p] or (p, v) in first:
            continue
        first[(p, v)] = s
    kept = list(first.values())
    while True:  # drop relays into non-receivers that forward nothing
        forwarders = {(p, u) for _, p, u, _ in kept}
        rec = set(demand.receivers)
        new = [s for s in kept if s[3] in rec or (s[1], s[3]) in forwarders]
        if len(new) == len(kept):
            return sorted(new)
        kept = new


def _epochs(sends: list[Send]) -> int:
    return 1 + max(s[0] for s in sends) if sends else 0


def solve(demand: SubDemand, *, node_limit: int = NODE_LIMIT) -> SubSchedule:
    """Solve one sub-demand with at most `node_limit` branch-and-bound nodes (0: greedy only);
    falls back to the greedy pattern when the MILP is too large."""
    start = time.perf_counter()
    if not demand.receivers:
        return SubSchedule(demand, (), 0, "trivial", 0.0)
    warm = _prune(demand, greedy(demand))
    horizon = _epochs(warm)
    lower = _lower_bound(demand)
    links = demand.group.links()
    nvars = demand.pieces * len(links) * horizon
    if horizon <= lower or nvars > MAX_VARS or node_limit <= 0:
        status = "optimal" if horizon <= lower else "greedy"
        return SubSchedule(demand, tuple(warm), horizon, status, time.perf_counter() - start,
                           greedy_epochs=horizon)  # fmt: skip
    sends, status, nodes = _milp(demand, horizon, warm, node_limit)
    pruned = _prune(demand, sends)
    return SubSchedule(demand, tuple(pruned), _epochs(pruned), status,
                       time.perf_counter() - start, True, nodes, horizon)  # fmt: skip


def _lower_bound(demand: SubDemand) -> int:
    """Epochs no schedule can beat: a receiver's in-links, the distance, aggregate capacity."""
    g = demand.group
    k = demand.pieces
    links = g.links()
    if g.kind == "mesh" or demand.origins:
        bound = 0
        for r in demand.receivers:
            missing = [p for p in range(k) if r not in demand.holders(p)]
            into = sum(g.capacity(u, v) for u, v in links if v == r)
            if missing:
                far = max(min(g.hops(s, r) for s in demand.holders(p)) for p in missing)
                bound = max(bound, -(-len(missing) // max(1, into)), far)
        return bound
    indeg = sum(1 for _, v in links if v == demand.receivers[0])
    dist = max(min(g.hops(s, r) for s in demand.sources) for r in demand.receivers)
    bound = max(-(-k // indeg), dist)
    if demand.symmetric:
        switch = g.kind == "switch" or g.size == 2
        ports = 1 if switch else len({g.link_class(u, v) for u, v in links})
        # Every receiver takes one reception per piece, relays included.
        bound = max(bound, -(-k * len(demand.receivers) // ports))
    return bound


def _milp(
    demand: SubDemand, horizon: int, warm: list[Send], node_limit: int
) -> tuple[list[tuple[int, int, int, int]], str, int]:
    k, g, T = demand.pieces, demand.group.size, horizon
    links = demand.group.links()
    cap = _Capacity(demand)
    # Column layout: x | h | y.
    xi = {
        (p, e, t): (p * len(links) + e) * T + t
        for p in range(k)
        for e in range(len(links))
        for t in range(T)
    }
    nx = len(xi)
    hi = {
        (p, v, t): nx + (p * g + v) * (T + 1) + t
        for p in range(k)
        for v in range(g)
        for t in range(T + 1)
    }
    nh = len(hi)
    yi = {t: nx + nh + t - 1 for t in range(1, T + 1)}
    n = nx + nh + len(yi)
    lb = np.zeros(n)
    ub = np.ones(n)
    eps = 1.0 / (2 * (nx + 1))
    cost = np.zeros(n)
    cost[:nx] = eps
    for t in yi:
        cost[yi[t]] = 1.0
    for p in range(k):
        start = demand.holders(p)
        for v in range(g):
            held = 1.0 if v in start else 0.0
            lb[hi[(p, v, 0)]] = ub[hi[(p, v, 0)]] = held
            if held:
                for t in range(T + 1):
                    lb[hi[(p, v, t)]] = 1.0
        for r in demand.receivers:
            if r not in start:
                lb[hi[(p, r, T)]] = 1.0
    rows: list[tuple[float, float, list[int], list[float]]] = []
    inf = highspy.kHighsInf
    into: dict[int, list[int]] = {v: [] for v in range(g)}
    for e, (_, v) in enumerate(links):
        into[v].append(e)
    for p in range(k):
        for v in range(g):
            for t in range(T):
                idx = [hi[(p, v, t + 1)], hi[(p, v, t)]] + [xi[(p, e, t)] for e in into[v]]
                rows.append((-inf, 0.0, idx, [1.0, -1.0] + [-1.0] * len(into[v])))
        for e, (u, _) in enumerate(links):
            for t in range(T):
                rows.append((-inf, 0.0, [xi[(p, e, t)], hi[(p, u, t)]], [1.0, -1.0]))
    by_res: dict[tuple[str, int], list[int]] = {}
    for e, (u, v) in enumerate(links):
        for res in cap.resources(u, v):
            by_res.setdefault(res, []).append(e)
    for res, es in by_res.items():
        for t in range(T):
            idx = [xi[(p, e, t)] for p in range(k) for e in es]
            rows.append((-inf, float(cap.limit(res)), idx, [1.0] * len(idx)))
    for t in range(1, T + 1):
        for p in range(k):
            for r in demand.receivers:
                if r not in demand.holders(p):
                    rows.append((1.0, inf, [yi[t], hi[(p, r, t)]], [1.0, 1.0]))
        if t < T:
            rows.append((0.0, inf, [yi[t], yi[t + 1]], [1.0, -1.0]))
    h = new_highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", HANG_GUARD_S)
    h.setOptionValue("mip_max_nodes", int(node_limit))
    h.setOptionValue("simplex_iteration_limit", SIMPLEX_ITERATION_FACTOR * n)
    h.setOptionValue("threads", 1)  # HiGHS' parallel MIP is not run-to-run deterministic
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.addVars(n, lb, ub)
    h.changeColsCost(n, np.arange(n, dtype=np.int32), cost)
    ints = np.array(list(range(nx)) + list(yi.values()), dtype=np.int32)
    h.changeColsIntegrality(len(ints), ints, np.ones(len(ints), dtype=np.uint8))
    lower = np.array([r[0] for r in rows])
    upper = np.array([r[1] for r in rows])
    starts = np.zeros(len(rows), dtype=np.int32)
    index: list[int] = []
    value: list[float] = []
    for i, (_, _, idx, val) in enumerate(rows):
        starts[i] = len(index)
        index.extend(idx)
        value.extend(val)
    h.addRows(
        len(rows),
        lower,
        upper,
        len(index),
        starts,
        np.array(index, dtype=np.int32),
        np.array(value),
    )
    h.setSolution(
        n, np.arange(n, dtype=np.int32), _warm_values(demand, warm, xi, hi, yi, n, T, links)
    )
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kNotset:
        # HiGHS refuses a run whose thread count differs from the process's first HiGHS run;
        # falling back to greedy here would make patterns depend on what ran before.
        raise RuntimeError("HiGHS did not run the sub-demand MILP (threads differ from 1?)")
    sol = h.getSolution()
    nodes = int(h.getInfo().mip_node_count)
    # Node and iteration limits end as kSolutionLimit / kIterationLimit; a time-limit stop (the
    # hang guard) would make the pattern depend on the machine, so it keeps the greedy one.
    if sol.value_valid and status in (
        highspy.HighsModelStatus.kOptimal,
        highspy.HighsModelStatus.kSolutionLimit,
        highspy.HighsModelStatus.kIterationLimit,
    ):
        col = sol.col_value
        sends = [(t, p, links[e][0], links[e][1]) for (p, e, t), i in xi.items() if col[i] > 0.5]
        tag = "optimal" if status == highspy.HighsModelStatus.kOptimal else "work-limit"
        if _valid(demand, sends):
            return sends, tag, nodes
    return list(warm), "greedy", nodes


def _warm_values(
    demand: SubDemand,
    warm: list[Send],
    xi: dict[tuple[int, int, int], int],
    hi: dict[tuple[int, int, int], int],
    yi: dict[int, int],
    n: int,
    T: int,
    links: list[tuple[int, int]],
) -> np.ndarray:
    val = np.zeros(n)
    eidx = {lk: e for e, lk in enumerate(links)}
    arrive: dict[tuple[int, int], int] = {}
    for t, p, u, v in warm:
        val[xi[(p, eidx[(u, v)], t)]] = 1.0
        arrive[(p, v)] = t + 1
    for p in range(demand.pieces):
        start = demand.holders(p)
        for v in range(demand.group.size):
            at = 0 if v in start else arrive.get((p, v), T + 1)
            for t in range(T + 1):
                val[hi[(p, v, t)]] = 1.0 if t >= at else 0.0
    last = _epochs(warm)
    for t, i in yi.items():
        val[i] = 1.0 if t < last else 0.0  # demand fully met from the start of epoch `last`
    return val


def _valid(demand: SubDemand, sends: list[tuple[int, int, int, int]]) -> bool:
    """Replays a pattern: every send leaves a holder, every receiver ends with every piece."""
    hold = [demand.holders(p) for p in range(demand.pieces)]
    links = set(demand.group.links())
    cap = _Capacity(demand)
    for t in sorted({s[0] for s in sends}):
        now = [s for s in sends if s[0] == t]
        load: dict[tuple[str, int], int] = {}
        for _, p, u, v in now:
            if u not in hold[p] or (u, v) not in links:
                return False
            for r in cap.resources(u, v):
                load[r] = load.get(r, 0) + 1
                if load[r] > cap.limit(r):
                    return False
        for _, p, _, v in now:
            hold[p].add(v)
    return all(r in hold[p] for p in range(demand.pieces) for r in demand.receivers)
