"""Synthesis benchmark (issue 18): what the user waits for, and what the files are worth.

Each row runs `ccltune synthesize` end to end as its own process (imports, synthesis, every MSCCL
file written, each checked by model/schedule/check.py as the CLI does before writing) and reads:
- wall time of the process, its CPU time (user + sys: on a loaded machine wall time grows, CPU
  time much less, and it includes the side process `--workers 2` forks), its peak RSS
  (os.wait4's rusage: the largest single process) and the peak PSS of the process and its
  children together (sampled from /proc every 0.1 s; shared pages are split between the
  processes that map them, so a forked side process is not counted twice);
- from the same run (`--json`): the per-size results, so the quality columns are the files'
  own: worst % of the link bound and of the bound at the SM budget (model/cost/sm_bound.py) at
  >= 64 MiB, on >= 64 GPUs the worst time over NCCL's at <= 256 KiB, worst and largest-size
  speedup over NCCL's default choice (all simulated by ccltune's simulator, the bounds
  analytic), the SM budget and the threadblocks the files use, and whether the time budget ran
  out.
- with `--max-threadblocks X`: NCCL's default choice run on the same X channels
  (NCCL_MIN_NCHANNELS = NCCL_MAX_NCHANNELS = X, simulated in-process), worst speedup >= 64 MiB.

Each row runs under an address-space cap (`--mem-cap-gb`) and a `--timeout`: a row over either
is reported as such, never left to take the machine down. The CLI's `--time-budget` (wall time)
is raised to 600 s so that the machine's load does not cut the evaluation short.

    .venv/bin/python benchmarks/synthesis.py                      # the issue 18 rows
    .venv/bin/python benchmarks/synthesis.py --grid               # every collective x fabric
    .venv/bin/python benchmarks/synthesis.py --rows h800-rail-64:allgather --max-threadblocks 32
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import cpu_model  # benchmarks/machine.py (run as scripts)

REPO = Path(__file__).resolve().parents[1]
FABRIC_3TIER = str(REPO / "examples" / "clusters" / "astra-3tier-128.yaml")
# (cluster, collective, GPUs, issue 18's wall-time target in s or None)
ROWS = (
    ("syccl-a800-16", "allgather", 16, 0.5),
    ("h800-rail-64", "allgather", 64, 2.0),
    ("h800-rail-512", "allgather", 512, 60.0),
    (FABRIC_3TIER, "reducescatter", 128, None),
    ("v100-cubemesh-4", "allgather", 4, None),
    ("mi300x-8", "allgather", 8, None),
)

TARGETS = {(Path(c).name, k): t for c, k, _, t in ROWS if t is not None}
# `--grid`: every collective issue 18 grades on every fabric it names.
GRID_CLUSTERS = ("syccl-a800-16", "h800-rail-64", "h800-rail-512", FABRIC_3TIER, "v100-cubemesh-4",
                 "mi300x-8")  # fmt: skip
GRID_COLLECTIVES = ("allgather", "reducescatter", "allreduce", "alltoall")
# Issue 18's quality targets at >= 64 MiB, read against the bound at the SM budget.
QUALITY_TARGET = {"allgather": 90.0, "reducescatter": 90.0, "allreduce": 85.0, "alltoall": 85.0}


def _machine() -> str:
    cpu = cpu_model()
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    return (f"{platform.node()}: {os.cpu_count()} CPUs ({cpu}), python "
            f"{platform.python_version()}, commit {commit or '?'}")  # fmt: skip


def run_row(cluster: str, coll: str, sizes: str, timeout: float, cap_gb: float,
            extra: list[str]) -> dict[str, Any]:  # fmt: skip
    """One `ccltune synthesize` process: wall, CPU, peak RSS, exit status and its JSON."""
    with tempfile.TemporaryDirectory(prefix="ccltune-bench-") as tmp:
        out, summary = Path(tmp) / "msccl", Path(tmp) / "synthesis.json"
        cmd = [sys.executable, "-m", "ccltune", "synthesize", "--cluster", cluster, "--collective", coll,
               "--sizes", sizes, "--out", str(out), "--json", str(summary), *extra]  # fmt: skip
        cap = int(cap_gb * (1 << 30))

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                preexec_fn=limit)  # fmt: skip
        status, usage, timed_out = 0, None, False
        deadline = t0 + timeout
        pss_mb, sampled = 0.0, 0.0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - sampled >= 0.1:
                sampled = time.perf_counter()
                pss_mb = max(pss_mb, _tree_pss_mb(proc.pid))
            if time.perf_counter() > deadline:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                timed_out = True
                break
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        files = sorted(out.glob("*.xml")) if out.is_dir() else []
        row: dict[str, Any] = {
            "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "rss_mb": usage.ru_maxrss / 1024, "pss_mb": pss_mb, "rc": proc.returncode, "timed_out": timed_out,
            "files": len(files), "xml_mb": sum(f.stat().st_size for f in files) / 1e6,
            "error": err.strip().splitlines()[-1] if err.strip() and proc.returncode else "",
        }  # fmt: skip
        if summary.is_file():
            row["summary"] = json.loads(summary.read_text())
        return row


def _tree_pss_mb(pid: int) -> float:
    """Proportional set size of `pid` and its descendants now, MB (0 for a process gone)."""
    kb, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup", encoding="ascii") as f:
                kb += next(int(ln.split()[1]) for ln in f if ln.startswith("Pss:"))
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children", encoding="ascii") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, StopIteration):
            continue
    return kb / 1024


def _quality(summary: dict[str, object]) -> dict[str, str]:
    sizes = summary["sizes"]
    assert isinstance(sizes, list)
    big = [s for s in sizes if s["bytes"] >= 64 << 20]
    pct = min((s["pctOfBound"] or 0.0) for s in big) if big else float("nan")
    at_budget = min(s["pctOfBudgetBound"] for s in big) if big else float("nan")
    speed = [s["ncclUs"] / s["timeUs"] for s in sizes]
    # Issue 18: on >= 64 GPUs, calls of <= 256 KiB at <= 0.5x NCCL's time.
    small = [s["timeUs"] / s["ncclUs"] for s in sizes if s["bytes"] <= 256 << 10]
    ranks = summary["ranks"]
    assert isinstance(ranks, int)
    small_txt = f"{max(small):.2f}x" if small and ranks >= 64 else "-"
    ranges = summary["ranges"]
    assert isinstance(ranges, list)
    tbs = max((r["threadblocks"] for r in ranges if r["kind"] == "msccl"), default=0)
    timings = summary["timingsS"]
    assert isinstance(timings, dict)
    goal = QUALITY_TARGET.get(str(summary["collective"]))
    verdict = "-" if goal is None or not big else (
        f"{goal:g}%: {'met' if at_budget >= goal else 'missed'}")  # fmt: skip
    return {
        "goal": verdict,
        "pct": f"{pct:.1f}%", "budget": f"{at_budget:.1f}%", "small": small_txt,
        "worst": f"{min(speed):.2f}x", "last": f"{speed[-1]:.2f}x",
        "tb": f"{summary['maxThreadblocks']} / {tbs or '-'}",
        "out": "yes" if summary["budgetExhausted"] else "no",
        "synth": f"{timings.get('total_s', 0.0):.1f}",
    }  # fmt: skip


def _vs_nccl_at(cluster: str, summary: dict[str, Any], channels: int) -> str:
    """Worst speedup at >= 64 MiB over NCCL's default choice forced onto `channels` channels
    (NCCL_MIN_NCHANNELS = NCCL_MAX_NCHANNELS), both simulated."""
    from ccltune.model.evaluate import nccl_estimate
    from ccltune.model.nccl.default import nccl_default
    from ccltune.topology.load import load_cluster

    topo = load_cluster(cluster)
    coll = summary["collective"]
    out = []
    for s in summary["sizes"]:
        if s["bytes"] >= 64 << 20:
            choice = nccl_default(coll, s["bytes"], topo).choice.model_copy(
                update={"channels": channels})
            out.append(nccl_estimate(coll, s["bytes"], topo, choice).time_us / s["timeUs"])
    return f"{min(out):.2f}x" if out else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--rows", default="",
                    help="cluster:collective,... (cluster: preset, cluster file or ASTRA-sim YAML)")  # fmt: skip
    ap.add_argument("--sizes", default="1K:1G")
    ap.add_argument("--timeout", type=float, default=1200.0, help="per row, s")
    ap.add_argument("--mem-cap-gb", type=float, default=6.0, help="address-space cap per row")
    # The CLI's budget is wall time: on a shared machine 120 s would cut evaluation by load.
    ap.add_argument("--time-budget", type=float, default=600.0, help="the CLI's --time-budget")
    ap.add_argument("--max-threadblocks", type=int, default=None,
                    help="SM budget per GPU (default: the CLI's, NCCL's channel count)")  # fmt: skip
    ap.add_argument("--grid", action="store_true",
                    help="every collective issue 18 grades on every fabric it names")  # fmt: skip
    args = ap.parse_args()
    rows = [(c, k, 0, None) for c, k in (r.rsplit(":", 1) for r in args.rows.split(",") if r)]
    if args.grid:
        rows = [(c, k, 0, None) for c in GRID_CLUSTERS for k in GRID_COLLECTIVES]
    extra = ["--time-budget", str(args.time_budget)]
    if args.max_threadblocks is not None:
        extra += ["--max-threadblocks", str(args.max_threadblocks)]
    print(_machine())
    print(f"load average at start {os.getloadavg()[0]:.1f}; sizes {args.sizes}; cap "
          f"{args.mem_cap_gb:g} GB, timeout {args.timeout:g} s per row")  # fmt: skip
    print()
    print("| cluster | GPUs | collective | wall s | CPU s | peak RSS MB (largest process) | "
          "peak PSS MB (all processes) | synthesis s (self) | "
          "files (MB) | worst % of link bound >= 64M | worst % of budget bound >= 64M | "
          "quality target | "
          "worst time / NCCL's <= 256K (>= 64 GPUs) | worst vs NCCL on the same channels "
          ">= 64M | worst vs NCCL | vs NCCL at max | "
          "SM budget / TBs used | budget out | wall target |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---|")
    for cluster, coll, gpus, target in rows or ROWS:
        r = run_row(cluster, coll, args.sizes, args.timeout, args.mem_cap_gb, extra)
        name = Path(cluster).name if "/" in cluster else cluster
        summ = r.get("summary")
        q = _quality(summ) if isinstance(summ, dict) else {}
        if isinstance(summ, dict):
            gpus = int(summ["ranks"])
        status = ("timed out" if r["timed_out"] else
                  f"exit {r['rc']}: {r['error']}" if r["rc"] else "")  # fmt: skip
        target = target or TARGETS.get((name, coll))
        wall = float(r["wall_s"])
        tgt = "" if target is None else f"< {target:g} s: {'met' if wall < target else 'missed'}"
        if args.max_threadblocks is not None and isinstance(summ, dict):
            q["same"] = _vs_nccl_at(cluster, summ, args.max_threadblocks)
        print(f"| {name} | {gpus or '?'} | {coll} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
              f"{r['rss_mb']:.0f} | {r['pss_mb']:.0f} | {q.get('synth', '-')} | {r['files']} ({r['xml_mb']:.1f}) | "
              f"{q.get('pct', '-')} | {q.get('budget', '-')} | {q.get('goal', '-')} | "
              f"{q.get('small', '-')} | "
              f"{q.get('same', '-')} | "
              f"{q.get('worst', '-')} | {q.get('last', '-')} | "
              f"{q.get('tb', '-')} | {q.get('out', '-')} | {tgt}{'; ' if tgt and status else ''}"
              f"{status} |", flush=True)  # fmt: skip
    print()
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
