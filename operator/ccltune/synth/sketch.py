"""Sketch search for one-to-all collectives over a symmetric fabric (SyCCL §4.1).

A sketch says how the data of one root reaches every GPU as a sequence of stages. A stage picks
a dimension d, the sub-demand each group of d runs, and which of the G groups of d that hold
acting sources take part. Sub-demands (relative to the acting source of a group):
- `relay` (offset o): hand the data to the GPU o positions away; from then on that GPU acts as
  the source (the old one keeps its copy);
- `spread`: send to every other GPU of the group (all of them act from then on).
- `spread` over a virtual sub-group (`span` < size, switch dimensions only): send to the GPUs
  `stride`, 2 `stride`, ... (`span` - 1) `stride` positions away. Consecutive sub-spreads of one
  switch (spans a1, a2, ... with product its size) are a virtual split of it, e.g. 64 -> 4 x 4 x 4:
  3 + 3 + 3 peers per GPU instead of 63, for the same port load (a switch carries g - 1 chunks
  per GPU whichever way). They are searched only when no unsplit sketch fits the peer budget.
Other partial spreads are not stages of their own: the sub-demand MILP already routes inside a
group.

The search enumerates these stage sequences depth first (up to 2 stages per dimension), counting
every sequence it generates, and applies SyCCL's three prunings as filters, in the paper's order;
a sequence a filter removes is not extended:
1. isomorphic sketches (`canonical`): sequences mapped onto each other by an automorphism that
   fixes the root (any permutation of a switch's or full mesh's positions, the reflection of a
   ring, swapping identical dimensions) are one sketch; only the canonical one is kept;
2. forced consistency (`consistent`): all isomorphic groups holding data run the same
   sub-demand, so a stage in which only some of the G groups take part is removed;
3. bounded relays (`relays_bounded`): at most `max_relays` relay hops, all before the first
   spread;
and, given `max_peers` (the SM budget: an MSCCL threadblock has one send and one receive peer),
4. bounded peers (`peers`): a sequence whose GPUs send to more peer offsets than `max_peers`
   cannot become a file within the budget, nor can any extension of it.
A complete sequence (every GPU holds the data) that passes all three is a sketch. The counts
`search` returns are the sequences actually generated and those surviving each filter; the
search stops after `limit` generated sequences (work, not seconds) and says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..api.cluster import Dimension

# Stage sequences generated before the search stops (work, not seconds): h800-rail-512
# enumerates 3,286, a 3-tier 8 x 16 x 8 fabric (1,024 GPUs) 27,261.
MAX_ENUMERATED = 200_000
MAX_RELAYS = 1  # SyCCL's bounded relays: one relay hop, before any spread
# Parts a virtual split cuts a switch into (64 -> 4 x 4 x 4 at most 3): each part is a stage
# and a step of latency; 3 parts bring every preset's switches within 16 peers.
MAX_PARTS = 3
FILTERS = ("isomorphism", "consistency", "relays", "peers")


@dataclass(frozen=True, slots=True)
class Stage:
    dim: int
    kind: str  # "relay" | "spread"
    offset: int = 0  # relay only
    # Spread over a virtual sub-group: to the GPUs j * stride away, 0 < j < span (0: the whole
    # dimension). The stride is the product of the spans before it on the dimension, so the
    # acting positions stay consecutive and every GPU is reached once.
    span: int = 0
    stride: int = 1

    def label(self, dims: list[Dimension]) -> str:
        name = dims[self.dim].name
        if self.kind == "relay":
            return f"relay:{name}+{self.offset}"
        return f"spread:{name}" + (f"/{self.span}@{self.stride}" if self.span else "")

    def key(self) -> tuple[int, int, int, int]:
        """Total order used to pick the canonical sequence of an isomorphism class."""
        return (self.dim, 0 if self.kind == "relay" else 1, self.offset, self.span)

    def targets(self, size: int) -> tuple[int, ...]:
        """Positions a spread sends to, relative to its acting source."""
        if not self.span:
            return tuple(range(1, size))
        return tuple(j * self.stride % size for j in range(1, self.span))


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

    def split(self, dims: list[Dimension]) -> tuple[tuple[int, ...], ...]:
        """Spans of its spreads per dimension: sketches of one split use the same peer offsets,
        so only they mix within a budget that one of them fills."""
        return tuple(tuple(s.span or d.size for s in self.stages if s.dim == i and s.kind == "spread")
                     for i, d in enumerate(dims))  # fmt: skip

    def copies(self, dims: list[Dimension]) -> list[Sketch]:
        """The isomorphic sketches pruning 1 folded into this one (combination re-expands them)."""
        r = self.relay
        if r is None:
            return [self]
        dim = dims[r.dim]
        if dim.kind == "ring" and dim.size > 3:
            offs = sorted({r.offset, (-r.offset) % dim.size})
        else:
            offs = list(range(1, dim.size))
        return [Sketch((Stage(r.dim, "relay", o), *self.stages[1:])) for o in offs]


@dataclass(frozen=True, slots=True)
class SearchStats:
    """Stage sequences generated and surviving each pruning, in order (all counted)."""

    enumerated: int
    after_isomorphism: int
    after_consistency: int
    after_relay_bound: int
    kept: int  # complete sequences after all filters: the sketches
    truncated: bool  # the search stopped at its work limit
    limit: int
    # Sequences each filter removed, when `search(..., trace=True)` (tests, debugging).
    removed: dict[str, list[tuple[tuple[Stage, ...], int, int]]] = field(default_factory=dict)
    after_peer_bound: int | None = None  # with `max_peers`
    max_peers: int | None = None
    split: tuple[str, ...] = ()  # dimensions cut into virtual sub-groups (none fit unsplit)

    def line(self) -> str:
        more = f" (stopped at the limit of {self.limit})" if self.truncated else ""
        peers = ("" if self.max_peers is None else
                 f" -> {self.after_peer_bound} within {self.max_peers} peers")  # fmt: skip
        split = (f" (no unsplit sketch fits: virtual splits of {', '.join(self.split)})"
                 if self.split else "")  # fmt: skip
        return (f"sketch search{split}: {self.enumerated} stage sequences enumerated{more} -> "
                f"{self.after_isomorphism} after isomorphism -> {self.after_consistency} after "
                f"forced consistency -> {self.after_relay_bound} after bounded relays{peers}; "
                f"{self.kept} complete sketches")  # fmt: skip


def _signature(d: Dimension) -> tuple[object, ...]:
    return (d.kind, d.size, d.bandwidth_gbps, d.latency_us)


def _reflectable(d: Dimension) -> bool:
    """A ring's only automorphisms fixing a node are the identity and the reflection; a ring
    of at most 3 GPUs (and a switch or full mesh) allows every permutation fixing the root."""
    return d.kind == "ring" and d.size > 3


def _relabel(stages: tuple[Stage, ...], dims: list[Dimension], perm: tuple[int, ...],
             flips: tuple[bool, ...]) -> tuple[Stage, ...]:  # fmt: skip
    """`stages` mapped by a dimension permutation and per-dimension position maps fixing 0.

    A relay moves the acting position of its dimension; in a ring the positions are reflected
    when `flips` says so, elsewhere they are renamed in order of first appearance (the canonical
    representative under every permutation fixing 0)."""
    pos = [0] * len(dims)
    names: list[dict[int, int]] = [{0: 0} for _ in dims]
    out = []
    for st in stages:
        d = st.dim
        if st.kind == "spread":
            out.append(Stage(perm[d], "spread", span=st.span, stride=st.stride))
            continue
        g = dims[d].size
        old, new = pos[d], (pos[d] + st.offset) % g
        pos[d] = new
        if _reflectable(dims[d]):
            a, b = (-old % g, -new % g) if flips[d] else (old, new)
        else:
            for p in (old, new):
                names[d].setdefault(p, len(names[d]))
            a, b = names[d][old], names[d][new]
        out.append(Stage(perm[d], "relay", (b - a) % g))
    return tuple(out)


def _automorphisms(dims: list[Dimension]) -> list[tuple[tuple[int, ...], tuple[bool, ...]]]:
    """Dimension permutations among identical dimensions x ring reflections."""
    classes: dict[tuple[object, ...], list[int]] = {}
    for i, d in enumerate(dims):
        classes.setdefault(_signature(d), []).append(i)
    perms: list[tuple[int, ...]] = []
    for choice in itertools.product(*(itertools.permutations(c) for c in classes.values())):
        perm = list(range(len(dims)))
        for members, image in zip(classes.values(), choice, strict=True):
            for src, dst in zip(members, image, strict=True):
                perm[src] = dst
        perms.append(tuple(perm))
    rings = [i for i, d in enumerate(dims) if _reflectable(d)]
    flips = []
    for bits in itertools.product((False, True), repeat=len(rings)):
        f = [False] * len(dims)
        for i, b in zip(rings, bits, strict=True):
            f[i] = b
        flips.append(tuple(f))
    return [(p, f) for p in perms for f in flips]


def canonical(stages: tuple[Stage, ...], dims: list[Dimension],
              autos: list[tuple[tuple[int, ...], tuple[bool, ...]]] | None = None
              ) -> tuple[Stage, ...]:  # fmt: skip
    """The representative of `stages`' isomorphism class (pruning 1 keeps only it)."""
    autos = autos if autos is not None else _automorphisms(dims)
    return min((_relabel(stages, dims, p, f) for p, f in autos),
               key=lambda s: [st.key() for st in s])  # fmt: skip


def consistent(groups_taking_part: int, groups_holding: int) -> bool:
    """Pruning 2, forced consistency: every isomorphic group holding data runs the stage."""
    return groups_taking_part == groups_holding


def relays_bounded(stages: tuple[Stage, ...], max_relays: int = MAX_RELAYS) -> bool:
    """Pruning 3, bounded relays: at most `max_relays` relay hops, none after a spread."""
    relays = [i for i, s in enumerate(stages) if s.kind == "relay"]
    first_spread = next((i for i, s in enumerate(stages) if s.kind == "spread"), len(stages))
    return len(relays) <= max_relays and all(i < first_spread for i in relays)


def peers(stages: tuple[Stage, ...], dims: list[Dimension]) -> int:
    """Peer offsets (dimension, dst - src) a GPU sends to in the translated schedule: one
    threadblock each at least. Switch and full-mesh stages send direct; a ring stage uses its
    neighbours (a relay the direction of its shortest path)."""
    used: set[tuple[int, int]] = set()
    for st in stages:
        g = dims[st.dim].size
        ring = dims[st.dim].kind == "ring" and g > 2
        if st.kind == "relay":
            used.add((st.dim, (1 if st.offset <= g // 2 else g - 1) if ring else st.offset))
        elif ring:
            used.update({(st.dim, 1), (st.dim, g - 1)})
        else:
            used.update((st.dim, t) for t in st.targets(g))
    return len(used)


class _Fabric:
    """Ranks as coordinates (innermost dimension first), for holder sets."""

    def __init__(self, dims: list[Dimension]) -> None:
        self.sizes = [d.size for d in dims]
        self.strides = [1]
        for g in self.sizes[:-1]:
            self.strides.append(self.strides[-1] * g)
        self.n = self.strides[-1] * self.sizes[-1]

    def ranks(self, coords: list[tuple[int, ...]]) -> frozenset[int]:
        return frozenset(sum(c * s for c, s in zip(p, self.strides, strict=True))
                         for p in itertools.product(*coords))  # fmt: skip


@dataclass
class _Search:
    dims: list[Dimension]
    max_relays: int
    limit: int
    trace: bool
    autos: list[tuple[tuple[int, ...], tuple[bool, ...]]]
    fab: _Fabric
    max_peers: int | None = None
    split: frozenset[int] = frozenset()  # dimensions cut into virtual sub-groups
    # With splits: the spans per dimension allowed (`coarsest_splits`); no relays then.
    plans: tuple[tuple[tuple[int, ...], ...], ...] = ()
    counts: list[int] = field(default_factory=lambda: [0, 0, 0, 0, 0])
    removed: dict[str, list[tuple[tuple[Stage, ...], int, int]]] = field(default_factory=dict)
    found: list[Sketch] = field(default_factory=list)
    truncated: bool = False
    chosen: tuple[tuple[int, ...], ...] = ()

    def spreads(self, d: int, acting: tuple[int, ...], parts: int) -> list[Stage]:
        """Spread stages over dimension d from `acting` positions after `parts` spreads of it:
        the whole dimension; on a split dimension, every sub-group whose span divides what is
        left (the last allowed part takes all of it). Strides other than the spans before it
        give the same sketch up to a permutation of the switch's positions (isomorphism), so
        they are not generated."""
        g = self.dims[d].size
        if d not in self.split:
            return [Stage(d, "spread")] if parts == 0 else []
        # Spans the allowed splits put next on d, given the spans already chosen on every
        # dimension (`self.chosen`).
        spans = sorted({plan[d][parts] for plan in self.plans
                        if len(plan[d]) > parts
                        and all(plan[e][:len(c)] == c for e, c in enumerate(self.chosen))})  # fmt: skip
        return [Stage(d, "spread") if a == g else Stage(d, "spread", span=a, stride=len(acting))
                for a in spans]  # fmt: skip

    def children(
        self,
        acting: tuple[tuple[int, ...], ...],
        holders: frozenset[int],
        parts: tuple[int, ...],
    ) -> Iterator[tuple[Stage, tuple[tuple[int, ...], ...], frozenset[int], int]]:
        """(stage, acting positions after it, holders after it, groups holding acting sources)
        of every stage that brings the data to at least one GPU lacking it."""
        for d, dim in enumerate(self.dims):
            if dim.size == 1:
                continue
            groups = 1
            for e, pos in enumerate(acting):
                groups *= len(pos) if e != d else 1
            kinds = self.spreads(d, acting[d], parts[d])
            if not self.split:  # a split search has no relays (`search`)
                kinds += [Stage(d, "relay", o) for o in range(1, dim.size)]
            for st in kinds:
                if st.kind == "spread" and not st.span:
                    after = tuple(tuple(range(dim.size)) if e == d else p
                                  for e, p in enumerate(acting))  # fmt: skip
                elif st.kind == "spread":
                    ext = sorted({(x + j * st.stride) % dim.size for x in acting[d]
                                  for j in range(st.span)})  # fmt: skip
                    after = tuple(tuple(ext) if e == d else p for e, p in enumerate(acting))
                else:
                    after = tuple(tuple(sorted((x + st.offset) % dim.size for x in p)) if e == d
                                  else p for e, p in enumerate(acting))  # fmt: skip
                reached = self.fab.ranks(list(after))
                if not reached <= holders:
                    yield st, after, holders | reached, groups

    def run(
        self,
        stages: tuple[Stage, ...],
        acting: tuple[tuple[int, ...], ...],
        holders: frozenset[int],
        depth: int,
    ) -> None:
        self.chosen = tuple(tuple(s.span or self.dims[d].size for s in stages
                                  if s.dim == d and s.kind == "spread")
                            for d in range(len(self.dims)))  # fmt: skip
        parts = tuple(len(c) for c in self.chosen)
        for st, after, held, groups in list(self.children(acting, holders, parts)):
            seq = (*stages, st)
            iso = canonical(seq, self.dims, self.autos) == seq
            fits = self.max_peers is None or peers(seq, self.dims) <= self.max_peers
            for k in range(groups, 0, -1):  # every holder group takes part first, then fewer
                if self.counts[0] >= self.limit:
                    self.truncated = True
                    return
                self.counts[0] += 1
                # SyCCL's three prunings in the paper's order; the first that fails removes it.
                verdicts = (iso, consistent(k, groups), relays_bounded(seq, self.max_relays),
                            fits)  # fmt: skip
                passed = next((i for i, ok in enumerate(verdicts) if not ok), len(FILTERS))
                for i in range(passed):
                    self.counts[i + 1] += 1
                if passed < len(FILTERS):
                    if self.trace:
                        self.removed.setdefault(FILTERS[passed], []).append((seq, k, groups))
                    continue
                if len(held) == self.fab.n:
                    self.found.append(Sketch(seq))
                elif depth > 1:
                    self.run(seq, after, held, depth - 1)


def search(dims: list[Dimension], *, relays: bool = True, max_relays: int = MAX_RELAYS,
           limit: int = MAX_ENUMERATED, max_peers: int | None = None,
           trace: bool = False, leaner: bool = False) -> tuple[list[Sketch], SearchStats]:  # fmt: skip
    """Enumerate stage sequences, filter them by the prunings, return the sketches.

    `relays=False` (collectives where every GPU is a root anyway) sets the relay bound to 0.
    `max_peers` (the SM budget in threadblocks per GPU) adds the fourth filter; when no unsplit
    sketch passes it, the search runs again with every switch dimension of more than 2 GPUs
    open to virtual splits, and that run's counts are the ones returned. When nothing fits
    even then, the unsplit search without the peer bound is returned. `leaner`: the split run
    also allows `leaner_splits` (more sketches: the engine takes them apart)."""
    active = [d for d in dims if d.size > 1]
    bound = max_relays if relays else 0
    if not active:
        return [Sketch(())], SearchStats(0, 0, 0, 0, 1, False, limit)
    found, stats = _run(dims, bound, limit, max_peers, trace, frozenset())
    splittable = frozenset(i for i, d in enumerate(dims) if d.kind == "switch" and d.size > 2)
    if not found and max_peers is not None and splittable:
        # Without relays: each costs a peer, and the splits' extra stages already spread the
        # ports' load; with them the enumeration grows 60-fold on h800-rail-512.
        found, stats = _run(dims, 0, limit, max_peers, trace, splittable, leaner)
    if not found and max_peers is not None:
        # Nothing fits even split: the unsplit sketches, so that the caller can say how many
        # threadblocks the leanest of them needs.
        found, stats = _run(dims, bound, limit, None, trace, frozenset())
    return found, stats


def _factorizations(g: int, parts: int) -> list[tuple[int, ...]]:
    """Ordered factorizations of g into at most `parts` factors >= 2."""
    out: list[tuple[int, ...]] = [(g,)]
    if parts > 1:
        for a in range(2, g):
            if g % a == 0:
                out += [(a, *rest) for rest in _factorizations(g // a, parts - 1)]
    return out


def _split_peers(spans: tuple[int, ...]) -> int:
    return sum(a - 1 for a in spans)


def coarsest_splits(dims: list[Dimension], split: frozenset[int],
                    max_peers: int) -> list[tuple[tuple[int, ...], ...]]:  # fmt: skip
    """Spans per dimension (a dimension not split: its size) whose spreads fit `max_peers`
    and where no coarser split does: merging two parts of one dimension would also fit.

    A coarser split has the same port load in one stage less, so the finer one is only kept
    when the budget forbids the coarser one. E.g. h800-rail-512 at 16: nvswitch 8 with rail
    4 x 4 x 4 (7 + 9 peers), and nvswitch 2 x 4 or 4 x 2 with rail 2 x 4 x 8 in any order.
    `search(leaner=True)` adds `leaner_splits` to them."""
    options = [_factorizations(d.size, MAX_PARTS) if i in split else [(d.size,)]
               for i, d in enumerate(dims)]  # fmt: skip
    fits = [p for p in itertools.product(*options)
            if sum(_split_peers(f) for f in p) <= max_peers]  # fmt: skip
    fitting = set(fits)

    def merges(f: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        for i, j in itertools.combinations(range(len(f)), 2):
            rest = [a for k, a in enumerate(f) if k not in (i, j)]
            for at in range(len(rest) + 1):
                yield (*rest[:at], f[i] * f[j], *rest[at:])

    return [p for p in fits
            if not any((*p[:d], m, *p[d + 1:]) in fitting
                       for d in range(len(p)) for m in merges(p[d]))]  # fmt: skip


def leaner_splits(
    dims: list[Dimension], split: frozenset[int], coarsest: list[tuple[tuple[int, ...], ...]]
) -> list[tuple[tuple[int, ...], ...]]:
    """Each coarsest split with its outermost split dimension, where still whole, cut in two
    (smallest factor, both orders): a peer or more fewer for a stage more.

    The coarsest rule counts port load, not the executor's steps: an AllReduce holds two
    streams per peer, and over the SM budget pairs a light stream with a heavy one past its
    64 steps where one peer fewer leaves enough light streams to pair among themselves (the
    3-tier fabric: 10 peers need 8 pairs of 20 streams, 9 peers 6 of 18). The outermost
    dimension, because sketches spread it first, on one chunk per root: its extra stage
    moves the least (docs/synthesis.md, "The 3-tier fabric (session 7)")."""
    d = max(split, default=-1)
    if d < 0:
        return []
    g = dims[d].size
    a = next((f for f in range(2, g) if g % f == 0), g)
    if a == g:  # prime: no cut
        return []
    out: list[tuple[tuple[int, ...], ...]] = []
    for p in coarsest:
        if len(p[d]) != 1:
            continue
        for cut in dict.fromkeys(((a, g // a), (g // a, a))):
            q = (*p[:d], cut, *p[d + 1 :])
            if q not in coarsest and q not in out:
                out.append(q)
    return out


def _run(dims: list[Dimension], bound: int, limit: int, max_peers: int | None, trace: bool,
         split: frozenset[int], leaner: bool = False) -> tuple[list[Sketch], SearchStats]:  # fmt: skip
    s = _Search(dims, bound, limit, trace, _automorphisms(dims), _Fabric(dims), max_peers, split)
    if split and max_peers is not None:
        coarsest = coarsest_splits(dims, split, max_peers)
        s.plans = tuple(coarsest + (leaner_splits(dims, split, coarsest) if leaner else []))
    root = tuple((0,) for _ in dims)
    depth = sum(1 + (MAX_PARTS if i in split else 1) for i, d in enumerate(dims) if d.size > 1)
    s.run((), root, s.fab.ranks(list(root)), depth)
    # Fewest relays first, then the stage order (the order combination ranks ties in).
    found = sorted(s.found, key=lambda k: (sum(x.kind == "relay" for x in k.stages),
                                           [x.key() for x in k.stages]))  # fmt: skip
    stats = SearchStats(s.counts[0], s.counts[1], s.counts[2], s.counts[3], len(found),
                        s.truncated, limit, s.removed,
                        s.counts[4] if max_peers is not None else None, max_peers,
                        tuple(dims[i].name for i in sorted(split)))  # fmt: skip
    return found, stats
