"""busbw.py against nccl-tests' PERFORMANCE.md factors and a real nccl-tests log."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccltune.api.common import Collective
from ccltune.model.cost.busbw import algbw_gbps, busbw_factor, busbw_gbps, time_for_busbw_us

DATA = Path("/work/shared/data/nccl-tests/ndv4-1x8-allreduce-nccl.txt")


@pytest.mark.parametrize(
    ("coll", "n", "factor"),
    [
        ("allreduce", 8, 2 * 7 / 8),
        ("allreduce", 2, 1.0),
        ("allgather", 8, 7 / 8),
        ("reducescatter", 16, 15 / 16),
        ("alltoall", 4, 3 / 4),
        ("broadcast", 64, 1.0),
        ("allreduce", 1, 0.0),
    ],
)
def test_factors(coll: str, n: int, factor: float) -> None:
    assert busbw_factor(coll, n) == pytest.approx(factor)


def test_algbw_units() -> None:
    # 1 GB in 1 s = 1 GB/s; 1 MB in 1 us = 1000 GB/s.
    assert algbw_gbps(1e9, 1e6) == pytest.approx(1.0)
    assert algbw_gbps(1e6, 1.0) == pytest.approx(1000.0)
    assert busbw_gbps(Collective.ALLREDUCE, 8, 1e9, 1e6) == pytest.approx(1.75)


def test_inverse() -> None:
    t = time_for_busbw_us("allgather", 8, 1 << 26, 100.0)
    assert busbw_gbps("allgather", 8, 1 << 26, t) == pytest.approx(100.0)


@pytest.mark.parametrize("bad", [(0, 1.0), (1, 0.0), (-5, 1.0)])
def test_rejects_nonpositive(bad: tuple[float, float]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        algbw_gbps(*bad)


def test_matches_real_nccl_tests_log() -> None:
    """Recompute algbw/busbw of every row of an 8-GPU all_reduce_perf run from size and time."""
    if not DATA.exists():
        pytest.skip("shared nccl-tests data not present")
    rows = 0
    for line in DATA.read_text().splitlines():
        parts = line.split()
        if not parts or not parts[0].isdigit() or len(parts) < 8:
            continue
        size, time_us, algbw, busbw = (
            int(parts[0]),
            float(parts[4]),
            float(parts[5]),
            float(parts[6]),
        )
        if size == 0 or time_us <= 0:
            continue
        rows += 1
        # nccl-tests prints 2 decimals; time is rounded too, so allow that rounding.
        assert algbw_gbps(size, time_us) == pytest.approx(algbw, rel=2e-2, abs=0.011)
        assert busbw_gbps("allreduce", 8, size, time_us) == pytest.approx(
            busbw, rel=2e-2, abs=0.011
        )
    assert rows > 10
