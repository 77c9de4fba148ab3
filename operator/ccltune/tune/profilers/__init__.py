"""Profiler backends behind one interface (base.Profiler)."""

from .base import Measurement, Profiler, ProfilerError
from .live import LiveProfiler
from .replay import ReplayProfiler
from .simulated import SimulatedProfiler

__all__ = ["LiveProfiler", "Measurement", "Profiler", "ProfilerError", "ReplayProfiler", "SimulatedProfiler"]
