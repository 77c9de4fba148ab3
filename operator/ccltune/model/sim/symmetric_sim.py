"""Simulating a collectively symmetric schedule through one representative of each orbit.

ccltune's synthesized AllGather, ReduceScatter, AllReduce and AlltoAll are N translates of one
root's transfers on a fabric whose translations are automorphisms. Under the simulator's model
every translate then runs identically (images of a transfer start and finish together), so one
root's transfers suffice, provided each link is replaced by its orbit: the |O| links of an orbit
carry N/|O| images of every representative flow crossing O, which is exactly one resource of
capacity c*|O|/N shared by those representative flows. The result equals the full simulation
(tested) at a fraction 1/N of the events.

Every premise is checked on the arrays and the routes, never assumed: the block layout, deps that
translate, routes that commute with the translations (ECMP hashing may break this), equal
capacities within an orbit and equal latencies within a pair orbit. When one fails,
`prepare_symmetric` returns the reason and the caller simulates in full.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...api.cluster import ClusterTopology
from ..cost.protocols import ProtocolCost
from ..schedule.ir import ScheduleArrays
from .arrays import sorted_unique
from .routing import Router
from .translations import Translations


@dataclass(slots=True)
class Quotient:
    """Representative transfers, what each full transfer maps to, and orbit resources."""

    reps: np.ndarray  # full index of each representative
    rep_of: np.ndarray  # per full transfer: its representative's position in `reps`
    dep_ptr: np.ndarray  # deps between representatives (CSR)
    dep_idx: np.ndarray
    dep_same_dst: np.ndarray  # per dep: into the owner's destination (no alpha, simulate.py)
    res: np.ndarray  # [width, len(reps)] orbit resource ids, padded with `pad`
    cap: np.ndarray  # payload bytes/us per resource (inf for the pad)
    pad: int
    alpha_path: np.ndarray  # per representative: path latency (us)


def _layout(s: ScheduleArrays, grp: Translations) -> tuple[np.ndarray, np.ndarray] | str:
    """(rep position, group element) per transfer for a layout of segments x N blocks."""
    n, big_n = len(s), grp.n
    for segs in (1, 2, 3):
        if n % (segs * big_n):
            continue
        t = n // (segs * big_n)
        idx = np.arange(n)
        seg, block, j = idx // (big_n * t), (idx // t) % big_n, idx % t
        base = seg * big_n * t + j
        elem = grp.sub(s.src[seg * big_n * t + block * t].astype(np.int64),
                       s.src[seg * big_n * t].astype(np.int64))  # fmt: skip
        per_block = elem.reshape(segs, big_n, t)[:, :, 0]
        if any(len(sorted_unique(row)) != big_n for row in per_block):
            continue
        src0, dst0 = s.src[base].astype(np.int64), s.dst[base].astype(np.int64)
        if not (
            np.array_equal(grp.add(src0, elem), s.src)
            and np.array_equal(grp.add(dst0, elem), s.dst)
            and np.array_equal(s.count[base], s.count)
            and np.array_equal(s.channel[base], s.channel)
            and np.array_equal(s.reduce[base], s.reduce)
        ):
            continue
        return seg * t + j, elem
    return "transfers are not N translates of one root's transfers"


def _quotient_deps(
    s: ScheduleArrays, rep: np.ndarray, elem: np.ndarray, nrep: int, grp: Translations
) -> tuple[np.ndarray, np.ndarray] | str:
    n = len(s)
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(s.dep_ptr))
    edges = sorted_unique(owner * n + s.dep_idx)  # one edge per (transfer, dep)
    owner, dep = edges // n, edges % n
    # Deps translate iff every transfer's deps, each seen from it as (representative, relative
    # translation), are those of its representative's untranslated transfer (elem 0). Rows are
    # compared sorted; the keys are nearly in order already, so the stable sort is cheap.
    base = np.empty(nrep, dtype=np.int64)
    at_zero = np.flatnonzero(elem == 0)
    base[rep[at_zero]] = at_zero
    ndeps = np.bincount(owner, minlength=n)
    mirror = base[rep]
    if not np.array_equal(ndeps, ndeps[mirror]):
        return "dependencies do not translate with the transfers"
    span = nrep * grp.n
    desc = np.sort(owner * span + rep[dep] * grp.n + grp.sub(elem[dep], elem[owner]),
                   kind="stable") % span  # fmt: skip
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(ndeps, out=ptr[1:])
    at_mirror = ptr[mirror[owner]] + np.arange(len(owner), dtype=np.int64) - ptr[owner]
    if not np.array_equal(desc, desc[at_mirror]):
        return "dependencies do not translate with the transfers"
    return owner, dep


def _generator_map(
    ukeys: np.ndarray, off: np.ndarray, chans: np.ndarray, lat: np.ndarray, grp: Translations,
    step: np.ndarray,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Channel -> channel under translation by `step`, if routes commute with it."""
    usrc, udst = ukeys // grp.n, ukeys % grp.n
    one = np.full_like(usrc, grp.rank(step))
    img = grp.add(usrc, one) * grp.n + grp.add(udst, one)
    pos = np.minimum(np.searchsorted(ukeys, img), len(ukeys) - 1)
    plen = np.diff(off)
    if not np.array_equal(ukeys[pos], img) or not np.array_equal(plen[pos], plen):
        return None
    if not np.allclose(lat[pos], lat, rtol=1e-9):
        return None
    to = chans[np.repeat(off[pos], plen) + np.arange(len(chans)) - np.repeat(off[:-1], plen)]
    order = np.argsort(chans, kind="stable")
    fs, ts = chans[order], to[order]
    first = np.concatenate([[True], fs[1:] != fs[:-1]])
    group_of = np.cumsum(first) - 1
    if not np.array_equal(ts, ts[first][group_of]):
        return None
    return fs[first], ts[first]


def _channel_orbits(
    s: ScheduleArrays, router: Router, grp: Translations
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Steps of the largest translation subgroup H the routes commute with, and for every pair
    the schedule uses: its key, path CSR, latency; channel orbit ids under H (-1 untouched)."""
    pairs = s.src.astype(np.int64) * grp.n + s.dst
    if grp.n <= 4096:  # a count per (src, dst) beats sorting millions of transfers
        ukeys = np.flatnonzero(np.bincount(pairs, minlength=grp.n * grp.n))
    else:
        ukeys = sorted_unique(pairs)
    off, chans, lat = router.paths_csr(
        zip((ukeys // grp.n).tolist(), (ukeys % grp.n).tolist(), strict=True)
    )
    parent = np.arange(router.nchannels)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = int(parent[x])
        return x

    steps = np.ones(len(grp.sizes), dtype=np.int64)
    for d, size in enumerate(grp.sizes.tolist()):
        for m in (m for m in range(1, size + 1) if size % m == 0):
            step = np.zeros(len(grp.sizes), dtype=np.int64)
            step[d] = m % size
            got = _generator_map(ukeys, off, chans, lat, grp, step) if m < size else None
            if got is not None or m == size:
                steps[d] = m
                break
        if got is None:
            continue
        for a, b in zip(got[0].tolist(), got[1].tolist(), strict=True):
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[ra] = rb
    touched = sorted_unique(chans)
    orbit = np.full(router.nchannels, -1, dtype=np.int64)
    roots = np.array([find(int(c)) for c in touched.tolist()], dtype=np.int64)
    _, orbit[touched] = np.unique(roots, return_inverse=True)
    return steps, ukeys, off, chans, lat, orbit


@dataclass(slots=True)
class _Structure:
    """What does not depend on the protocol: computed once per (schedule, router)."""

    reps: np.ndarray
    rep_of: np.ndarray
    dep_ptr: np.ndarray
    dep_idx: np.ndarray
    dep_same_dst: np.ndarray
    links: np.ndarray  # [width, len(reps)] orbit ids, padded with norb
    orbit_cap: np.ndarray  # GB/s of one orbit resource: link capacity * |O| / |H|
    tb: np.ndarray  # per representative: its threadblock class
    lat: np.ndarray


_CACHE: dict[tuple[int, int], tuple[ScheduleArrays, Router, _Structure | str]] = {}
# Synthesis evaluates up to ~5 finalists at every size in turn: keep them all. The schedules
# are held by the caller anyway; an entry adds ~8 bytes per transfer (rep_of).
_CACHE_MAX = 8


def prepare_symmetric(
    s: ScheduleArrays, topo: ClusterTopology, router: Router, protocol: ProtocolCost
) -> Quotient | str:
    """The quotient of `s` under the fabric's translations, or why it does not apply."""
    key = (id(s), id(router))
    hit = _CACHE.get(key)
    if hit is None or hit[0] is not s or hit[1] is not router:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        hit = (s, router, _structure(s, topo, router))
        _CACHE[key] = hit
    st = hit[2]
    if isinstance(st, str):
        return st
    norb = len(st.orbit_cap)
    cap = st.orbit_cap * protocol.efficiency * 1e3
    tb_cap = protocol.channel_cap_gbps
    extra = 0 if tb_cap is None else int(st.tb.max()) + 1
    pad = norb + extra
    res = np.where(st.links == norb, pad, st.links).astype(np.int32)
    if tb_cap is not None:
        # A threadblock (src, dst, channel) hosts the images under H of the representatives of
        # its class; its cap is not scaled.
        cap = np.concatenate([cap, np.full(extra, tb_cap * 1e3)])
        res = np.concatenate([res, (norb + st.tb)[None, :].astype(np.int32)])
    return Quotient(st.reps, st.rep_of, st.dep_ptr, st.dep_idx, st.dep_same_dst, res,
                    np.concatenate([cap, [np.inf]]), pad, st.lat)  # fmt: skip


def _structure(s: ScheduleArrays, topo: ClusterTopology, router: Router) -> _Structure | str:
    if topo.dimensions is None:
        return "the fabric is not symmetric"
    grp = Translations([d.size for d in topo.dimensions])
    if grp.n != s.nranks or grp.n != router.nranks or len(s) == 0:
        return "the schedule does not span the whole fabric"
    if len(s.dep_idx) and ((s.dep_idx < 0) | (s.dep_idx >= len(s))).any():
        return "a dependency does not exist"
    if ((s.src < 0) | (s.src >= grp.n) | (s.dst < 0) | (s.dst >= grp.n) | (s.src == s.dst)).any():
        return "a transfer has an invalid rank"
    got = _layout(s, grp)
    if isinstance(got, str):
        return got
    rep, elem = got
    nrep = len(s) // grp.n
    deps = _quotient_deps(s, rep, elem, nrep, grp)
    if isinstance(deps, str):
        return deps
    steps, ukeys, off, chans, lat, orbit = _channel_orbits(s, router, grp)
    h_size = int(np.prod(grp.sizes // steps))
    if h_size == 1:
        return "routes commute with no translation of the fabric"
    # Transfers are represented per coset of H: elem = h + c with c's coordinates below steps.
    ec = grp.coords(elem)
    coset = (ec % steps * np.concatenate([[1], np.cumprod(steps)[:-1]])).sum(axis=-1)
    ncos = int(np.prod(steps))
    qrep = rep * ncos + coset
    is_rep = np.asarray((ec < steps).all(axis=-1))  # h = 0
    owner, dep = deps
    mine = is_rep[owner]
    m = nrep * ncos
    q, inv = np.unique(qrep[owner[mine]] * m + qrep[dep[mine]], return_inverse=True)
    q_owner, q_dep = q // m, q % m
    # Images of one dep finish together, so a merged edge pays alpha if any of its own does.
    pays = np.zeros(len(q), dtype=bool)
    np.logical_or.at(pays, inv, (s.dst[owner] != s.dst[dep])[mine])
    dep_ptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(q_owner, minlength=m), out=dep_ptr[1:])

    norb = int(orbit.max()) + 1
    size = np.bincount(orbit[orbit >= 0], minlength=norb)
    if (h_size % size).any():
        return "an orbit's size does not divide the subgroup's order"
    used = orbit >= 0
    ocap_min = np.full(norb, np.inf)
    ocap_max = np.zeros(norb)
    np.minimum.at(ocap_min, orbit[used], router.capacity[used])
    np.maximum.at(ocap_max, orbit[used], router.capacity[used])
    if not np.allclose(ocap_min, ocap_max, rtol=1e-9):
        return "links of one orbit differ in capacity"
    reps = np.flatnonzero(is_rep)
    reps = reps[np.argsort(qrep[reps])]
    pidx = np.searchsorted(ukeys, s.src[reps].astype(np.int64) * grp.n + s.dst[reps])
    plen = np.diff(off)
    width = int(plen[pidx].max())
    links = np.full((width, len(reps)), norb, dtype=np.int32)
    for k in range(width):
        has = plen[pidx] > k
        links[k, has] = orbit[chans[off[pidx[has]] + k]]
    # Threadblock class: (src's coset, dst moved by the same h, channel) is H-invariant.
    src = s.src[reps].astype(np.int64)
    sc = grp.coords(src)
    h = grp.rank(sc - sc % steps)
    tb_key = (grp.rank(sc % steps) * grp.n + grp.sub(s.dst[reps].astype(np.int64), h)) * (
        int(s.channel.max()) + 1) + s.channel[reps]
    _, tb = np.unique(tb_key, return_inverse=True)
    return _Structure(reps, qrep, dep_ptr, q_dep, ~pays, links, ocap_min * size / h_size, tb, lat[pidx])
