"""Simulating a collectively symmetric schedule through one representative of each orbit.

ccltune's synthesized AllGather, ReduceScatter, AllReduce and AlltoAll are N translates of one
root's transfers on a fabric whose translations are automorphisms. Under the simulator's model
every translate then runs identically (images of a transfer start and finish together), so one
root's transfers suffice, provided each link is replaced by its orbit: the |O| links of an orbit
carry N/|O| images of every representative flow crossing O, which is exactly one resource of
capacity c*|O|/N shared by those representative flows. The result equals the full simulation
(tested) at a fraction 1/N of the events.

A schedule symmetric under a subgroup K only (NCCL's ring across nodes: the node shifts, every
node running the same intra-node layout) is read the same way with one block of ranks' transfers
per orbit: K is tried among the translations of the outer dimensions, largest first.

Every premise is checked on the arrays and the routes, never assumed: the block layout, deps that
translate, routes that commute with the translations (ECMP hashing may break this), equal
capacities within an orbit and equal latencies within a pair orbit. When one fails,
`prepare_symmetric` returns the reason and the caller simulates in full.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import numpy as np

from ...api.cluster import ClusterTopology
from ...api.common import Collective
from ..cost.protocols import ProtocolCost
from ..schedule.ir import ScheduleArrays
from .arrays import sorted_unique
from .capacity import nvlink_channels, threadblock_ports
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
    msg_us: np.ndarray  # per representative: transport cost per network message (routing.py)
    images: int  # |H|: transfers per representative (nranks: every rank alike)
    rank_class: np.ndarray  # per rank: its orbit under H (ranks of one orbit finish together)


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
            and (s.tb is None or np.array_equal(s.tb[base], s.tb))
            and np.array_equal(s.reduce[base], s.reduce)
        ):
            continue
        return seg * t + j, elem
    return "transfers are not N translates of one root's transfers"


def _translate_major(
    s: ScheduleArrays, grp: Translations
) -> tuple[np.ndarray, np.ndarray | None] | None:
    """An order of the transfers as N translates of rank 0's sends (None: none exists): each
    rank's sends grouped by what a translation keeps (peer offset, count, channel, reduce), in
    their own order within a group; and threadblock labels for it (`_translated_labels`). The
    caller re-checks every premise on the result."""
    n, big_n = len(s), grp.n
    if n % big_n:
        return None
    src = s.src.astype(np.int64)
    if (np.bincount(src, minlength=big_n) != n // big_n).any():
        return None
    for place in (_chunk_place(s, grp, src), _run_place(s, grp, src)):
        if place is None:
            return None
        # Row ids in the rows' lexicographic order (as np.unique(axis=0) numbers them, 10x
        # faster).
        fid = _row_ids([grp.sub(s.dst.astype(np.int64), src), s.count, s.channel, s.reduce,
                        *place])  # fmt: skip
        order = np.lexsort((np.arange(n), fid, src))
        rows = fid[order].reshape(big_n, -1)
        if (rows == rows[0]).all():
            break
    else:
        return None
    if s.tb is None:
        return order, None
    labels = _translated_labels(s, order, big_n)
    return None if labels is None else (order, labels)


def _translated_labels(s: ScheduleArrays, order: np.ndarray, big_n: int) -> np.ndarray | None:
    """[2, n] labels of each transfer's sending and receiving threadblock side, indexed as `s`,
    equal across translates and naming the same sides as `s.tb` (capacity.threadblock_ports) up
    to renaming; None if there are none such. Ids are per file, not translates of each other: a
    transfer takes its rank-0 counterpart's id. A local operation (src == dst) shares a side
    with the transfers whose id it carries where their end is on its GPU (slicing._sides: its
    threadblock's receive side, else its send side) and takes their label there; its other
    sides are its own, labelled past every transfer's."""
    assert s.tb is not None
    tb = s.tb[order].astype(np.int64)
    if tb.min(initial=0) < 0:
        return None
    label = np.tile(tb.reshape(big_n, -1)[0], big_n)
    src, dst = s.src[order].astype(np.int64), s.dst[order].astype(np.int64)
    sent = src != dst
    ids = int(tb.max(initial=0)) + 1
    of_id, src_of, dst_of = (np.full(ids, -1, dtype=np.int64) for _ in range(3))
    of_id[tb[sent]], src_of[tb[sent]], dst_of[tb[sent]] = label[sent], src[sent], dst[sent]
    if not (np.array_equal(of_id[tb[sent]], label[sent]) and np.array_equal(src_of[tb[sent]],
            src[sent]) and np.array_equal(dst_of[tb[sent]], dst[sent])):  # fmt: skip
        return None  # one id on transfers of two labels or two connections
    own = label + int(label.max(initial=0)) + 1
    sides = np.stack([np.where(sent | (src_of[tb] == src), of_id[tb], own),
                      np.where(sent | (dst_of[tb] == dst), of_id[tb], own)])  # fmt: skip
    rows = sides.reshape(2, big_n, -1)
    if not (rows == rows[:, :1]).all():
        return None
    out = np.empty_like(sides)
    out[:, order] = sides
    was = threadblock_ports(s).astype(np.int64)
    span = int(out.max()) + 1
    src0, dst0 = s.src.astype(np.int64), s.dst.astype(np.int64)
    now = np.unique(np.concatenate([src0 * span + out[0], (s.nranks + dst0) * span + out[1]]),
                    return_inverse=True)[1].reshape(-1)  # fmt: skip
    pairs = was.ravel() * (int(now.max()) + 1) + now
    if not int(was.max()) == int(now.max()) == len(np.unique(pairs)) - 1:
        return None  # sides merged or split
    return out


def _chunk_place(s: ScheduleArrays, grp: Translations, src: np.ndarray) -> list[np.ndarray]:
    """What a translation keeps of each transfer's chunk (ir.py's chunk spaces): the ranks it
    belongs to, relative to the sender, and its index within theirs."""
    c, n = s.chunk.astype(np.int64), grp.n
    if s.collective == Collective.ALLTOALL:
        per = s.chunks_per_rank
        pair, j = c // per, c % per
        return [grp.sub(pair // n, src), grp.sub(pair % n, src), j]
    if s.collective in (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE):
        per = s.total_chunks // n  # allreduce: the buffer's N parts (synth/assemble.allreduce)
        if per >= 1 and s.total_chunks % n == 0:
            return [grp.sub(c // per, src), c % per]
    return [c]


def _run_place(s: ScheduleArrays, grp: Translations, src: np.ndarray) -> list[np.ndarray] | None:
    """The second try for transfers of several ranks' chunks (assemble.allgather_bundled, a run
    of an aligned block: its first owner is not a translate of another GPU's first owner): the
    run's owners relative to the sender, told by the least and greatest. None: no such runs
    (every count one, or counts that are not chunks of the collective's space: a read-back's
    are in slices)."""
    if s.collective not in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        return None
    c, count, per = s.chunk.astype(np.int64), s.count.astype(np.int64), s.chunks_per_rank
    if int(count.max(initial=1)) == 1 or (c + count > s.total_chunks).any():
        return None
    at = np.repeat(np.arange(len(c)), count)
    starts = np.cumsum(count) - count
    each = np.repeat(c - starts, count) + np.arange(int(count.sum()))
    rel = grp.sub(each // per, src[at]) * per + each % per
    return [np.minimum.reduceat(rel, starts), np.maximum.reduceat(rel, starts), c % per]


def _reordered_transfers(s: ScheduleArrays, perm: np.ndarray) -> ScheduleArrays:
    """What `_layout` reads of `s` with transfer k the old perm[k]; its deps are left as they
    are (not renumbered: not for use beyond `_layout`)."""
    return replace(s, src=s.src[perm], dst=s.dst[perm], count=s.count[perm],
                   reduce=s.reduce[perm], channel=s.channel[perm], tb=None)  # fmt: skip


# Deps checked at a time by `_quotient_deps`: its temporaries are a few int64 arrays of this
# many (a 512-rank ring file's two sliced iterations have 15M deps: checked at once, they took
# its row's peak past 3 GB; docs/synthesis-scale.md, "Session 10: the rail rings within 2 GB").
_DEP_BLOCK = 1 << 20


def _edges(s: ScheduleArrays, first: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """(owner, dep) of transfers first..stop-1's deps, one per distinct pair, sorted."""
    n, a, b = len(s), int(s.dep_ptr[first]), int(s.dep_ptr[stop])
    owner = np.repeat(np.arange(first, stop, dtype=np.int64), np.diff(s.dep_ptr[first : stop + 1]))
    edges = sorted_unique(owner * n + s.dep_idx[a:b])
    return edges // n, edges % n


def _edges_of(s: ScheduleArrays, owners: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_edges` of the transfers `owners` (ascending) only."""
    n = len(s)
    lens = s.dep_ptr[owners + 1] - s.dep_ptr[owners]
    at = np.repeat(s.dep_ptr[owners] - (np.cumsum(lens) - lens), lens) + np.arange(
        int(lens.sum()), dtype=np.int64)  # fmt: skip
    edges = sorted_unique(np.repeat(owners.astype(np.int64), lens) * n + s.dep_idx[at])
    return edges // n, edges % n


def _blocks(dep_ptr: np.ndarray, per: int) -> list[tuple[int, int]]:
    """Consecutive transfer ranges covering all, each of about `per` deps (at least one)."""
    n, out, a = len(dep_ptr) - 1, [], 0
    while a < n:
        b = int(np.searchsorted(dep_ptr, dep_ptr[a] + per, side="right")) - 1
        b = min(max(b, a + 1), n)
        out.append((a, b))
        a = b
    return out


def _quotient_deps(s: ScheduleArrays, rep: np.ndarray, elem: np.ndarray, nrep: int,
                   grp: Translations) -> str | None:  # fmt: skip
    """Why the deps do not translate with the transfers (None: they do). Deps translate iff
    every transfer's deps, each seen from it as (representative, relative translation), are
    those of its representative's untranslated transfer (elem 0). Rows are compared sorted;
    the keys are nearly in order already, so the stable sort is cheap. Checked in blocks of
    transfers against the untranslated ones' rows, so memory is of a block, not of all deps."""
    base = np.empty(nrep, dtype=np.int64)
    at_zero = np.flatnonzero(elem == 0)
    base[rep[at_zero]] = at_zero
    mirrors = sorted_unique(base)
    span = nrep * grp.n

    def rows(owner: np.ndarray, dep: np.ndarray, row: np.ndarray,
             nrows: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        # per row its count, and its descriptors sorted (row-major)
        desc = np.sort(row * span + rep[dep] * grp.n + grp.sub(elem[dep], elem[owner]),
                       kind="stable") % span  # fmt: skip
        return np.bincount(row, minlength=nrows), desc

    owner, dep = _edges_of(s, mirrors)
    m_count, m_desc = rows(owner, dep, np.searchsorted(mirrors, owner), len(mirrors))
    m_ptr = np.zeros(len(mirrors) + 1, dtype=np.int64)
    np.cumsum(m_count, out=m_ptr[1:])
    mirror_of = np.searchsorted(mirrors, base[rep])  # per transfer: its mirror's row
    for a, b in _blocks(s.dep_ptr, _DEP_BLOCK):
        owner, dep = _edges(s, a, b)
        count, desc = rows(owner, dep, owner - a, b - a)
        mine = mirror_of[a:b]
        if not np.array_equal(count, m_count[mine]):
            return "dependencies do not translate with the transfers"
        ptr = np.zeros(b - a + 1, dtype=np.int64)
        np.cumsum(count, out=ptr[1:])
        at = m_ptr[mine[owner - a]] + np.arange(len(owner), dtype=np.int64) - ptr[owner - a]
        if not np.array_equal(desc, m_desc[at]):
            return "dependencies do not translate with the transfers"
    return None


def _generator_map(
    ukeys: np.ndarray, off: np.ndarray, chans: np.ndarray, lat: np.ndarray, grp: Translations,
    step: np.ndarray, period: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Channel -> channel under translation by `step`, if routes commute with it.

    Route keys are (src * N + dst) * period + NIC slot; a translate keeps its slot (channel)."""
    upair, slot = ukeys // period, ukeys % period
    usrc, udst = upair // grp.n, upair % grp.n
    one = np.full_like(usrc, grp.rank(step))
    img = (grp.add(usrc, one) * grp.n + grp.add(udst, one)) * period + slot
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


def route_keys(s: ScheduleArrays, router: Router, n: int) -> np.ndarray:
    """Per transfer: (src * n + dst) * nic_period + NIC slot (routing.py: NCCL's NIC per channel)."""
    pairs = s.src.astype(np.int64) * n + s.dst
    return pairs * router.nic_period + router.nic_slots(s.src, s.dst, s.channel)


def _channel_orbits(
    s: ScheduleArrays, router: Router, grp: Translations, kstep: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Steps of the largest translation subgroup H of the schedule's K (steps `kstep`) the routes
    commute with, and for every pair the schedule uses: its key, path CSR, latency; channel orbit
    ids under H (-1 untouched)."""
    period = router.nic_period
    routes = route_keys(s, router, grp.n)
    span = grp.n * grp.n * period
    if span <= 4096 * 4096:  # a count per route beats sorting millions of transfers
        ukeys = np.flatnonzero(np.bincount(routes, minlength=span))
    else:
        ukeys = sorted_unique(routes)
    if len(ukeys) > _ORBITS_MAX_ROUTES:
        return _orbits_of(ukeys, router, grp, kstep)
    # What follows depends on the routes alone: a file timed at every size (a new sliced
    # schedule each time) and a variant's protocols use the same ones.
    key = (id(router), tuple(grp.sizes.tolist()), tuple(kstep.tolist()),
           hashlib.blake2b(ukeys.tobytes(), digest_size=16).digest())
    hit = _ORBITS.pop(key, None)
    if hit is None or hit[0] is not router or not np.array_equal(hit[1][1], ukeys):
        hit = (router, _orbits_of(ukeys, router, grp, kstep))
        while len(_ORBITS) >= _ORBITS_MAX:
            _ORBITS.pop(next(iter(_ORBITS)))
    _ORBITS[key] = hit  # the most recently used last
    return hit[1]


def _orbits_of(ukeys: np.ndarray, router: Router, grp: Translations, kstep: np.ndarray,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """`_channel_orbits` from the sorted distinct route keys."""
    period = router.nic_period
    upair = ukeys // period
    off, chans, lat = router.paths_csr(
        zip((upair // grp.n).tolist(), (upair % grp.n).tolist(), (ukeys % period).tolist(),
            strict=True)
    )  # fmt: skip
    parent = np.arange(router.nchannels)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = int(parent[x])
        return x

    steps = np.ones(len(grp.sizes), dtype=np.int64)
    for d, size in enumerate(grp.sizes.tolist()):
        base = int(kstep[d])
        for m in (m for m in range(base, size + 1, base) if size % m == 0):
            step = np.zeros(len(grp.sizes), dtype=np.int64)
            step[d] = m % size
            got = _generator_map(ukeys, off, chans, lat, grp, step, period) if m < size else None
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


_Orbits = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
# `_channel_orbits` per (router, group, K's steps, routes); read only. Only for route sets up
# to _ORBITS_MAX_ROUTES (a 64-rank schedule's have under 1,000), so entries stay small.
_ORBITS: dict[tuple[int, tuple[int, ...], tuple[int, ...], bytes], tuple[Router, _Orbits]] = {}
_ORBITS_MAX = 16
_ORBITS_MAX_ROUTES = 1 << 13


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
    orbit_nvlink: np.ndarray  # per orbit: are its links NVLink (simulate.link_capacity)
    tb: np.ndarray  # [2, reps]: sending and receiving threadblock class
    lat: np.ndarray
    msg_us: np.ndarray
    images: int
    rank_class: np.ndarray


_CACHE: dict[tuple[int, int], tuple[ScheduleArrays, Router, _Structure | str, int]] = {}
# Synthesis evaluates up to ~5 finalists at every size in turn: keep them all, least recently
# used out first. An entry holds its schedule (a file timed at a size is a new one each time),
# so entries are bounded by bytes too (the newest is kept whatever its size): a 512-rank ring
# file's two sliced iterations are ~140 MB (docs/synthesis-scale.md, "Session 10: the rail
# rings within 2 GB"); a 64-rank schedule's ~1 MB.
_CACHE_MAX = 8
CACHE_BYTES = 160 << 20


def _held_bytes(*objs: object) -> int:
    """Bytes of the arrays `objs` (schedules, structures) hold, each array once."""
    seen: dict[int, int] = {}
    for obj in objs:
        for name in getattr(obj, "__slots__", ()) or getattr(obj, "__dataclass_fields__", ()):
            a = getattr(obj, name, None)
            if isinstance(a, np.ndarray):
                seen[id(a)] = a.nbytes
    return sum(seen.values())


def forget(s: ScheduleArrays) -> None:
    """Drop `s`'s quotients: for a schedule made for one timing (a published file's at a size),
    never asked for again, which the cache would otherwise hold up to CACHE_BYTES."""
    for key in [k for k, h in _CACHE.items() if h[0] is s]:
        del _CACHE[key]


def prepare_symmetric(
    s: ScheduleArrays, topo: ClusterTopology, router: Router, protocol: ProtocolCost
) -> Quotient | str:
    """The quotient of `s` under the fabric's translations, or why it does not apply."""
    key = (id(s), id(router))
    hit = _CACHE.pop(key, None)
    if hit is None or hit[0] is not s or hit[1] is not router:
        st = _structure(s, topo, router)
        hit = (s, router, st, _held_bytes(s, st))
        while _CACHE and (len(_CACHE) >= _CACHE_MAX or
                          sum(h[3] for h in _CACHE.values()) + hit[3] > CACHE_BYTES):  # fmt: skip
            _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = hit  # the most recently used last
    st = hit[2]
    if isinstance(st, str):
        return st
    if protocol.tb_gbps is None and (s.src[st.reps] == s.dst[st.reps]).any():
        return "local work without threadblock physics"  # simulate.py charges it nothing
    norb = len(st.orbit_cap)
    cap = st.orbit_cap * protocol.efficiency * 1e3
    if protocol.nvlink_efficiency != 1.0:
        cap = np.where(st.orbit_nvlink, cap * protocol.nvlink_efficiency, cap)
    tb_cap = protocol.tb_gbps
    extra = 0 if tb_cap is None else int(st.tb.max()) + 1
    pad = norb + extra
    res = np.where(st.links == norb, pad, st.links).astype(np.int32)
    if tb_cap is not None:
        # A threadblock side (rank, tb) and its images under H form an orbit of |H| sides, each
        # carrying one image of every representative of its class: its cap is not scaled.
        cap = np.concatenate([cap, np.full(extra, tb_cap * 1e3)])
        res = np.concatenate([res, (norb + st.tb).astype(np.int32)])
    return Quotient(st.reps, st.rep_of, st.dep_ptr, st.dep_idx, st.dep_same_dst, res,
                    np.concatenate([cap, [np.inf]]), pad, st.lat, st.msg_us, st.images,
                    st.rank_class)  # fmt: skip


def _structure(s: ScheduleArrays, topo: ClusterTopology, router: Router) -> _Structure | str:
    if topo.dimensions is None:
        return "the fabric is not symmetric"
    sizes = [d.size for d in topo.dimensions]
    got = _structure_in(s, router, Translations(sizes))
    if got == "the schedule does not span the whole fabric":
        return got
    if isinstance(got, str) or got.images < len(got.rank_class):
        # A schedule whose sub-spreads act on aligned blocks (synth/assemble.AlignedFabric) is
        # invariant under the translations of the fabric with dimensions cut into digits;
        # of the two quotients, the one with more images has fewer representatives.
        finer = refined_sizes(s, sizes)
        if finer != sizes:
            st = _structure_in(s, router, Translations(finer))
            if not isinstance(st, str) and (isinstance(got, str) or st.images > got.images):
                return st
    return got


def _structure_in(s: ScheduleArrays, router: Router, grp: Translations, reorder: bool = True,
                  tb_sides: np.ndarray | None = None) -> _Structure | str:  # fmt: skip
    """`tb_sides`: [2, n] threadblock side labels to use instead of `s.tb`
    (`_translated_labels`)."""
    if grp.n != s.nranks or grp.n != router.nranks or len(s) == 0:
        return "the schedule does not span the whole fabric"
    if len(s.dep_idx) and ((s.dep_idx < 0) | (s.dep_idx >= len(s))).any():
        return "a dependency does not exist"
    if ((s.src < 0) | (s.src >= grp.n) | (s.dst < 0) | (s.dst >= grp.n)).any():
        return "a transfer has an invalid rank"
    got = _layout(s, grp)
    if not isinstance(got, str):
        return _quotient_structure(s, router, grp, np.ones_like(grp.sizes), *got, tb_sides=tb_sides)
    reason = got
    if reorder:
        # Not in N-translates order (a file read back lists each gpu's steps in turn): put it
        # in that order and check every premise again on the reordered arrays.
        got_order = _translate_major(s, grp)
        if got_order is not None:
            perm, labels = got_order
            # The layout is read in that order; the rest is checked on `s` as it is, each
            # transfer told its (rep, elem): no renumbered copy of the deps (a 512-rank ring
            # file's 15M: 120 MB held, 240 MB while built; docs/synthesis-scale.md, "Session
            # 11: the rail-512 rings").
            lay = _layout(_reordered_transfers(s, perm), grp)
            if isinstance(lay, str):
                reason = lay
            else:
                rep, elem = np.empty_like(lay[0]), np.empty_like(lay[1])
                rep[perm], elem[perm] = lay
                st = _quotient_structure(replace(s, tb=None), router, grp, np.ones_like(grp.sizes),
                                         rep, elem, tb_sides=labels)  # fmt: skip
                if not isinstance(st, str):
                    return st
                reason = st
        # Invariant under the outer dimensions' translations only (NCCL's rings across nodes:
        # every node runs the same intra-node layout): one block of ranks' transfers per orbit.
        for kstep in _subgroups(s, grp):
            lay = _subgroup_layout(s, grp, kstep)
            if isinstance(lay, str):
                reason = reason if lay == _NOT_BLOCK_TRANSLATES else lay
                continue
            st = _quotient_structure(s, router, grp, kstep, *lay)
            if not isinstance(st, str):
                return st
            reason = st
    return reason


_NOT_BLOCK_TRANSLATES = "transfers are not translates of one block of ranks' transfers"


def refined_sizes(s: ScheduleArrays, sizes: list[int]) -> list[int]:
    """`sizes` with each dimension cut into the most digits (an ordered factorization, least
    significant first) such that every transfer along it changes exactly one digit: the
    translation group an aligned split schedule may be invariant under. The caller checks."""
    grp = Translations(sizes)
    sc, dc = grp.coords(s.src.astype(np.int64)), grp.coords(s.dst.astype(np.int64))
    out: list[int] = []
    for d, g in enumerate(sizes):
        moved = sc[:, d] != dc[:, d]
        pairs = np.unique(sc[moved, d] * g + dc[moved, d])
        a, b = pairs // g, pairs % g
        best: tuple[int, ...] = (g,)
        for f in _factorizations(g):
            if len(f) <= len(best):
                continue
            changed = np.zeros(len(pairs), dtype=np.int64)
            unit = 1
            for k in f:
                changed += (a // unit % k) != (b // unit % k)
                unit *= k
            if (changed == 1).all():
                best = f
        out.extend(best)
    return out


def _factorizations(g: int) -> list[tuple[int, ...]]:
    """Ordered factorizations of g into factors >= 2."""
    if g == 1:
        return [()]
    return [(k, *rest) for k in range(2, g + 1) if g % k == 0 for rest in _factorizations(g // k)]


def _outer_subgroups(grp: Translations) -> list[np.ndarray]:
    """Steps of K_j, the translations along dimensions j.. (j >= 1), largest subgroup first."""
    out = []
    for j in range(1, len(grp.sizes)):
        kstep = np.ones_like(grp.sizes)
        kstep[:j] = grp.sizes[:j]
        out.append(kstep)
    return out


def _subgroups(s: ScheduleArrays, grp: Translations) -> list[np.ndarray]:
    """Subgroups to try, largest first: the K_j and the group generated by each dimension's
    smallest step that may keep `s` (`_digit_steps`)."""
    outer = _outer_subgroups(grp)
    steps = _digit_steps(s, grp)
    if steps is not None and not any(np.array_equal(steps, k) for k in outer):
        outer.append(steps)
    return sorted(outer, key=lambda k: -int(np.prod(grp.sizes // k)))


def _digit_steps(s: ScheduleArrays, grp: Translations) -> np.ndarray | None:
    """Per dimension, the smallest step (a divisor of its size) under whose translation every
    rank sends what its image sends, seen from each (peer, count, channel, reduce and chunk
    place: summed hashes per rank, a necessary condition), or None where no dimension has one
    below its size. Translations that keep `s` compose, so if each step keeps it the group
    they generate does; the caller checks that group with every premise. Why: a split
    AllGather bundle (assemble.allgather_bundled) cuts 128-chunk runs at 64, which only every
    second position of a rail digit keeps: its largest K_j is 4 translations, this group 256."""
    src = s.src.astype(np.int64)
    base = [grp.sub(s.dst.astype(np.int64), src), s.count, s.channel, s.reduce]
    ranks = np.arange(grp.n, dtype=np.int64)
    best: np.ndarray | None = None
    for place in (_chunk_place(s, grp, src), _run_place(s, grp, src)):
        if place is None:
            continue
        sig = []
        for seed in (0x9E3779B1, 0x85EBCA77):  # two hashes: a collision only costs the check
            h = np.zeros(len(src), dtype=np.int64)
            for c in (*base, *place):
                h = (h * seed + np.asarray(c, dtype=np.int64)) % _HASH_MOD
            sig.append(np.bincount(src, weights=h.astype(np.float64), minlength=grp.n))
        kept = np.array(grp.sizes)
        for d, size in enumerate(grp.sizes.tolist()):
            for m in (m for m in range(1, size) if size % m == 0):
                img = grp.add(ranks, np.full(grp.n, int(grp.strides[d]) * m, dtype=np.int64))
                if all(np.array_equal(x[img], x) for x in sig):
                    kept[d] = m
                    break
        if best is None or np.prod(grp.sizes // kept) > np.prod(grp.sizes // best):
            best = kept
    return None if best is None or (best == grp.sizes).all() else best


# Hashes below 2^20: a rank's sum of up to 2^32 of them is exact in a float64.
_HASH_MOD = (1 << 20) - 3


def _row_ids(cols: list[np.ndarray]) -> np.ndarray:
    """Keys equal for equal rows of the non-negative integer columns `cols`, ordered as the rows
    are lexicographically (first column most significant)."""
    key = np.zeros(len(cols[0]), dtype=np.int64)
    span = 1
    for c in cols:
        c = c.astype(np.int64)
        width = int(c.max(initial=0)) + 1
        if span * width >= 1 << 62:  # would overflow: compact what is packed so far
            key = np.unique(key, return_inverse=True)[1].reshape(-1).astype(np.int64)
            span = int(key.max(initial=0)) + 1
            if span * width >= 1 << 62:
                raise OverflowError("too many distinct rows to pack")
        key = key * width + c
        span *= width
    return key


def _subgroup_layout(
    s: ScheduleArrays, grp: Translations, kstep: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | str:
    """(rep position, element of K) per transfer if `s` is |K| translates of the transfers sent by
    K's fundamental domain (ranks with coordinates below `kstep`), K the translations by
    multiples of `kstep`; each transfer is the image of the domain's under its sender's K part."""
    n = len(s)
    order_k = int(np.prod(grp.sizes // kstep))
    if order_k == 1 or n % order_k:
        return _NOT_BLOCK_TRANSLATES
    src, dst = s.src.astype(np.int64), s.dst.astype(np.int64)
    sc = grp.coords(src)
    elem = grp.rank(sc - sc % kstep)
    block = n // order_k
    in_k = (grp.coords(np.arange(grp.n)) % kstep == 0).all(axis=-1)
    if (np.bincount(elem, minlength=grp.n)[in_k] != block).any():
        return _NOT_BLOCK_TRANSLATES
    for place in (_chunk_place(s, grp, elem), _run_place(s, grp, elem)):
        if place is None:
            return _NOT_BLOCK_TRANSLATES
        fid = _row_ids([grp.sub(src, elem), grp.sub(dst, elem), s.count, s.channel, s.reduce,
                        *place])  # fmt: skip
        order = np.lexsort((np.arange(n), fid, elem))
        rows = fid[order].reshape(order_k, block)
        if (rows == rows[0]).all():
            break
    else:
        return _NOT_BLOCK_TRANSLATES
    rep = np.empty(n, dtype=np.int64)
    rep[order] = np.tile(np.arange(block, dtype=np.int64), order_k)
    if s.tb is not None and not _threadblocks_translate(s, grp, rep, elem, order[:block]):
        return "threadblocks do not translate with the transfers"
    return rep, elem


def _threadblocks_translate(s: ScheduleArrays, grp: Translations, rep: np.ndarray,
                            elem: np.ndarray, base: np.ndarray) -> bool:  # fmt: skip
    """Is every threadblock side (rank, tb) one image of a side of the untranslated transfers
    (`base`, per representative) carrying exactly the images of that side's transfers? Sides
    are keyed as in capacity.threadblock_ports."""
    assert s.tb is not None
    tb = s.tb.astype(np.int64)
    if tb.min() < 0:
        return False
    b = base[rep]
    for rank in (s.src.astype(np.int64), s.dst.astype(np.int64)):
        here = np.unique(rank * (int(tb.max()) + 1) + tb, return_inverse=True)[1].reshape(-1)
        there = _row_ids([elem, rank[b], tb[b]])
        there = np.unique(there, return_inverse=True)[1].reshape(-1)
        pairs = here.astype(np.int64) * len(s) + there
        if not int(here.max()) == int(there.max()) == len(np.unique(pairs)) - 1:
            return False
    return True


def _quotient_structure(s: ScheduleArrays, router: Router, grp: Translations, kstep: np.ndarray,
                        rep: np.ndarray, elem: np.ndarray,
                        tb_sides: np.ndarray | None = None) -> _Structure | str:  # fmt: skip
    """The quotient of `s`, transfer i being rep[i]'s image under elem[i] in K (steps `kstep`);
    `tb_sides` as in `_structure_in`."""
    nrep = len(s) // int(np.prod(grp.sizes // kstep))
    why = _quotient_deps(s, rep, elem, nrep, grp)
    if why is not None:
        return why
    steps, ukeys, off, chans, lat, orbit = _channel_orbits(s, router, grp, kstep)
    h_size = int(np.prod(grp.sizes // steps))
    if h_size == 1:
        return "routes commute with no translation of the fabric"
    # Transfers are represented per coset of H in K: elem = h + c with c's coordinates below
    # steps (multiples of kstep).
    ec = grp.coords(elem)
    radix = steps // kstep
    coset = (ec % steps // kstep * np.concatenate([[1], np.cumprod(radix)[:-1]])).sum(axis=-1)
    ncos = int(np.prod(radix))
    qrep = rep * ncos + coset
    is_rep = np.asarray((ec < steps).all(axis=-1))  # h = 0
    owner, dep = _edges_of(s, np.flatnonzero(is_rep))  # the representatives' deps only
    m = nrep * ncos
    q, inv = np.unique(qrep[owner] * m + qrep[dep], return_inverse=True)
    q_owner, q_dep = q // m, q % m
    # Images of one dep finish together, so a merged edge pays alpha if any of its own does.
    pays = np.zeros(len(q), dtype=bool)
    np.logical_or.at(pays, inv, s.dst[owner] != s.dst[dep])
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
    pidx = np.searchsorted(ukeys, route_keys(s, router, grp.n)[reps])
    plen = np.diff(off)
    width = int(plen[pidx].max())
    links = np.full((width, len(reps)), norb, dtype=np.int32)
    for k in range(width):
        has = plen[pidx] > k
        links[k, has] = orbit[chans[off[pidx[has]] + k]]
    # Threadblock side classes: (rank's coset of H, threadblock) for the sender and the receiver;
    # without `tb` a threadblock is (channel, peer), the peer taken relative to the rank.
    src, dst = s.src[reps].astype(np.int64), s.dst[reps].astype(np.int64)
    if tb_sides is not None:
        send_local, recv_local = tb_sides[0, reps], tb_sides[1, reps]
    elif s.tb is None:
        ch = s.channel[reps].astype(np.int64)
        send_local, recv_local = ch * grp.n + grp.sub(dst, src), ch * grp.n + grp.sub(src, dst)
    else:
        send_local = recv_local = s.tb[reps].astype(np.int64)
    span = int(max(send_local.max(), recv_local.max())) + 1
    sides = [grp.rank(grp.coords(r) % steps) for r in (src, dst)]
    keys = np.concatenate([sides[0] * span + send_local, (grp.n + sides[1]) * span + recv_local])
    _, tb = np.unique(keys, return_inverse=True)
    tb = tb.reshape(2, len(reps))
    nvl = nvlink_channels(router)
    on_nvl = np.zeros(norb, dtype=bool)
    off_nvl = np.zeros(norb, dtype=bool)
    np.logical_or.at(on_nvl, orbit[used], nvl[used])
    np.logical_or.at(off_nvl, orbit[used], ~nvl[used])
    if (on_nvl & off_nvl).any():
        return "links of one orbit differ in kind"
    return _Structure(reps, qrep, dep_ptr, q_dep, ~pays, links, ocap_min * size / h_size, on_nvl,
                      tb, lat[pidx], router.message_us(s.src[reps], s.dst[reps]),
                      h_size, grp.rank(grp.coords(np.arange(grp.n)) % steps))  # fmt: skip
