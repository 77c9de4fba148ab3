"""Operator at scale on the KMock emulator: N NodeTopology objects, M CCLTunings.

    .venv/bin/python benchmarks/operator_scale.py [--nodes 1000] [--tunings 50] [--nodes-per-tuning 16]
        [--oversized]

Starts the emulator (tests/controller/ctl_harness.py), creates N GPU Nodes and one NodeTopology per
node (the harness writes them from one recorded probe, renamed per node, as N agents would; running
1,000 agent processes is not the point here), starts `kopf run` of the operator, applies M
CCLTunings each pinned to its own slice of nodes, and measures wall time until every CCLTuning is
Ready=True and the operator process's peak RSS (VmHWM from /proc/<pid>/status). All planning runs
in-process (simulated numbers; no Jobs). Prints a Markdown table.

--oversized adds, before the others, one more tenant's spec of the size that used to stall every
other tenant (issue 17: 20 collectives x 1K..16G x 31 tuning trials, on its own 16 nodes): its
estimate sends it to a plan Job. The harness holds Jobs pending (on a real cluster the Job runs
on another node; here it would share this machine's cores), and the table says what state the
oversized spec was in when the other tunings were all Ready.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "controller"))

import httpx  # noqa: E402
from ctl_harness import cluster_at, free_port, operator_env, start_operator  # noqa: E402

from ccltune_agent.nvml import ReplayNvml  # noqa: E402
from ccltune_agent.probe import probe  # noqa: E402
from machine import cpu_model  # noqa: E402

GV = "ccltune.io/v1alpha1"
FIXTURE = REPO / "tests" / "fixtures" / "agent" / "dgx-a100"


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def scrape(port: int, series: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--tunings", type=int, default=50)
    parser.add_argument("--nodes-per-tuning", type=int, default=16)
    parser.add_argument("--max-bytes", default="256K", help="allreduce size range is 64K..this")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--oversized", action="store_true", help="add one issue-17-sized spec first")
    args = parser.parse_args()

    base = probe("template", FIXTURE / "sysfs", ReplayNvml(FIXTURE / "nvml.json")).spec
    with tempfile.TemporaryDirectory() as tmp, cluster_at(Path(tmp)) as c:
        c.load_crds()
        t0 = time.monotonic()
        for i in range(args.nodes):
            name = f"gpu-{i:04d}"
            c.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
                "nvidia.com/gpu.present": "true", "ccltune.io/tor": f"t{i // 32}", "ccltune.io/spine": "s0"}}})
            spec = base.model_copy(update={"node_name": name}).wire()
            c.create({"apiVersion": GV, "kind": "NodeTopology", "metadata": {"name": name}, "spec": spec})
        setup_s = time.monotonic() - t0

        metrics_port = free_port()
        op = start_operator(c, operator_env(c, CCLTUNE_INPROCESS_MAX_GPUS="100000", CCLTUNE_RETRY_SECONDS="2",
                                            CCLTUNE_METRICS_PORT=str(metrics_port)), name="operator-bench")
        try:
            time.sleep(3)  # operator startup, not counted
            t1 = time.monotonic()
            per = args.nodes_per_tuning
            if args.oversized:
                c.kubelet.hold = True
                ops = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast")
                c.create({"apiVersion": GV, "kind": "CCLTuning",
                          "metadata": {"name": "oversized", "namespace": "team-big"},
                          "spec": {"nodes": {"names": [f"gpu-{k:04d}" for k in range(per)]},
                                   "tuning": {"enabled": True, "budget": 31},
                                   "collectives": [{"op": op, "minBytes": "1K", "maxBytes": "16G", "ranks": r}
                                                   for op in ops for r in (128, 64, 32, 16)]}})
            for j in range(args.tunings):
                names = [f"gpu-{(j * per + k) % args.nodes:04d}" for k in range(per)]
                c.create({"apiVersion": GV, "kind": "CCLTuning",
                          "metadata": {"name": f"job-{j:03d}", "namespace": f"team-{j % 5}"},
                          "spec": {"selector": {"matchLabels": {"job": f"job-{j:03d}"}},
                                   "nodes": {"names": names},
                                   "collectives": [{"op": "allreduce", "minBytes": "64K",
                                                    "maxBytes": args.max_bytes}]}})

            def ready() -> int:
                n = 0
                for t in c.list(GV, "ccltunings"):
                    if t["metadata"]["name"] == "oversized":
                        continue
                    conds = (t.get("status") or {}).get("conditions") or []
                    n += any(x["type"] == "Ready" and x["status"] == "True" for x in conds)
                return n

            def oversized_state() -> str:
                t = c.get(GV, "ccltunings", "oversized", "team-big") or {}
                conds = {x["type"]: x for x in (t.get("status") or {}).get("conditions") or []}
                ready = conds.get("Ready") or {}
                return f"{ready.get('status', '?')} {ready.get('reason', '')}: {ready.get('message', '')[:90]}"

            while (done := ready()) < args.tunings:
                if time.monotonic() - t1 > args.timeout:
                    print(op.tail(40))
                    raise SystemExit(f"only {done}/{args.tunings} Ready after {args.timeout}s")
                time.sleep(1)
            all_ready_s = time.monotonic() - t1
            big = oversized_state() if args.oversized else "none"
            peak = peak_rss_mib(op.proc.pid)
            requests = sum(1 for r in c.api_log() if r["identity"] == "operator")
            plan_s = scrape(metrics_port, 'ccltune_plan_duration_seconds_sum{where="operator"}')
        finally:
            op.stop()

    print("| NodeTopology objects | CCLTunings | GPUs per tuning | allreduce sizes | oversized spec "
          "(Ready when the others were) | time to all Ready (s) | operator peak RSS (MiB) | "
          "operator API requests |")
    print("|---:|---:|---:|---|---|---:|---:|---:|")
    print(f"| {args.nodes} | {args.tunings} | {8 * args.nodes_per_tuning} | 64K..{args.max_bytes} | "
          f"{big} | {all_ready_s:.1f} | {peak:.0f} | {requests} |")
    print()
    print(f"(build_plan inside the operator took {plan_s:.1f}s of that in total, from its "
          "ccltune_plan_duration_seconds metric; measured)")
    print(f"(setup of {args.nodes} Nodes + NodeTopologies: {setup_s:.1f}s, not counted; measured)")
    print(f"machine: nproc={__import__('os').cpu_count()}, python {platform.python_version()}, {cpu_model()}")


if __name__ == "__main__":
    main()
