"""Sketch combination (SyCCL §4.2): split the data over sketches so that load follows bandwidth.

Each sketch, expanded once from the root with its solved sub-demand patterns, puts a known number
of chunks on every port (per GPU and dimension, per direction). Collective symmetry makes every
GPU's port in a dimension carry the same load in AllGather/ReduceScatter/AllReduce/AlltoAll, so
one root's per-dimension totals are the per-port loads; a broadcast has one root, so its loads are
kept per GPU port and the isomorphic copies of a sketch (relays through different groups) are
separate columns. An LP (HiGHS) picks split ratios w minimising max_port sum_i w_i load_i / bw;
the ratios are rounded to blocks of chunks. Candidates are ranked by an alpha-beta estimate from
those loads; the best `top_k` (plus the LP mix and the best at the smallest size) go on to the fine
step and the simulator.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import highspy
import numpy as np

from ..api.cluster import ClusterTopology, Dimension, LinkKind
from ..api.common import Collective
from ..model.cost.gpu import gpu_physics
from ..model.sim.translations import Translations
from . import assemble as asm
from .quiet import new_highs
from .sketch import Sketch

# Fixed cost of one transfer step for ranking only (the simulator uses the protocol's own).
STEP_US = 3.4
MIX_BLOCKS = 16  # most blocks a rounded LP mix may use


@dataclass(frozen=True)
class Candidate:
    label: str
    columns: list[asm.Column]
    bw_us_per_byte: float  # estimated time per byte of the collective's size (bandwidth term)
    latency_us: float  # estimated fixed time (depth x step and link latencies)

    def estimate_us(self, size: int) -> float:
        return self.latency_us + self.bw_us_per_byte * size


def port_payload_gbps(topo: ClusterTopology, dims: list[Dimension]) -> list[float]:
    """Per dimension, the payload GB/s of a GPU's port as the simulator runs it: dimensions
    inside a node on NVLink at the GPU's SM-copy efficiency (model/sim/capacity.py), others at
    line rate. Without it the LP balances NVLink at 1/0.8 of what it carries."""
    phys = gpu_physics(topo.gpu_model)
    eff = phys.nvlink_efficiency if phys else 1.0
    gpu = topo.gpu_id(0)
    nvlink = any(LinkKind(link.kind) == LinkKind.NVLINK and gpu in (link.a, link.b)
                 for link in topo.links)  # fmt: skip
    out, span = [], 1
    for d in dims:
        span *= d.size
        out.append(d.bandwidth_gbps * (eff if nvlink and span <= topo.gpus_per_node else 1.0))
    return out


def _loads(fab: asm.Fabric, coll: Collective, sk: Sketch, patterns: asm.Patterns,
           root: int) -> tuple[dict[tuple[int, int, str], float], int, dict[int, float]]:  # fmt: skip
    """Chunks on each (rank, dim, direction) port for one root, the depth in hops, and chunks
    per peer offset (dst - src as a translation): by symmetry, what every GPU receives from
    the peer at that offset, i.e. the load on the threadblock(s) serving it."""
    b = asm.Builder()
    if coll == Collective.ALLTOALL:
        asm._scatter(fab, sk, root, 0, 1, 1, b, 0)
    else:
        asm.broadcast_tree(fab, sk, patterns, root, [0], b, symmetric=coll != Collective.BROADCAST)
    loads: dict[tuple[int, int, str], float] = defaultdict(float)
    depth = [0] * len(b)
    delta = Translations(fab.sizes).sub(np.asarray(b.dst, dtype=np.int64),
                                        np.asarray(b.src, dtype=np.int64))  # fmt: skip
    offsets: dict[int, float] = defaultdict(float)
    for d, c in zip(delta.tolist(), b.count, strict=True):
        offsets[d] += c
    for i in range(len(b)):
        s, d = b.src[i], b.dst[i]
        dim = next(k for k in range(len(fab.dims)) if fab.coord(s, k) != fab.coord(d, k))
        loads[(s, dim, "out")] += b.count[i]
        loads[(d, dim, "in")] += b.count[i]
        depth[i] = 1 + max((depth[x] for x in b.deps[i]), default=0)
    return loads, max(depth, default=0), offsets


def _per_dim(loads: dict[tuple[int, int, str], float], ndims: int) -> list[float]:
    out = [0.0] * ndims
    for (_, dim, direction), v in loads.items():
        if direction == "out":
            out[dim] += v
    return out


def _chunk_fraction(coll: Collective, n: int) -> float:
    """Bytes of one sketch chunk per byte of the collective's size."""
    if coll == Collective.BROADCAST:
        return 1.0
    return 1.0 / n  # AG/RS/AR: a rank's share; alltoall: one (src, dst) block of a send buffer


def _lp(rows: list[list[float]]) -> list[float]:
    """min z s.t. sum_i w_i rows[p][i] <= z, sum w = 1, w >= 0."""
    m = len(rows[0])
    h = new_highs()
    h.setOptionValue("output_flag", False)
    # HiGHS' thread pool is per process and sized by the first run: every solver here uses one
    # thread, else milp.py's single-threaded (deterministic) runs would be refused.
    h.setOptionValue("threads", 1)
    inf = highspy.kHighsInf
    h.addVars(m + 1, np.zeros(m + 1), np.full(m + 1, inf))
    cost = np.zeros(m + 1)
    cost[m] = 1.0
    h.changeColsCost(m + 1, np.arange(m + 1, dtype=np.int32), cost)
    for row in rows:
        idx = np.array([*range(m), m], dtype=np.int32)
        h.addRow(-inf, 0.0, m + 1, idx, np.array([*row, -1.0]))
    h.addRow(1.0, 1.0, m, np.arange(m, dtype=np.int32), np.ones(m))
    h.run()
    w = list(h.getSolution().col_value[:m])
    return [max(0.0, x) for x in w]


def _objective(w: list[float], rows: list[list[float]]) -> float:
    return max(sum(wi * r for wi, r in zip(w, row, strict=True)) for row in rows)


def _blocks(weights: list[float], total: int) -> list[int]:
    """Largest-remainder rounding of weights to `total` blocks."""
    raw = [w * total for w in weights]
    out = [int(x) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: out[i] - raw[i])[: total - sum(out)]:
        out[i] += 1
    return out


def _deal(load: dict[int, float], budget: int) -> dict[int, int] | None:
    """Threadblocks per peer offset as spread_channels deals them (one each, then one more at a
    time to the most loaded per threadblock); None when the offsets outnumber the budget."""
    used = [d for d, v in load.items() if v > 0]
    if len(used) > budget:
        return None
    k = dict.fromkeys(used, 1)
    for _ in range(min(budget - len(used), sum(asm.MAX_CHANNELS - 1 for _ in used))):
        room = [d for d in used if k[d] < asm.MAX_CHANNELS]
        if not room:
            break
        top = max(room, key=lambda d: (load[d] / k[d], -d))
        k[top] += 1
    return k


def _tb_rows(offs: list[dict[int, float]], k: dict[int, int], scale: float) -> list[list[float]]:
    """One LP row per peer offset: its chunks over the threadblocks dealt to it."""
    return [[o.get(d, 0.0) * scale / k[d] for o in offs] for d in sorted(k)]


def candidates(fab: asm.Fabric, coll: Collective, sketches: list[Sketch], patterns: asm.Patterns,
               sizes: list[int], *, root: int = 0, top_k: int = 3,
               threadblocks: int | None = None, tb_gbps: float | None = None,
               port_gbps: list[float] | None = None) -> list[Candidate]:  # fmt: skip
    """Candidates ranked by their link loads and, given the SM budget (`threadblocks` per GPU,
    each moving `tb_gbps`), by their threadblocks' loads: with few threadblocks per peer a
    sketch that is best for the links can be worst for the threadblocks (docs/synthesis.md).
    `port_gbps`: per dimension, the payload GB/s a GPU's port moves as the simulator runs it
    (NVLink x the SM-copy efficiency, `port_payload_gbps`); default the dimensions' line rate."""
    dims = fab.dims
    port = port_gbps or [d.bandwidth_gbps for d in dims]
    n = fab.nranks
    frac = _chunk_fraction(coll, n)
    phases = 2 if coll == Collective.ALLREDUCE else 1
    single = coll == Collective.BROADCAST
    cols: list[tuple[Sketch, Sketch, dict[tuple[int, int, str], float], int]] = []
    offs: list[dict[int, float]] = []
    for sk in sketches:
        copies = sk.copies(dims) if single else [sk]
        for cp in copies:
            loads, depth, per_offset = _loads(fab, coll, cp, patterns, root)
            cols.append((sk, cp, loads, depth))
            offs.append(per_offset)
    ports: list[tuple[int, int, str]]
    if single:
        ports = sorted({p for _, _, loads, _ in cols for p in loads})
        rows = [[loads.get(p, 0.0) * frac / (port[p[1]] * 1e3) for _, _, loads, _ in cols]
                for p in ports]  # fmt: skip
    else:
        per = [_per_dim(loads, len(dims)) for _, _, loads, _ in cols]
        rows = [[per[i][d] * frac / (port[d] * 1e3) for i in range(len(cols))]
                for d in range(len(dims))]  # fmt: skip
    # Threadblock sides (symmetric collectives: every GPU alike, so root 0's offsets suffice).
    tb_scale = 0.0
    if threadblocks and tb_gbps and not single:
        tb_scale = frac / (tb_gbps * 1e3)

    def tb_objective(w: list[float]) -> tuple[float, dict[int, int] | None]:
        load: dict[int, float] = defaultdict(float)
        for wi, o in zip(w, offs, strict=True):
            for d, v in o.items():
                load[d] += wi * v
        k = _deal(load, threadblocks or 0)
        if k is None or not tb_scale:
            return 0.0, k
        return max(load[d] * tb_scale / k[d] for d in k), k

    def latency(depth: int, sk: Sketch) -> float:
        lat = sum(dims[st.dim].latency_us for st in sk.stages)
        return phases * (depth * STEP_US + lat)

    # Pure candidates: every copy of one sketch with equal shares.
    by_sketch: dict[Sketch, list[int]] = defaultdict(list)
    for i, (sk, _, _, _) in enumerate(cols):
        by_sketch[sk].append(i)
    pure: list[Candidate] = []
    over: set[str] = set()  # needs more threadblocks than the budget (one per peer offset)
    for sk, idx in by_sketch.items():
        w = [1.0 / len(idx) if i in idx else 0.0 for i in range(len(cols))]
        tb_t, k = tb_objective(w)
        if tb_scale and k is None:
            over.add(sk.label(dims))
        bw = phases * max(_objective(w, rows), tb_t)
        depth = max(cols[i][3] for i in idx)
        columns = [asm.Column(cols[i][1], 1) for i in idx]
        pure.append(Candidate(sk.label(dims), columns, bw, latency(depth, sk)))
    big, small = max(sizes), min(sizes)
    ranked = sorted(pure, key=lambda c: (c.label in over, c.estimate_us(big)))
    chosen = ranked[:top_k]
    fastest_small = min(pure, key=lambda c: (c.label in over, c.estimate_us(small)))
    if fastest_small not in chosen:
        chosen.append(fastest_small)
    # LP mix over all columns of the lead's virtual split (sketch.Sketch.split; one split unless
    # none fits the budget unsplit): links only, then with the threadblocks dealt by the last mix.
    split = ranked[0].columns[0].sketch.split(dims)
    other = [0.0 if cp.split(dims) == split else 1.0 for _, cp, _, _ in cols]
    if any(other):  # splits differ in peers: a mix across them would need the union
        big_row = max(max(r) for r in rows) * 1e6
        rows_lp = [*rows, [x * big_row for x in other]]
    else:
        rows_lp = rows
    w = _lp(rows_lp)
    _, k = tb_objective([1.0 - x for x in other])
    if tb_scale and k is not None:
        for _ in range(3):
            w_tb = _lp(rows_lp + _tb_rows(offs, k, tb_scale))
            z_tb, k_next = tb_objective(w_tb)
            if max(_objective(w_tb, rows), z_tb) < max(_objective(w, rows), tb_objective(w)[0]):
                w = w_tb
            if k_next is None or k_next == k:
                break
            k = k_next
    mix = _mix(cols, rows, w, lambda wq: max(_objective(wq, rows), tb_objective(wq)[0]))
    if mix is not None:
        blocks, z, used = mix
        columns = [asm.Column(cols[i][1], b) for i, b in zip(used, blocks, strict=True) if b > 0]
        if len(columns) > 1:
            bw = phases * z
            depth = max(cols[i][3] for i in used)
            lat = max(latency(depth, cols[i][1]) for i in used)
            names = sorted({cols[i][0].label(dims) for i in used})
            label = f"mix({len(columns)} columns: {' | '.join(names)})"
            chosen.append(Candidate(label, columns, bw, lat))
    return chosen


def _mix(cols: list[tuple[Sketch, Sketch, dict[tuple[int, int, str], float], int]],
         rows: list[list[float]], w: list[float],
         objective: Callable[[list[float]], float]) -> tuple[list[int], float, list[int]] | None:  # fmt: skip
    """The LP's ratios rounded to blocks: (blocks per used column, objective, used columns)."""
    used = [i for i, x in enumerate(w) if x > 1e-3]
    if len(used) <= 1:
        return None
    share = [w[i] / sum(w[j] for j in used) for i in used]

    def rounded(total: int) -> tuple[float, list[int]]:
        blocks = _blocks(share, total)
        wq = [0.0] * len(cols)
        for i, b in zip(used, blocks, strict=True):
            wq[i] = b / total
        return objective(wq), blocks

    # The fewest blocks whose rounded ratios come within 1% of the LP's optimum (else the
    # closest up to MIX_BLOCKS): blocks cost transfers, rounding costs bandwidth. Totals are
    # powers of two: chunks per rank must divide power-of-two message sizes, or
    # msccl-executor never selects the file (model/msccl_limits.py).
    totals = [t for t in (1 << k for k in range(MIX_BLOCKS.bit_length()))
              if len(used) <= t <= MIX_BLOCKS]  # fmt: skip
    if not totals:
        return None
    best_z = min(rounded(t)[0] for t in totals)
    total = next(t for t in totals if rounded(t)[0] <= max(best_z, 1.01 * objective(w)))
    z, blocks = rounded(total)
    return blocks, z, used
