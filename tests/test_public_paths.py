"""The import paths and entry points users and their scripts rely on, whatever the folders inside
agent/ are called (README: the seed's names; docs/monitoring.md: RemoteMonitor in a training
loop)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import console_script


def test_the_model_path() -> None:
    from agent.model import KVCache, Model, ModelArgs, build_model

    model = build_model(ModelArgs.small())
    assert isinstance(model, Model)
    assert isinstance(model.make_cache()[0], KVCache)


def test_the_profiling_path() -> None:
    from agent.profiling import BenchmarkResult, BenchmarkSuite, MemoryProfiler, SpeedProfiler

    assert all(callable(name) for name in (BenchmarkResult, BenchmarkSuite, MemoryProfiler))
    assert callable(SpeedProfiler)


def test_the_cooling_path() -> None:
    from agent.cooling import CoolingScheduler, ThermalShutdownError
    from agent.cooling.scheduler import CoolingScheduler as Defined

    assert CoolingScheduler is Defined
    assert issubclass(ThermalShutdownError, Exception)


def test_agent_remote_monitor() -> None:
    import agent
    from agent import RemoteMonitor
    from agent.thermal import ThermalMonitor

    assert agent.RemoteMonitor is RemoteMonitor
    assert issubclass(RemoteMonitor, ThermalMonitor)
    with pytest.raises(AttributeError, match="no attribute 'remote_monitor'"):
        agent.remote_monitor  # noqa: B018 - the attribute access is the test


@pytest.mark.parametrize("entry", ["python -m agent", "agent", "coordinator"])
def test_the_entry_points_start(entry: str) -> None:
    argv = (
        [sys.executable, "-m", "agent"] if entry.startswith("python") else [console_script(entry)]
    )
    done = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout
