"""Synthesized MSCCL schedules: the engine's arrays vs the published file read back (simulated).

Both columns come from the event simulator; "file" is what the plan reports and publishes
(model/evaluate.py published_estimate). Sizes: the example's tasks on dgx-h100-2, LO..HI. Also
printed: the file's threadblocks per GPU (the SM budget is synthesis.maxThreadblocks, default
NCCL's channel count) and its size.

Run: .venv/bin/python benchmarks/msccl_file_gap.py [LO_BYTES HI_BYTES] \
       > benchmarks/results/msccl-file-gap.md
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import yaml

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.model.evaluate import msccl_estimate, nccl_estimate, published_estimate
from ccltune.pipeline import task_keys
from ccltune.synth.engine import synthesize
from ccltune.topology.presets import load_preset
from ccltune.topology.subgroup import subcluster

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ccltuning.yaml"


def main() -> None:
    lo, hi = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (1 << 16, 1 << 22)
    cluster = load_preset("dgx-h100-2")
    spec = CCLTuningSpec.model_validate(yaml.safe_load(EXAMPLE.read_text())["spec"])
    sizes = [lo << k for k in range((hi // lo).bit_length())]
    print(f"Simulated (event simulator; no wall-clock timing, so no machine dependence): "
          f"`.venv/bin/python benchmarks/msccl_file_gap.py {lo} {hi}`\n")  # fmt: skip
    print("| task | size (B) | variant, protocol | TBs/GPU | file KiB | engine us | file us | "
          "file/engine | NCCL default us |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for i, (key, comm) in enumerate(task_keys(spec, cluster)):
        sub = subcluster(cluster, comm.ranks)
        with tempfile.TemporaryDirectory() as tmp:
            res = synthesize(sub, key.collective, sizes, out_dir=tmp,
                             time_budget_s=spec.synthesis.time_budget_seconds,
                             max_threadblocks=spec.synthesis.max_threadblocks)  # fmt: skip
            files = {r.label + r.protocol: Path(r.xml_file).read_text(encoding="utf-8")
                     for r in res.ranges if r.xml_file}  # fmt: skip
        for r in res.ranges:
            if not r.xml_file:
                continue
            text = files[r.label + r.protocol]
            for sr in r.sizes:
                s = sr.size_bytes
                eng = msccl_estimate(key.collective, s, sub, res.schedules[r.label], r.protocol)
                got = published_estimate(key.collective, s, sub, text)
                ref = nccl_estimate(key.collective, s, sub)
                label = r.label.replace("|", "\\|")
                print(f"| t{i} {key.collective} {key.ranks}r | {s} | {label}, {r.protocol} | "
                      f"{r.threadblocks} | {len(text.encode()) / 1024:.0f} | {eng.time_us:.2f} | "
                      f"{got.time_us:.2f} | {got.time_us / eng.time_us:.2f} | "
                      f"{ref.time_us:.2f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
