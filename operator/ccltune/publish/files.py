"""The files a Plan publishes, content-addressed so a generation is identified by its digest."""

from __future__ import annotations

import hashlib

from ..api.plan import Plan, PlanFile

NCCL_CONF = "nccl.conf"
REPORT_MD = "report.md"
REPORT_JSON = "report.json"
NCCL_TOPO = "nccl-topo.xml"
TUNER_CSV = "tuner.csv"
TUNER_TABLE = "tuner.table"  # tune.table.TABLE_FILE (publish may not import tune)
TUNER_PLUGIN_DIR = "/var/run/ccltune/plugin"  # where the injection copies libccltune-tuner.so
TUNER_PLUGIN_PATH = f"{TUNER_PLUGIN_DIR}/libccltune-tuner.so"
MSCCL_DIR = "msccl"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def plan_file(path: str, content: str) -> PlanFile:
    return PlanFile(path=path, content=content, digest=sha256(content))


def render_nccl_conf(env: dict[str, str], header: str) -> str:
    """KEY=VALUE lines for NCCL_CONF_FILE; NCCL reads the file, process env still wins over it."""
    lines = [f"# {line}" for line in header.splitlines()]
    lines += [f"{key}={env[key]}" for key in sorted(env)]
    return "\n".join(lines) + "\n"


def plan_digest(files: list[PlanFile]) -> str:
    """sha256 over (path, digest) in path order: equal files give an equal generation."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.digest}\n".encode())
    return h.hexdigest()


def with_files(plan: Plan, files: list[PlanFile]) -> Plan:
    by_path = {f.path: f for f in files}
    if len(by_path) != len(files):
        raise ValueError("two plan files share a path")
    ordered = [by_path[p] for p in sorted(by_path)]
    return plan.model_copy(update={"files": ordered, "digest": plan_digest(ordered)})


def injection_env(files: list[PlanFile], mount_dir: str) -> dict[str, str]:
    """The env vars that point NCCL/MSCCL at the published files once mounted at mount_dir."""
    paths = {f.path for f in files}
    env = {}
    if NCCL_CONF in paths:
        env["NCCL_CONF_FILE"] = f"{mount_dir}/{NCCL_CONF}"
    if NCCL_TOPO in paths:
        env["NCCL_TOPO_FILE"] = f"{mount_dir}/{NCCL_TOPO}"
    if any(p.startswith(MSCCL_DIR + "/") for p in paths):
        env["MSCCL_ALGO_DIR"] = f"{mount_dir}/{MSCCL_DIR}"
    if TUNER_CSV in paths:
        # Read by NCCL's example tuner plugin (ext-tuner/example) when it is loaded.
        env["NCCL_TUNER_CONFIG_FILE"] = f"{mount_dir}/{TUNER_CSV}"
    if TUNER_TABLE in paths:
        # ccltune's plugin, copied into the pod by the injection (docs/tuner-plugin.md); an
        # absolute path is dlopen'ed as is (NCCL src/plugin/tuner.cc).
        env["NCCL_TUNER_PLUGIN"] = TUNER_PLUGIN_PATH
        env["CCLTUNE_TUNER_TABLE"] = f"{mount_dir}/{TUNER_TABLE}"
    return env
