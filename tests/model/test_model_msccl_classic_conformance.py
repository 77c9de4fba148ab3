"""The classic shapes and their instances load in msccl-executor-nccl's own parser on every rank
and are selected by its own rule (the conformance kit, ../shared/conformance/check-plan)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from ccltune.model.formats.msccl.classic import allpairs_allreduce, ring_allgather, ring_allreduce
from ccltune.model.formats.msccl.instances import replicate

REPO = Path(__file__).resolve().parents[2]
CHECK_PLAN = REPO.parent / "shared" / "conformance" / "check-plan"


def test_classic_files_and_their_instances_load_and_run_in_the_executor(tmp_path: Path) -> None:
    files = {
        "a-ring-1ch-x2": replicate(ring_allreduce(8, 1, "LL"), 2),
        "b-ring-8ch-x4": replicate(ring_allreduce(8, 8, "Simple"), 4),  # 32 threadblocks
        "c-allpairs-x4": replicate(allpairs_allreduce(8, "LL128"), 4),
        "d-allpairs-sf-x8": replicate(allpairs_allreduce(8, "Simple", send_first=True), 8),
        "e-allgather-2ch-x2": replicate(ring_allgather(8, 2, "LL"), 2),
    }
    out = tmp_path / "msccl"
    out.mkdir()
    lo = 1 << 10
    for name, xml in files.items():  # disjoint ranges: every file must be selected somewhere
        head, body = xml.split(">", 1)
        head = re.sub(r'minBytes="\d+"', f'minBytes="{lo}"', head)
        head = re.sub(r'maxBytes="\d+"', f'maxBytes="{lo * 4}"', head)
        (out / f"{name}.xml").write_text(head + ">" + body, encoding="utf-8")
        lo *= 8
    assert CHECK_PLAN.exists(), f"conformance kit missing at {CHECK_PLAN}"
    p = subprocess.run([str(CHECK_PLAN), str(tmp_path), "--dtype-bytes", "2"],
                       capture_output=True, text=True, timeout=900)  # fmt: skip
    assert p.returncode != 2, p.stdout + p.stderr  # the kit could not run: nothing was checked
    assert p.returncode == 0, p.stdout
    assert p.stdout.count("PASS msccl/") == 2 * len(files)
