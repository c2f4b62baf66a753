"""The seed toolkit's profilers, measuring what MLX really computes and holds."""

from agent.profiling.memory import MemoryProfiler
from agent.profiling.speed import SpeedProfiler
from agent.profiling.suite import BenchmarkResult, BenchmarkSuite

__all__ = ["BenchmarkResult", "BenchmarkSuite", "MemoryProfiler", "SpeedProfiler"]
