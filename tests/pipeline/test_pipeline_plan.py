"""build_plan: task expansion, communicators, determinism, and the files it publishes."""

import pytest

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.pipeline import PlanError, build_plan, expand_tasks, size_points
from ccltune.topology.presets import load_preset
from ccltune.topology.subgroup import SubgroupError, subcluster


def _spec(**kw: object) -> CCLTuningSpec:
    return CCLTuningSpec.model_validate(kw)


def test_size_points_are_powers_of_two_and_include_the_ends() -> None:
    assert size_points(1024, 8192) == [1024, 2048, 4096, 8192]
    assert size_points(1000, 3000) == [1000, 2000, 3000]
    assert size_points(4096, 4096) == [4096]


def test_parallelism_derives_tp_and_dp_tasks_on_their_groups() -> None:
    topo = load_preset("h800-rail-64")
    spec = _spec(parallelism={"tp": 8, "dp": 4, "pp": 2})
    tasks = expand_tasks(spec, topo)
    assert {(t.role, t.op) for t in tasks} == {
        (role, op) for role in ("tp", "dp") for op in ("allreduce", "allgather", "reducescatter")
    }
    plan = build_plan(
        _spec(
            parallelism={"tp": 8, "dp": 4, "pp": 2},
            collectives=[
                {"op": "allreduce", "role": "tp", "minBytes": "1M", "maxBytes": "1M"},
                {"op": "allreduce", "role": "dp", "minBytes": "1M", "maxBytes": "1M"},
            ],
        ),
        topo,
        name="t",
    )
    keys = {t.key.role: t.key for t in plan.tasks}
    assert (keys["tp"].ranks, keys["tp"].nodes) == (8, 1)  # TP stays inside a server
    assert (keys["dp"].ranks, keys["dp"].nodes) == (4, 4)  # DP: one GPU per server, over the rails


def test_subcluster_of_a_rail_group_is_symmetric() -> None:
    topo = load_preset("h800-rail-64")
    dp = subcluster(topo, [0, 8, 16, 24])
    assert dp.world_size == 4 and dp.gpus_per_node == 1 and dp.node_count == 4
    assert dp.dimensions is not None and [d.size for d in dp.dimensions] == [4]
    tp = subcluster(topo, list(range(8)))
    assert tp.dimensions is not None and [d.size for d in tp.dimensions] == [8]
    with pytest.raises(SubgroupError, match="different numbers of GPUs per node"):
        subcluster(topo, [0, 1, 8])
    with pytest.raises(SubgroupError, match="outside"):
        subcluster(topo, [0, 64])


def test_plan_is_deterministic_and_publishes_its_files() -> None:
    topo = load_preset("dgx-a100-1")
    spec = _spec(collectives=[{"op": "allgather", "minBytes": "1M", "maxBytes": "4M"}])
    a = build_plan(spec, topo, name="x")
    b = build_plan(spec, topo, name="x")
    assert a.digest == b.digest and a.files == b.files
    assert {f.path for f in a.files} >= {"nccl.conf", "report.md", "report.json"}
    (task,) = a.tasks
    assert [e.size_bytes for e in task.default_estimates] == [1 << 20, 2 << 20, 4 << 20]
    for est in task.chosen_estimates:
        assert est.source == "simulated" and est.choice is not None
        assert est.bound_us is not None and est.bound_us <= est.time_us


def test_groups_that_do_not_fit_name_the_field() -> None:
    topo = load_preset("dgx-a100-1")
    with pytest.raises(PlanError, match=r"spec.collectives\[0\]: a dp group of 16 ranks"):
        build_plan(
            _spec(collectives=[{"op": "allreduce", "role": "dp", "ranks": 16}]), topo, name="x"
        )
    with pytest.raises(PlanError, match=r"spec.collectives\[0\]: role 'tp' needs spec.parallelism"):
        build_plan(_spec(collectives=[{"op": "allreduce", "role": "tp"}]), topo, name="x")
