"""Reading a file back holds memory by the step, not by the step times its dependencies: a
512-GPU rail-ring file has ~0.5M steps of ~30 deps each (docs/synthesis-scale.md, "Session 9:
reading a 500k-step file"). Measured in bytes allocated (tracemalloc), never in seconds."""

from __future__ import annotations

import tracemalloc

from ccltune.model.formats.msccl import reader
from ccltune.model.formats.msccl.executor import XStep
from ccltune.model.formats.msccl.rail_ring import rail_ring_allgather
from ccltune.model.formats.msccl.stream import render_lowering

# Peak bytes allocated while reading, per step of the file. 16 servers x 4 GPUs: 1,028 with
# each transfer's deps taken when its receive completes, 2,089 with every step's sets kept to
# the end (the 512-GPU file: ~1,180 against ~3,550).
PEAK_BYTES_PER_STEP = 1_400


def test_steps_are_slotted() -> None:
    """~0.5M XSteps in a 512-GPU file: no per-object __dict__."""
    assert not hasattr(XStep(0, 0, 0, "s", "i", 0, "o", 0, 1, -1, -1, 0, 0, 1, -1), "__dict__")


def test_reading_back_peaks_below_a_bound_per_step() -> None:
    _, low = rail_ring_allgather(16, 4, "t", 16)
    text = render_lowering(low, name="t", proto="Simple", nchannels=1, inplace=True)
    steps = text.count("<step ")
    reader._READS.clear()  # a full read, not the cache's
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        back = reader.read_msccl(text)
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
        reader._READS.clear()
    assert len(back.schedule.transfers) == 16 * 4 * (15 + 3 * 16)  # the file was read in full
    assert peak < PEAK_BYTES_PER_STEP * steps, peak / steps
