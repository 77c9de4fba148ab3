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
from dataclasses import dataclass

import highspy
import numpy as np

from ..api.common import Collective
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


def _loads(fab: asm.Fabric, coll: Collective, sk: Sketch, patterns: asm.Patterns,
           root: int) -> tuple[dict[tuple[int, int, str], float], int]:  # fmt: skip
    """Chunks on each (rank, dim, direction) port for one root, and the depth in hops."""
    b = asm.Builder()
    if coll == Collective.ALLTOALL:
        asm._scatter(fab, sk, root, 0, 1, 1, b, 0)
    else:
        asm.broadcast_tree(fab, sk, patterns, root, [0], b, symmetric=coll != Collective.BROADCAST)
    loads: dict[tuple[int, int, str], float] = defaultdict(float)
    depth = [0] * len(b)
    for i in range(len(b)):
        s, d = b.src[i], b.dst[i]
        dim = next(k for k in range(len(fab.dims)) if fab.coord(s, k) != fab.coord(d, k))
        loads[(s, dim, "out")] += b.count[i]
        loads[(d, dim, "in")] += b.count[i]
        depth[i] = 1 + max((depth[x] for x in b.deps[i]), default=0)
    return loads, max(depth, default=0)


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


def candidates(fab: asm.Fabric, coll: Collective, sketches: list[Sketch], patterns: asm.Patterns,
               sizes: list[int], *, root: int = 0, top_k: int = 3) -> list[Candidate]:  # fmt: skip
    dims = fab.dims
    n = fab.nranks
    frac = _chunk_fraction(coll, n)
    phases = 2 if coll == Collective.ALLREDUCE else 1
    single = coll == Collective.BROADCAST
    cols: list[tuple[Sketch, Sketch, dict[tuple[int, int, str], float], int]] = []
    for sk in sketches:
        copies = sk.copies(dims) if single else [sk]
        for cp in copies:
            loads, depth = _loads(fab, coll, cp, patterns, root)
            cols.append((sk, cp, loads, depth))
    ports: list[tuple[int, int, str]]
    if single:
        ports = sorted({p for _, _, loads, _ in cols for p in loads})
        rows = [[loads.get(p, 0.0) * frac / (dims[p[1]].bandwidth_gbps * 1e3) for _, _, loads, _ in cols]
                for p in ports]  # fmt: skip
    else:
        per = [_per_dim(loads, len(dims)) for _, _, loads, _ in cols]
        rows = [[per[i][d] * frac / (dims[d].bandwidth_gbps * 1e3) for i in range(len(cols))]
                for d in range(len(dims))]  # fmt: skip

    def latency(depth: int, sk: Sketch) -> float:
        lat = sum(dims[st.dim].latency_us for st in sk.stages)
        return phases * (depth * STEP_US + lat)

    # Pure candidates: every copy of one sketch with equal shares.
    by_sketch: dict[Sketch, list[int]] = defaultdict(list)
    for i, (sk, _, _, _) in enumerate(cols):
        by_sketch[sk].append(i)
    pure: list[Candidate] = []
    for sk, idx in by_sketch.items():
        w = [1.0 / len(idx) if i in idx else 0.0 for i in range(len(cols))]
        bw = phases * _objective(w, rows)
        depth = max(cols[i][3] for i in idx)
        columns = [asm.Column(cols[i][1], 1) for i in idx]
        pure.append(Candidate(sk.label(dims), columns, bw, latency(depth, sk)))
    big, small = max(sizes), min(sizes)
    ranked = sorted(pure, key=lambda c: c.estimate_us(big))
    chosen = ranked[:top_k]
    fastest_small = min(pure, key=lambda c: c.estimate_us(small))
    if fastest_small not in chosen:
        chosen.append(fastest_small)
    # LP mix over all columns.
    w = _lp(rows)
    used = [i for i, x in enumerate(w) if x > 1e-3]
    if len(used) > 1:
        share = [w[i] / sum(w[j] for j in used) for i in used]

        def rounded(total: int) -> tuple[float, list[int]]:
            blocks = _blocks(share, total)
            wq = [0.0] * len(cols)
            for i, b in zip(used, blocks, strict=True):
                wq[i] = b / total
            return _objective(wq, rows), blocks

        # The fewest blocks whose rounded ratios come within 1% of the LP's optimum (else the
        # closest up to MIX_BLOCKS): blocks cost transfers, rounding costs bandwidth. Totals are
        # powers of two: chunks per rank must divide power-of-two message sizes, or
        # msccl-executor never selects the file (model/msccl_limits.py).
        totals = [t for t in (1 << k for k in range(MIX_BLOCKS.bit_length()))
                  if len(used) <= t <= MIX_BLOCKS]  # fmt: skip
        best_z = min(rounded(t)[0] for t in totals)
        total = next(t for t in totals
                     if rounded(t)[0] <= max(best_z, 1.01 * _objective(w, rows)))  # fmt: skip
        z, blocks = rounded(total)
        columns = [asm.Column(cols[i][1], b) for i, b in zip(used, blocks, strict=True) if b > 0]
        if len(columns) > 1:
            bw = phases * z
            depth = max(cols[i][3] for i in used)
            lat = max(latency(depth, cols[i][1]) for i in used)
            names = sorted({cols[i][0].label(dims) for i in used})
            label = f"mix({len(columns)} columns: {' | '.join(names)})"
            chosen.append(Candidate(label, columns, bw, lat))
    return chosen
