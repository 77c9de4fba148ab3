"""The node egress max flow (topology/symmetry.py `_max_flow`): exact, whatever the path order."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from ccltune.topology.load import load_cluster
from ccltune.topology.symmetry import _max_flow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters"


def _net(edges: list[tuple[str, str, float]]) -> dict[str, dict[str, Fraction]]:
    cap: dict[str, dict[str, Fraction]] = {}
    for a, b, c in edges:
        cap.setdefault(a, {})[b] = Fraction(c)
    return cap


def test_max_flow_is_the_min_cut() -> None:
    # Two GPUs behind one PCIe switch (24 GB/s up) and a second path of 3 + 5.
    cap = _net([("s", "g0", 1e9), ("s", "g1", 1e9), ("g0", "sw", 16.0), ("g1", "sw", 16.0),
                ("sw", "nic", 24.0), ("g1", "cpu", 3.0), ("cpu", "nic2", 5.0),
                ("nic", "t", 25.0), ("nic2", "t", 25.0)])  # fmt: skip
    assert _max_flow(cap, "s", "t") == 27
    assert _max_flow(_net([("s", "a", 1.0)]), "s", "t") == 0  # the sink is unreachable


def test_sums_of_tenths_stay_exact() -> None:
    # Float augmentation of 0.1-steps drifts (0.1 * 3 != 0.3); the flow must not.
    edges = [("s", f"g{i}", 1.0) for i in range(3)] + [(f"g{i}", "t", 0.1) for i in range(3)]
    assert float(_max_flow(_net(edges), "s", "t")) == float(Fraction(0.1) * 3)


def test_rail_example_keeps_its_line_rate() -> None:
    # With float arithmetic this dimension came out 24.999999999999996 GB/s.
    topo = load_cluster(str(EXAMPLES / "a100-rail-4node.yaml"))
    assert topo.dimensions is not None
    rail = next(d for d in topo.dimensions if d.name.startswith("rail"))
    assert rail.bandwidth_gbps == 25.0
