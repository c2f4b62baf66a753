"""The seed toolkit's profilers, measuring what MLX really computes and holds.

Their names load on first use (PEP 562): a command that only probes the device in a child
process (agent doctor, agent.profiling.device_probe) imports this package without MLX."""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "MemoryProfiler": "agent.profiling.memory",
    "SpeedProfiler": "agent.profiling.speed",
    "BenchmarkResult": "agent.profiling.suite",
    "BenchmarkSuite": "agent.profiling.suite",
}

__all__ = ["BenchmarkResult", "BenchmarkSuite", "MemoryProfiler", "SpeedProfiler"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
