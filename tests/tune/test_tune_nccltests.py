"""nccl-tests / rccl-tests log parsing: what real multi-node logs carry besides the result rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccltune.tune.profilers.nccltests import parse_log

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "nccl-tests"
ROW = "     1048576        262144     float     sum      -1    85.58   12.25   22.97      0    84.50   12.41   23.27      0"


def test_rccl_banner_lines_are_skipped_in_a_real_two_node_log() -> None:
    text = (DATA / "mi300x-2x8-allreduce" / "all_reduce_perf.txt").read_text()
    assert (
        "RCCL version : 2.22.3" in text and "Hostname     : gpu-53" in text
    )  # verbatim banner kept
    rows = parse_log(text, "mi300x").rows()
    assert (rows[0].size, rows[0].time_us) == (8, 256.5)
    assert (rows[-1].size, rows[-1].busbw_gbps, rows[-1].inplace_time_us) == (
        17179869184,
        357.46,
        90127.0,
    )


def test_nccl_version_line_and_rank_lines_of_a_real_log() -> None:
    text = (DATA / "hgx-h100-2x8-allreduce" / "all_reduce_perf.txt").read_text()
    assert "\nNCCL version 2.26.2+cuda12.8\n" in text
    rows = parse_log(text, "h100").rows()
    assert len(rows) == 32 and rows[-1].busbw_gbps == 469.21


@pytest.mark.parametrize(
    "noise",
    [
        "NCCL version 2.19.3+cuda12.3",
        "rccl-tests: Version develop:a7809b3",
        "HIP version  : 6.4.43484-123eb5128",
        "Librccl path : /opt/rocm/lib/librccl.so.1",
        "Warning: Permanently added 'worker-1' (ED25519) to the list of known hosts.",
    ],
)
def test_banner_and_launcher_lines_are_not_rows(noise: str) -> None:
    rows = parse_log(f"{noise}\n{ROW}\n", "x").rows()
    assert [r.size for r in rows] == [1048576]


def test_mpirun_tag_output_prefix_is_stripped() -> None:
    text = f"[1,0]<stdout>:#  Rank  0 Group  0 Pid 1 on host device  0 [0x0f] NVIDIA A100-SXM4-40GB\n[1,0]<stdout>:{ROW}\n"
    row = parse_log(text, "x").rows()[0]
    assert (row.size, row.time_us, row.inplace_busbw_gbps) == (1048576, 85.58, 23.27)


def test_a_broken_row_after_a_banner_still_names_its_line() -> None:
    with pytest.raises(ValueError, match=r"x:2: malformed nccl-tests row"):
        parse_log("NCCL version 2.26.2\n 1048576 262144 float sum -1 85.58 12.25\n", "x")
