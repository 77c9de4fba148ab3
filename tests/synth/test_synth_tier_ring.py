"""Tier-ring AllGather (formats/msccl/tier_ring.py, synth/tier_ring.py): rail rings over the
product of the outer switch dimensions, then a two-stage NVSwitch spread. Every file is run by
the executor model and its data movement proven in and out of place; it fits the 3-tier
fabric's 12 threadblocks and 64 steps; each NIC carries the least an AllGather can; the engine
publishes it where its file is faster; msccl-executor-nccl's parser loads it (conformance kit)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth_helpers import check_plan, write_in_place_file

from ccltune.api.common import Collective
from ccltune.model.formats.msccl.limits import MAX_STEPS
from ccltune.model.formats.msccl.reader import read_msccl
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.tier_ring import groups, threadblocks, tier_ring_allgather
from ccltune.model.schedule.check import check_schedule
from ccltune.synth import engine
from ccltune.synth import tier_ring as tiers
from ccltune.topology.load import load_cluster
from ccltune.topology.presets import load_preset

TIER = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "astra-3tier-128.yaml"


@pytest.mark.parametrize(("servers", "local"), [(2, 4), (3, 8), (4, 6), (5, 4), (16, 8)])
def test_every_shape_runs_and_gathers_in_and_out_of_place(servers: int, local: int) -> None:
    arr, low = tier_ring_allgather(servers, local, "t", 12)
    a, b = groups(local) or (0, 0)
    assert threadblocks(local) == 2 + 2 * (a - 1) + 2 * (b - 1)
    assert low.threadblocks == threadblocks(local) - (servers == 2)  # one ring on two servers
    assert low.max_steps == a * servers <= MAX_STEPS
    check_schedule(arr.to_schedule())
    if servers == 16:  # the 3-tier file: its read-back is the engine's (~10 s), not repeated
        return
    text = render_lowering(low, name="t", proto="Simple", nchannels=1, inplace=True)
    back = read_msccl(text)  # proves out of place and in place; raises on a deadlock
    n = servers * local
    src = np.array([t.src for t in back.schedule.transfers])
    dst = np.array([t.dst for t in back.schedule.transfers])
    over_nic = src // local != dst // local
    # each NIC carries S-1 chunks (the least); each GPU takes (L-1) S chunks over NVLink
    assert np.bincount(src[over_nic], minlength=n).tolist() == [servers - 1] * n
    assert np.bincount(dst[~over_nic], minlength=n).tolist() == [(local - 1) * servers] * n
    assert len(arr) == len(src)
    assert tiers.file_steps(servers, local) == sum(len(x) for i in low.items_of for x in i.values())


def test_applies_to_three_switch_dimensions_within_the_budget() -> None:
    dims = load_cluster(str(TIER)).dimensions or []
    assert tiers.shape(dims) == (16, 8)
    assert tiers.shape(load_preset("h800-rail-64").dimensions or []) is None  # rail_ring's
    assert tiers.variants(dims, Collective.REDUCESCATTER, 12, "t") == []
    assert tiers.variants(dims, Collective.ALLGATHER, 9, "t") == []  # 10 threadblocks needed
    assert [v.label for v in tiers.variants(dims, Collective.ALLGATHER, 12, "t")] == [tiers.LABEL]


def test_engine_publishes_it_where_its_file_is_faster() -> None:
    """astra-3tier-128: at 64 MiB the tier-ring file beats the search's (its fill) and NCCL's;
    at 1 GiB the search's file, with part of its data NVSwitch-first, is faster and kept."""
    topo = load_cluster(str(TIER))
    res = engine.synthesize(topo, Collective.ALLGATHER, [64 << 20, 1 << 30], workers=1)
    chosen = {sr.size_bytes: sr.chosen for sr in res.sizes}
    assert chosen[64 << 20] == tiers.LABEL
    assert chosen[1 << 30] != tiers.LABEL


def test_tier_ring_file_passes_the_executors_own_code(tmp_path: Path) -> None:
    """The 128-rank file as the engine writes it (in place): msccl-executor-nccl's own parser
    loads and selects it (conformance kit)."""
    arr, low = tier_ring_allgather(16, 8, "t", 12)
    name = "allgather-128r-tier-ring-Simple"
    write_in_place_file(tmp_path, name, Collective.ALLGATHER, arr, low)
    out = check_plan(tmp_path, "--dtype-bytes", "2")
    assert f"PASS msccl/{name}.xml load" in out


def test_a_size_next_to_a_ring_win_also_times_the_other_ends_file() -> None:
    """a100-rail-4node (8 x 2 x 2): the tier ring wins at 4 MiB, so 512 KiB (between it and 256
    KiB) is evaluated as next to a ring's win; 256 KiB's winning file is timed there too, not
    only the engine's best schedule's (that one's file: 48.1 against 44.9 us, simulated)."""
    topo = load_cluster(str(TIER.parent / "a100-rail-4node.yaml"))
    res = engine.synthesize(topo, Collective.ALLGATHER, [256 << 10, 512 << 10, 4 << 20], workers=1)
    got = {sr.size_bytes: (sr.chosen, sr.protocol) for sr in res.sizes}
    assert got[4 << 20][0] == tiers.LABEL
    assert got[512 << 10] == got[256 << 10]
