"""Sketches of one-to-all collectives over a symmetric fabric's dimensions (SyCCL §4.1).

A sketch says how the data of one root reaches every other GPU as a short sequence of stages,
each inside the groups of one dimension:
- `relay` (dim d, offset o): the root hands the data to the GPU o positions away in its group of
  d; from then on that GPU acts as the root (the root keeps its copy and never receives again);
- `spread` (dim d): every GPU that acts as a source sends to every other GPU of its group of d
  (one sub-demand per group, solved once and mapped to all of them).
Every spread order of the dimensions reaches every GPU exactly once.

Search space and SyCCL's three prunings:
1. isomorphic sketches: relays to offsets that an automorphism fixing the root maps onto each
   other are one sketch (any offset in a switch or full mesh; o and -o on a ring), and identical
   dimensions may be spread in one canonical order;
2. forced consistency: a stage is a single sub-demand applied to every group of the dimension
   that holds data, so isomorphic groups always send and receive in the same ratio (the
   representation cannot express anything else; `raw_inconsistent` counts what it excludes);
3. bounded relays: data is relayed at most `len(dims)` times, i.e. at most one relay hop before
   the D spread stages.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ..api.cluster import Dimension


@dataclass(frozen=True, slots=True)
class Stage:
    dim: int
    kind: str  # "relay" | "spread"
    offset: int = 0  # relay only

    def label(self, dims: list[Dimension]) -> str:
        name = dims[self.dim].name
        return f"relay:{name}+{self.offset}" if self.kind == "relay" else f"spread:{name}"


@dataclass(frozen=True, slots=True)
class Sketch:
    stages: tuple[Stage, ...]

    @property
    def relay(self) -> Stage | None:
        return self.stages[0] if self.stages and self.stages[0].kind == "relay" else None

    @property
    def order(self) -> tuple[int, ...]:
        return tuple(s.dim for s in self.stages if s.kind == "spread")

    def label(self, dims: list[Dimension]) -> str:
        return " > ".join(s.label(dims) for s in self.stages) or "local"

    def copies(self, dims: list[Dimension]) -> list[Sketch]:
        """The isomorphic sketches pruning 1 folded into this one (combination re-expands them)."""
        r = self.relay
        if r is None:
            return [self]
        dim = dims[r.dim]
        if dim.kind == "ring" and dim.size > 2:
            offs = sorted({r.offset, (-r.offset) % dim.size})
        else:
            offs = list(range(1, dim.size))
        return [Sketch((Stage(r.dim, "relay", o), *self.stages[1:])) for o in offs]


@dataclass(frozen=True, slots=True)
class SearchStats:
    raw: int  # by formula, not enumerated: relay prefixes up to D hops x spread orders
    after_relay_bound: int  # by formula, not enumerated
    after_isomorphism: int
    raw_inconsistent: int  # per-group variants forced consistency excludes (not enumerated)
    kept: int


def _signature(d: Dimension) -> tuple[object, ...]:
    return (d.kind, d.size, d.bandwidth_gbps, d.latency_us)


def _canonical_orders(dims: list[Dimension], active: list[int]) -> list[tuple[int, ...]]:
    out = []
    for perm in itertools.permutations(active):
        # Identical dimensions are interchangeable: keep the order that lists them ascending.
        ok = all(
            not (_signature(dims[a]) == _signature(dims[b]) and a > b)
            for i, a in enumerate(perm)
            for b in perm[i + 1 :]
        )
        if ok:
            out.append(perm)
    return out


def _relay_reps(dim: Dimension) -> list[int]:
    if dim.kind == "ring" and dim.size > 2:
        return list(range(1, dim.size // 2 + 1))
    return [1] if dim.size > 1 else []


def search(dims: list[Dimension], *, relays: bool = True) -> tuple[list[Sketch], SearchStats]:
    """Enumerate pruned sketches; `relays=False` for collectives where every GPU is a root."""
    active = [i for i, d in enumerate(dims) if d.size > 1]
    if not active:
        return [Sketch(())], SearchStats(1, 1, 1, 0, 1)
    nd = len(active)
    orders_raw = math.factorial(nd)
    hops = sum(dims[i].size - 1 for i in active)
    raw = orders_raw * sum(hops**p for p in range(nd + 1))
    bounded = orders_raw * (1 + hops)
    orders = _canonical_orders(dims, active)
    reps = [(d, o) for d in active for o in _relay_reps(dims[d])] if relays else []
    sketches = [Sketch(tuple(Stage(d, "spread") for d in order)) for order in orders]
    for d, o in reps:
        for order in orders:
            sketches.append(Sketch((Stage(d, "relay", o), *(Stage(x, "spread") for x in order))))
    # Forced consistency: in a spread stage over dim d, each of the G groups holding data could
    # otherwise pick its own receiver subset (2^(g-1) - 1 non-empty ones).
    inconsistent = 0
    for order in orders:
        groups = 1
        for d in order:
            variants = (2 ** (dims[d].size - 1) - 1) ** groups if groups < 64 else 0
            inconsistent += max(0, variants - 1)
            groups *= dims[d].size
    iso = len(orders) * (1 + len(reps))
    stats = SearchStats(raw, bounded, iso, inconsistent, len(sketches))
    return sketches, stats
