"""Distance classes against an abstract switch tree, rendered the way sysfs nests PCIe ports."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from ccltune_agent.derive import distance
from ccltune_agent.sysfs import PciInfo


@st.composite
def trees(draw):
    """-> (pci, devices) where devices[bus] = (root complex, numa, switches from the root down)."""
    ids = itertools.count(1)
    pci: dict[str, PciInfo] = {}
    devices: dict[str, tuple[int, int, tuple[str, ...]]] = {}

    def add(parent: str | None, cls: str) -> str:
        bus = f"0000:{next(ids):02x}:00.0"
        pci[bus] = PciInfo(bus_id=bus, class_code=cls, parent=parent)
        return bus

    def fill(root: int, numa: int, up: str | None, path: tuple[str, ...], depth: int) -> None:
        for _ in range(draw(st.integers(1, 3))):
            if up is None:  # at the root complex: through a root port, or directly on the root bus
                port = add(None, "0x060400") if draw(st.booleans()) else None
            else:
                port = add(up, "0x060400")  # a downstream port of switch `up`
            if depth < 3 and draw(st.booleans()) and (up is not None or port is not None):
                switch = add(port, "0x060400")  # upstream port names the switch
                fill(root, numa, switch, (*path, switch), depth + 1)
            else:
                dev = add(port, "0x030200")
                devices[dev] = (root, numa, path)

    for root in range(draw(st.integers(1, 3))):
        numa = draw(st.integers(0, 1))
        fill(root, numa, None, (), 0)
    for bus, (_, numa, _) in devices.items():
        pci[bus].numa_node = numa
    return pci, devices


@settings(max_examples=50, deadline=None)
@given(trees())
def test_distance_matches_switch_tree(tree) -> None:
    pci, devices = tree
    for a, b in itertools.combinations(sorted(devices), 2):
        ra, na, pa = devices[a]
        rb, nb, pb = devices[b]
        common = 0
        while common < min(len(pa), len(pb)) and pa[common] == pb[common]:
            common += 1
        if common and ra == rb:
            crossed = (len(pa) - common) + (len(pb) - common) + 1
            want = "PIX" if crossed == 1 else "PXB"
        else:
            want = "PHB" if na == nb else "SYS"
        assert distance(a, b, pci) == want == distance(b, a, pci), (a, b, devices)
