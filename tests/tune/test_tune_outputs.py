"""Process-wide knobs, NCCL's default, old NCCL versions, alltoall, and live runs through tune_tasks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tune_helpers import preset

from ccltune.api.common import Collective, Source
from ccltune.api.plan import TaskKey
from ccltune.tune.default import nccl_default_config, shrink_resources
from ccltune.tune.fabric import facts_for
from ccltune.tune.keys import make_keys
from ccltune.tune.profilers.live import LiveProfiler
from ccltune.tune.space import THREADS, build_space, check_config
from ccltune.tune.tuner import communicator_topology, tune_tasks


def test_default_comes_from_the_model_or_nccls_static_selection() -> None:
    a100 = preset("dgx-a100-1")
    facts = facts_for(a100, 8, 1)
    space = build_space(Collective.ALLREDUCE, facts)
    key = TaskKey(collective="allreduce", min_bytes=1, max_bytes=1, ranks=8, nodes=1)
    big = nccl_default_config(Collective.ALLREDUCE, 1 << 28, facts, space, communicator_topology(a100, key))
    assert big.source == "model.nccl_default" and big.config.impl.protocol == "Simple"
    assert big.config.threads in THREADS  # NCCL's extra Simple warp is not an NCCL_NTHREADS value
    small = nccl_default_config(Collective.ALLREDUCE, 4096, facts, space)
    assert small.source.startswith("NCCL static model") and small.config.impl.protocol == "LL"
    check_config(Collective.ALLREDUCE, big.config, facts)
    # NVLS is valid on H100 but not in model.nccl_default: the static selection (which has it) decides.
    h100 = facts_for(preset("dgx-h100-1"), 8, 1)
    d = nccl_default_config(Collective.ALLREDUCE, 1 << 28, h100, build_space(Collective.ALLREDUCE, h100))
    assert d.config.impl.algorithm == "nvls"
    assert d.config.channels == 16  # NCCL 2.30.7 transport/nvls.cc NVLS_NCHANNELS_SM90, not the 32 rings


def test_small_messages_get_fewer_channels_then_threads() -> None:
    assert shrink_resources(1 << 30, "Simple", 16, 512) == (16, 512)
    nc, nt = shrink_resources(64 << 10, "Simple", 16, 512)
    assert nc < 16 and nt == 512 and nc * nt * 64 <= (64 << 10)
    assert shrink_resources(1024, "LL", 16, 512) == (1, 128)


def test_process_wide_knobs_are_one_value_and_reported() -> None:
    result = tune_tasks(make_keys(["allreduce"], 1 << 20, 1 << 30, ranks=8, nodes=1), preset("dgx-h100-1"),
                        budget=25, seed=2, size_factor=8)
    deployed = [t.deployed for t in result.tasks if t.deployed is not None]
    assert len({(c.impl.transport, c.buffsize) for c in deployed if c.impl.protocol == "Simple"}) == 1
    assert len({c.threads for c in deployed if c.impl.protocol != "LL128"}) <= 1
    simple = next(c for c in deployed if c.impl.protocol == "Simple")
    if simple.buffsize != 4 << 20:
        assert result.env["NCCL_BUFFSIZE"] == str(simple.buffsize)
    most = max(c.channels for c in deployed)
    assert result.env.get("NCCL_MIN_NCHANNELS", str(most)) == str(most)


def test_old_nccl_gets_no_pat_and_no_process_wide_algorithm_list() -> None:
    topo = preset("h800-rail-64")
    keys = make_keys(["allgather"], 1 << 20, 64 << 20, ranks=8, nodes=8, factor=8)
    new = tune_tasks(keys, topo, budget=12, seed=1, nccl_version="2.24")
    old = tune_tasks(keys, topo, budget=12, seed=1, nccl_version="2.21")
    # Per-call choices live in the tuner table; NCCL_ALGO/NCCL_PROTO would bind every communicator.
    assert not {"NCCL_ALGO", "NCCL_PROTO"} & (set(new.env) | set(old.env))
    assert all(t.deployed.impl.algorithm != "pat" for t in old.tasks if t.deployed)
    assert " pat " not in old.files["tuner.table"]


def test_alltoall_tunes_without_tuner_rows() -> None:
    keys = make_keys(["alltoall"], 1 << 20, 16 << 20, ranks=8, nodes=1, factor=4)
    result = tune_tasks(keys, preset("a40-pcie-8"), budget=10, seed=0)
    assert "alltoall" not in result.tuner_csv and "NCCL_ALGO" not in result.env
    assert all(t.deployed.impl.algorithm == "p2p" for t in result.tasks if t.deployed)


def test_live_profiler_through_tune_tasks() -> None:
    """What a tuning Job does: each trial runs nccl-tests with its environment (faked here)."""
    seen: list[dict[str, str]] = []

    def runner(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str, str]:
        seen.append(dict(env))
        size = int(argv[argv.index("-b") + 1])
        # Fewer channels are faster in this fake machine, so tuning must move off NCCL's default.
        t = 10.0 + int(env.get("NCCL_MAX_NCHANNELS", "32")) / 4
        row = f"{size} {size // 4} float sum {t} 1.0 1.0 0 {t} 1.0 1.0 0\n"
        return 0, "# nccl-tests\n" + row, ""

    prof = LiveProfiler(base_env={}, runner=runner)
    keys = make_keys(["allreduce"], 1 << 20, 1 << 20, ranks=8, nodes=1)
    result = tune_tasks(keys, preset("dgx-a100-1"), profiler=prof, budget=12, seed=0)
    task = result.tasks[0]
    assert result.source == Source.MEASURED and task.chosen_measure.source == Source.MEASURED
    assert task.deployed is not None and task.default is not None
    assert task.deployed.channels < task.default.channels
    assert task.chosen_measure.time_us < task.default_measure.time_us
    assert all("NCCL_ALGO" in env for env in seen)
