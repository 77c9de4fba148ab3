"""Operator configuration: file, env overrides, one clear error per bad value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ccltune.controller.config import ConfigError, load_config


def test_defaults() -> None:
    cfg = load_config({})
    assert cfg.namespace == "ccltune-system"
    assert cfg.gpu_label == ("nvidia.com/gpu.present", "true")


def test_file_then_env(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("namespace: gpu-ops\nagent-image: reg/agent:1\ninprocess_max_gpus: 64\n")
    cfg = load_config({"CCLTUNE_CONFIG": str(path), "CCLTUNE_INPROCESS_MAX_GPUS": "8",
                       "CCLTUNE_AGENT_TOLERATIONS": '[{"operator": "Exists"}]'})
    assert (cfg.namespace, cfg.agent_image, cfg.inprocess_max_gpus) == ("gpu-ops", "reg/agent:1", 8)
    assert cfg.agent_tolerations == [{"operator": "Exists"}]


@pytest.mark.parametrize(("env", "needle"), [
    ({"CCLTUNE_INPROCESS_MAX_GPUS": "many"}, "CCLTUNE_INPROCESS_MAX_GPUS"),
    ({"CCLTUNE_AGENT_RESOURCES": "{oops"}, "CCLTUNE_AGENT_RESOURCES: not valid JSON"),
    ({"CCLTUNE_IMAGE_PULL_POLICY": "Sometimes"}, "CCLTUNE_IMAGE_PULL_POLICY"),
    ({"CCLTUNE_CONFIG": "/nonexistent/ccltune.yaml"}, "CCLTUNE_CONFIG=/nonexistent"),
])
def test_bad_values_name_the_variable(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("=", "=").split(":")[0]) as info:
        load_config(env)
    assert needle in str(info.value)


def test_unknown_key_in_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("agent_imag: x\n")
    with pytest.raises(ConfigError, match="agent_imag"):
        load_config({"CCLTUNE_CONFIG": str(path)})


def test_operator_refuses_bad_config_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLTUNE_")}
    env.update(CCLTUNE_INPROCESS_MAX_GPUS="lots", KUBECONFIG=str(tmp_path / "none"))
    proc = subprocess.run([sys.executable, "-m", "kopf", "run", "--standalone", "-A", "-m", "ccltune.controller.main"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "CCLTUNE_INPROCESS_MAX_GPUS" in lines[0], lines
