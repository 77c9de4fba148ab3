"""MSCCL variants on one 8-GPU node: predicted time per (schedule, protocol, channels,
instances, size), and the rank order per size.

Every time is simulated (model/evaluate.py published_estimate: the file read back, sliced as
msccl-executor-nccl slices it, on the preset's fabric); nothing here is measured. Schedules:
msccl-tools' classic shapes (model/formats/msccl/classic.py: ring allreduce with `channels`
threadblocks per ring, all-pairs allreduce) and ccltune's own allreduce files for the preset,
each with 1..8 instances (formats/msccl/instances.py). NCCL's default is timed by the same
evaluator for reference.

On mi300x-8 the winner per size is compared with the files RCCL ships for MI300X, whose size
ranges RCCL set by measuring (benchmarks/data/msccl-variants/SOURCE.md): the model should pick
the same all-pairs variant RCCL kept for each size, and RCCL's own algorithms above 16 MiB.

Run: .venv/bin/python benchmarks/msccl_variants.py [PRESET ...] > benchmarks/results/msccl-variants.md
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

from ccltune.model.evaluate import nccl_estimate, published_estimate
from ccltune.model.formats.msccl.classic import allpairs_allreduce, ring_allreduce
from ccltune.model.formats.msccl.instances import replicate
from ccltune.model.formats.msccl.limits import MAX_CHANNELS
from ccltune.model.formats.msccl.writer import MscclFormatError, to_msccl_xml
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.synth.engine import synthesize
from ccltune.topology.presets import load_preset
from machine import cpu_model, load_average

PRESETS = ("dgx-h100-1", "mi300x-8")
SIZES = [1 << k for k in (16, 18, 20, 22, 24, 26, 28, 30)]
PROTOCOLS = ("Simple", "LL128", "LL")
DATA = (
    Path(__file__).resolve().parent / "data" / "msccl-variants" / "rccl-mi300x-allreduce-ranges.csv"
)


def human(b: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift:
            return f"{b >> shift}{unit}"
    return str(b)


def variants(topo_name: str) -> dict[str, str]:
    """label -> XML of every variant swept on this preset."""
    out: dict[str, str] = {}
    for proto in PROTOCOLS:
        for ch in (1, 2, 4, 8):
            for inst in (1, 2, 4):
                if ch * inst <= MAX_CHANNELS:
                    out[f"ring {proto} {ch}ch x{inst}"] = replicate(
                        ring_allreduce(8, ch, proto), inst
                    )
        for inst in (1, 2, 4, 8):
            out[f"allpairs {proto} x{inst}"] = replicate(allpairs_allreduce(8, proto), inst)
            sf = allpairs_allreduce(8, proto, send_first=True)
            out[f"allpairs-sf {proto} x{inst}"] = replicate(sf, inst)
    for label, xml in ours(topo_name).items():
        for proto in PROTOCOLS:
            text = _with_protocol(xml, proto)
            for inst in (1, 2):
                try:
                    out[f"{label} {proto} x{inst}"] = replicate(text, inst)
                except MscclFormatError:
                    continue
    return out


def ours(topo_name: str) -> dict[str, str]:
    """ccltune's allreduce schedules for the preset, lowered by its writer: per sketch, the
    largest pipelined variant of at most 896 transfers (synthesis may publish none of them when
    NCCL's default is faster, so they are taken from its candidates)."""
    topo = load_preset(topo_name)
    res = synthesize(topo, "allreduce", [1 << 20, 1 << 26, 1 << 30])
    best: dict[str, tuple[int, str]] = {}
    for label, sched in res.schedules.items():
        n = len(sched)
        sketch = label.split("/")[0]
        if n <= 896 and n > best.get(sketch, (0, ""))[0]:
            best[sketch] = (n, label)
    out = {}
    for k, (_, label) in enumerate(sorted(best.values())):
        sched = res.schedules[label]
        plain = sched.to_schedule() if isinstance(sched, ScheduleArrays) else sched
        try:
            out[f"ccltune#{k}"] = to_msccl_xml(plain, name=f"ccltune{k}", proto="Simple",
                                               max_threadblocks=res.max_threadblocks)  # fmt: skip
        except MscclFormatError:
            continue
        print(f"\n{topo_name}: ccltune#{k} = `{label}` ({len(plain.transfers)} transfers)")
    return out


def _with_protocol(xml: str, proto: str) -> str:
    head, rest = xml.split(">", 1)
    for p in PROTOCOLS:
        head = head.replace(f'proto="{p}"', f'proto="{proto}"')
    return head + ">" + rest


def sweep(preset: str) -> dict[str, dict[int, float]]:
    topo = load_preset(preset)
    times: dict[str, dict[int, float]] = {}
    for label, xml in variants(preset).items():
        limit = int(xml.split('maxBytes="', 1)[1].split('"', 1)[0]) or 1 << 62
        row = {}
        for size in SIZES:
            if size > limit:
                continue  # the executor does not run the file there
            try:
                row[size] = published_estimate("allreduce", size, topo, xml).time_us
            except MscclFormatError:  # e.g. a FIFO deadlock under this protocol
                break
        else:
            times[label] = row
    times["NCCL default"] = {s: nccl_estimate("allreduce", s, topo).time_us for s in SIZES}
    return times


def print_tables(preset: str, times: dict[str, dict[int, float]]) -> None:
    print(f"\n## {preset}: allreduce, time per call (us, simulated)\n")
    print("| variant | " + " | ".join(human(s) for s in SIZES) + " |")
    print("|---|" + "---:|" * len(SIZES))
    for label, row in times.items():
        cells = (f"{row[s]:.1f}" if s in row else "-" for s in SIZES)
        print(f"| {label} | " + " | ".join(cells) + " |")
    print(f"\n### {preset}: rank order per size (fastest first, top 5; NCCL default's rank)\n")
    print("| size | 1 | 2 | 3 | 4 | 5 | NCCL default |")
    print("|---|---|---|---|---|---|---:|")
    for s in SIZES:
        order = sorted((v for v in times if s in times[v]), key=lambda v: times[v][s])
        top = [f"{v} ({times[v][s]:.0f})" for v in order[:5]]
        print(f"| {human(s)} | " + " | ".join(top) + f" | {order.index('NCCL default') + 1} |")


def compare_rccl(times: dict[str, dict[int, float]]) -> None:
    """Which of RCCL's shipped candidates the model ranks first, against RCCL's pick."""
    rows = [r for r in csv.DictReader(DATA.open()) if r["outofplace"] == "1"]
    cand = {f"allpairs-sf {r['protocol']} x{r['instances']}": (int(r["min_bytes"]), int(r["max_bytes"]))
            for r in rows}  # fmt: skip
    cand["NCCL default"] = (16 * (1 << 20) + 1, 1 << 62)
    print("\n### mi300x-8: the model's pick among RCCL's candidates vs RCCL's measured pick\n")
    print("| size | RCCL ships | model's fastest | agree |")
    print("|---|---|---|---|")
    agree = 0
    for s in SIZES:
        shipped = next(v for v, (lo, hi) in cand.items() if lo <= s <= hi)
        t_min = min(times[v][s] for v in cand if s in times[v])
        best = [v for v in cand if times[v].get(s, np.inf) <= t_min * (1 + 1e-3)]  # 0.1% ties
        verdict = "no" if shipped not in best else ("yes" if len(best) == 1 else "tie")
        agree += verdict == "yes"
        print(f"| {human(s)} | {shipped} | {', '.join(best)} | {verdict} |")
    print(
        f"\nagree at {agree} of {len(SIZES)} sizes, ties not counted (RCCL's choice: measured; "
        "model: simulated)"
    )


def main() -> None:
    presets = sys.argv[1:] or list(PRESETS)
    print("Simulated (event simulator, MSCCL slicing), no wall-clock timing: "
          f"`.venv/bin/python benchmarks/msccl_variants.py {' '.join(presets)}` "
          f"(machine: {cpu_model()}, load {load_average()})")  # fmt: skip
    for preset in presets:
        times = sweep(preset)
        print_tables(preset, times)
        if preset == "mi300x-8":
            compare_rccl(times)


if __name__ == "__main__":
    main()
