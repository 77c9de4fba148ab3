"""Validity rules: no invalid combination is ever built, proposed or emitted."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tune_helpers import preset

from ccltune.api.common import Collective
from ccltune.tune.fabric import facts_for
from ccltune.tune.space import (
    ALGOS_BY_COLLECTIVE,
    PROTOCOLS,
    TRANSPORTS,
    Config,
    Impl,
    build_space,
    check_config,
    invalid_reason,
)

SHAPES = [
    ("dgx-a100-1", 8, 1),
    ("dgx-h100-1", 8, 1),
    ("dgx-h100-2", 16, 2),
    ("h800-rail-64", 64, 8),
    ("h800-rail-64", 8, 8),  # one GPU per node (a DP group across rails)
    ("a40-pcie-8", 8, 1),
    ("a40-pcie-8", 2, 1),
    ("mi300x-8", 8, 1),
    ("v100-cubemesh-4", 4, 1),
]
ALL_ALGOS = sorted({a for algos in ALGOS_BY_COLLECTIVE.values() for a in algos})


def impls(space):
    return {s.impl for s in space.subspaces}


@pytest.mark.parametrize(("name", "ranks", "nodes"), SHAPES)
@pytest.mark.parametrize("coll", list(Collective))
def test_every_built_config_is_valid(name: str, ranks: int, nodes: int, coll: Collective) -> None:
    facts = facts_for(preset(name), ranks, nodes)
    space = build_space(coll, facts)
    assert len(space) > 0
    for config in space:
        check_config(coll, config, facts)  # raises when invalid


def test_nvls_needs_hopper_nvswitch() -> None:
    a100 = facts_for(preset("dgx-a100-1"), 8, 1)
    h100 = facts_for(preset("dgx-h100-1"), 8, 1)
    assert not any(i.algorithm.startswith("nvls") for i in impls(build_space(Collective.ALLREDUCE, a100)))
    assert Impl("nvls", "Simple") in impls(build_space(Collective.ALLREDUCE, h100))
    # NVLSTree is a multi-node algorithm; NVLS runs Simple only.
    assert invalid_reason(Collective.ALLREDUCE, Impl("nvls_tree", "Simple"), h100) is not None
    assert invalid_reason(Collective.ALLREDUCE, Impl("nvls", "LL"), h100) is not None
    h2 = facts_for(preset("dgx-h100-2"), 16, 2)
    assert Impl("nvls_tree", "Simple") in impls(build_space(Collective.ALLREDUCE, h2))
    assert Impl("nvls", "Simple") not in impls(build_space(Collective.ALLREDUCE, h2))  # no SHARP


def test_pat_only_with_one_gpu_per_node_and_new_nccl() -> None:
    one = facts_for(preset("h800-rail-64"), 8, 8)
    full = facts_for(preset("h800-rail-64"), 64, 8)
    assert Impl("pat", "Simple") in impls(build_space(Collective.ALLGATHER, one))
    assert Impl("pat", "Simple") not in impls(build_space(Collective.ALLGATHER, full))
    assert Impl("pat", "Simple") not in impls(build_space(Collective.ALLREDUCE, one))
    assert Impl("pat", "Simple") not in impls(build_space(Collective.ALLGATHER, one, (2, 22)))


def test_collnet_needs_sharp() -> None:
    topo = preset("dgx-h100-2")
    plain = impls(build_space(Collective.ALLREDUCE, facts_for(topo, 16, 2)))
    sharp = impls(build_space(Collective.ALLREDUCE, facts_for(topo, 16, 2, sharp=True)))
    assert not any(i.algorithm.startswith("collnet") for i in plain)
    assert {Impl("collnet_direct", "Simple"), Impl("collnet_chain", "Simple")} <= sharp
    single = facts_for(preset("dgx-h100-1"), 8, 1, sharp=True)
    assert not any(i.algorithm.startswith("collnet") for i in impls(build_space(Collective.ALLREDUCE, single)))


def test_ll128_only_on_nvlink_and_shm_only_on_pcie() -> None:
    pcie = facts_for(preset("a40-pcie-8"), 8, 1)
    bridged = facts_for(preset("a40-pcie-8"), 2, 1)  # the pair shares an NVLink bridge
    amd = facts_for(preset("mi300x-8"), 8, 1)
    assert pcie.intra_kind == "pcie" and bridged.intra_kind == "nvlink"
    assert not any(i.protocol == "LL128" for i in impls(build_space(Collective.ALLREDUCE, pcie)))
    assert any(i.protocol == "LL128" for i in impls(build_space(Collective.ALLREDUCE, bridged)))
    assert not any(i.protocol == "LL128" for i in impls(build_space(Collective.ALLREDUCE, amd)))
    assert any(i.transport == "shm" for i in impls(build_space(Collective.ALLREDUCE, pcie)))
    assert not any(i.transport == "shm" for i in impls(build_space(Collective.ALLREDUCE, bridged)))


def test_broadcast_ring_and_alltoall_p2p_only() -> None:
    facts = facts_for(preset("dgx-h100-1"), 8, 1)
    assert {i.algorithm for i in impls(build_space(Collective.BROADCAST, facts))} == {"ring"}
    assert impls(build_space(Collective.ALLTOALL, facts)) == {Impl("p2p", "Simple")}


def test_check_config_rejects_bad_resources() -> None:
    facts = facts_for(preset("dgx-h100-1"), 8, 1)
    ring = Impl("ring", "Simple")
    with pytest.raises(ValueError, match="channels 0"):
        check_config(Collective.ALLREDUCE, Config(ring, 0, 512, 1 << 22), facts)
    with pytest.raises(ValueError, match="threads 100"):
        check_config(Collective.ALLREDUCE, Config(ring, 4, 100, 1 << 22), facts)
    with pytest.raises(ValueError, match="LL128 runs 640"):
        check_config(Collective.ALLREDUCE, Config(Impl("ring", "LL128"), 4, 512, 1 << 22), facts)
    with pytest.raises(ValueError, match="does not implement"):
        check_config(Collective.ALLGATHER, Config(Impl("tree", "Simple"), 4, 512, 1 << 22), facts)


@settings(max_examples=150, deadline=None)
@given(
    shape=st.sampled_from(SHAPES),
    coll=st.sampled_from(list(Collective)),
    algo=st.sampled_from(ALL_ALGOS),
    proto=st.sampled_from(PROTOCOLS),
    transport=st.sampled_from(TRANSPORTS),
    sharp=st.booleans(),
    minor=st.integers(14, 28),
)
def test_space_membership_matches_rules(shape, coll, algo, proto, transport, sharp, minor) -> None:
    name, ranks, nodes = shape
    facts = facts_for(preset(name), ranks, nodes, sharp=sharp)
    impl = Impl(algo, proto, transport)
    space = build_space(coll, facts, (2, minor))
    assert (impl in impls(space)) == (invalid_reason(coll, impl, facts, (2, minor)) is None)


def test_every_algorithm_is_allowed_somewhere_and_refused_somewhere() -> None:
    facts = [facts_for(preset(n), r, k, sharp=True) for n, r, k in SHAPES]
    for algo in ALL_ALGOS:
        verdicts = [invalid_reason(c, Impl(algo, "Simple"), f) for c, f in itertools.product(Collective, facts)]
        assert any(v is None for v in verdicts), algo
        assert any(v is not None for v in verdicts), algo
