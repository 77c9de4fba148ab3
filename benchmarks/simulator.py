"""Simulator benchmark: ring allgather on 512 ranks, 64 chunks per rank.

Run: .venv/bin/python benchmarks/simulator.py [--quick] [--engine auto|heap|batch]
Prints a table (and writes benchmarks/results/simulator.md with --write).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from ccltune.api.cluster import ClusterNode, ClusterTopology, Device, Link
from ccltune.api.common import Collective
from ccltune.model.cost.protocols import SIMPLE
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import simulate
from machine import cpu_model  # benchmarks/machine.py (run as scripts)

SIZE = 1 << 30  # 1 GiB, the top of a usual nccl-tests sweep


def fallback_h800_rail(nodes: int) -> ClusterTopology:
    """H800 rail-optimized cluster, 8 GPUs + 8 NICs per node, one leaf per rail, 8 spines.

    NVLink 400 GB/s per GPU bidirectional -> 200 GB/s per direction (NVIDIA H800 SXM spec);
    ConnectX-7 400 Gb/s = 50 GB/s per direction; PCIe Gen5 x16 ~ 64 GB/s per direction.
    Latencies are round placeholders of the usual order (us): NVLink 0.5, PCIe 0.5, IB hop 1.
    """
    devices: list[Device] = []
    links: list[Link] = []
    for n in range(nodes):
        sw = f"node{n}/nvswitch"
        devices.append(Device(id=sw, kind="nvswitch", node=f"node{n}"))
        for g in range(8):
            gpu, nic = f"node{n}/gpu{g}", f"node{n}/nic{g}"
            devices.append(Device(id=gpu, kind="gpu", node=f"node{n}", local_index=g))
            devices.append(Device(id=nic, kind="nic", node=f"node{n}"))
            links.append(Link(a=gpu, b=sw, kind="nvlink", bandwidth_gbps=200, latency_us=0.5))
            links.append(Link(a=gpu, b=nic, kind="pcie", bandwidth_gbps=64, latency_us=0.5))
            links.append(Link(a=nic, b=f"rail{g}", kind="net", bandwidth_gbps=50, latency_us=1.0))
    for g in range(8):
        devices.append(Device(id=f"rail{g}", kind="leaf"))
        for s in range(8):
            links.append(
                Link(a=f"rail{g}", b=f"spine{s}", kind="net", bandwidth_gbps=400, latency_us=1.0)
            )
    devices += [Device(id=f"spine{s}", kind="spine") for s in range(8)]
    return ClusterTopology(
        name=f"h800-rail-{nodes * 8}-fallback",
        gpus_per_node=8,
        nodes=[ClusterNode(name=f"node{n}", gpus=8) for n in range(nodes)],
        devices=devices,
        links=links,
    )


def ring_allgather_arrays(n: int, c: int) -> ScheduleArrays:
    """NCCL-style single-channel ring over ranks 0..n-1, as flat arrays.

    Transfer (j, step, r) = rank r forwarding chunk j of origin (r - step) % n to r + 1; it
    depends on the transfer that brought that chunk to r (data) and on r's previous send
    (one channel sends in order, chunk-major as NCCL's loop does).
    """
    steps = n - 1
    idx = np.arange(c * steps * n, dtype=np.int64)
    r = idx % n
    step = (idx // n) % steps
    j = idx // (n * steps)
    origin = (r - step) % n
    src = r.astype(np.int32)
    dst = ((r + 1) % n).astype(np.int32)
    chunk = origin * c + j
    data_dep = np.where(step > 0, idx - n - r + (r - 1) % n, -1)
    order_dep = np.where(idx >= n, idx - n, -1)
    both = np.stack([order_dep, data_dep], axis=1)
    both.sort(axis=1)
    both[both[:, 0] == both[:, 1], 0] = -1  # same transfer twice -> once
    mask = both >= 0
    dep_ptr = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(mask.sum(axis=1), out=dep_ptr[1:])
    return ScheduleArrays(
        name=f"ring-allgather-{n}x{c}",
        collective=Collective.ALLGATHER,
        nranks=n,
        chunks_per_rank=c,
        src=src,
        dst=dst,
        chunk=chunk,
        count=np.ones(len(idx), dtype=np.int32),
        reduce=np.zeros(len(idx), dtype=bool),
        channel=np.zeros(len(idx), dtype=np.int32),
        dep_ptr=dep_ptr,
        dep_idx=both[mask],
    )


def machine() -> str:
    cpu = cpu_model()
    return f"nproc={os.cpu_count()}, Python {platform.python_version()}, CPU: {cpu}"


def cases(topo: ClusterTopology, quick: bool) -> tuple[list[tuple[str, int, int, object]], str]:
    """(schedule label, ranks, chunks/rank, builder) for each case, and a note on the source."""
    sizes = [(512, 8)] if quick else [(512, 8), (512, 64)]
    out: list[tuple[str, int, int, object]] = []
    try:
        from ccltune.model.nccl.baselines import ring_allgather

        for n, c in sizes:
            out.append(("nccl-ring (baselines)", n, c, lambda c=c: ring_allgather(topo, chunks=c)))
        note = "nccl-ring: ccltune.model.nccl.baselines.ring_allgather (NCCL ring order, 1 channel)"
    except ImportError:
        note = "ccltune.model.nccl.baselines not available: only the script's own ring is run"
    for n, c in sizes:
        out.append(("serialized-ring (script)", n, c, lambda n=n, c=c: ring_allgather_arrays(n, c)))
    return out, note


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="512 x 8 only")
    ap.add_argument("--engine", default="auto", choices=["auto", "heap", "batch"])
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/simulator.md")
    args = ap.parse_args()
    notes = []
    try:
        from ccltune.topology.presets import load_preset

        topo = load_preset("h800-rail-512")
        notes.append("topology: preset h800-rail-512")
    except (ImportError, KeyError, ValueError) as exc:
        topo = fallback_h800_rail(64)
        notes.append(f"topology: built in this script ({topo.name}); preset unavailable: {exc}")
    todo, note = cases(topo, args.quick)
    notes.append(f"schedules: {note}; serialized-ring: ranks in index order, each rank's sends "
                 "one after another (built here as flat arrays)")  # fmt: skip
    router = Router(topo)
    rows = []
    for label, n, c, build in todo:
        t0 = time.perf_counter()
        sched = build()  # type: ignore[operator]
        t1 = time.perf_counter()
        cpu = time.process_time()
        res = simulate(sched, topo, SIZE, SIMPLE, router, engine=args.engine)
        cpu = time.process_time() - cpu
        t2 = time.perf_counter()
        algbw = SIZE / (res.time_us * 1e3)
        rows.append(
            (label, n, c, res.transfers, res.events, t1 - t0, t2 - t1, cpu, res.events / (t2 - t1),
             res.time_us, algbw * (n - 1) / n, res.engine)
        )  # fmt: skip
        print(f"done {label} {n}x{c}: {t2 - t1:.1f}s", file=sys.stderr, flush=True)
    head = (
        "| schedule | ranks | chunks/rank | transfers | events | build s | wall s | cpu s "
        "| events/s (wall) | events/s (cpu) | simulated time us | simulated busbw GB/s | engine |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        lines.append(
            f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:,} | {r[4]:,} | {r[5]:.1f} | {r[6]:.1f} "
            f"| {r[7]:.1f} | {r[8]:,.0f} | {r[4] / r[7]:,.0f} | {r[9]:,.1f} | {r[10]:.2f} | {r[11]} |"
        )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    out = "\n".join(
        [
            f"Ring allgather, {SIZE} bytes (nccl-tests size), protocol {SIMPLE.name} "
            f"(efficiency {SIMPLE.efficiency}, step latency {SIMPLE.step_latency_us} us); "
            "busbw = algbw * (n-1)/n (nccl-tests); all times simulated except the wall/cpu columns",
            *notes,
            f"machine: {machine()}; load average at the end: {load:.1f}",
            "wall s / cpu s: simulate() only (routing, array preparation and events), "
            "build s: constructing the schedule; cpu s is this process's CPU time, the fair "
            "figure when other jobs share the 2 cores (see the load average)",
            "",
            *lines,
        ]
    )
    print(out)
    if args.write:
        Path(__file__).with_name("results").joinpath("simulator.md").write_text(
            "# Simulator benchmark\n\nCommand: `.venv/bin/python benchmarks/simulator.py --write`"
            "\n\n" + out + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
