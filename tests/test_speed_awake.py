"""The speed profiler's warm-up count, re-warm after a gap and sleep detection, on a real model:
what the verdict's cold and slept rules read (shared/benchmark/verdict.py)."""

from __future__ import annotations

import sys
import time

import pytest

from agent.awake.clocks import SleepWindow, system_clocks
from agent.model import ModelArgs, build_model
from agent.profiling.runner import run_matrix
from agent.profiling.speed import REWARM_GAP_S, SpeedProfiler
from shared.benchmark.matrix import MatrixSpec


@pytest.fixture(scope="module")
def small_model():
    return build_model(ModelArgs.small(), bits=16)


def decode(profiler: SpeedProfiler, model, warmup: int, iterations: int = 2) -> dict:
    return profiler.benchmark_autoregressive(
        model, total_tokens=2, context_len=1, num_warmup=warmup, num_iterations=iterations
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's clock pair")
def test_linux_clocks_are_boottime_and_monotonic() -> None:
    clocks = system_clocks()
    assert clocks is not None and clocks.name == "CLOCK_BOOTTIME/CLOCK_MONOTONIC"
    window = SleepWindow(clocks)
    window.start()
    window.stop()
    assert window.slept_s < 0.05
    window = SleepWindow(clocks)
    window.start()
    window.clocks = clocks.injecting(3.0)
    window.stop()
    assert window.slept_s == pytest.approx(3.0, abs=0.05)
    assert system_clocks("plan9") is None


def test_no_warmup_is_recorded_and_stays_cold(small_model) -> None:
    result = decode(SpeedProfiler(), small_model, warmup=0)
    assert (result["warmup_iterations"], result["rewarm_iterations"]) == (0, 0)
    assert result["slept_s"] is not None and result["slept_s"] < 0.25
    clocks = system_clocks()
    assert result["sleep_clock"] == (clocks.name if clocks else None)
    records = list(
        run_matrix(MatrixSpec(models=("small",), n_prompt=(0,), n_gen=(2,), warmup=0, iterations=1))
    )
    assert records[0]["warmup_iterations"] == 0
    assert "cold" in records[0]["verdict_reasons"]
    assert "rewarmed" not in records[0]["flags"]


def test_one_warmup_is_recorded(small_model) -> None:
    result = decode(SpeedProfiler(), small_model, warmup=1)
    assert (result["warmup_iterations"], result["rewarm_iterations"]) == (1, 0)


@pytest.mark.slow
def test_a_gap_before_a_timed_iteration_rewarms_it(small_model) -> None:
    def gate(step: int) -> None:
        if step == 2:  # the second timed iteration: a cooling pause past the gap
            time.sleep(REWARM_GAP_S + 0.5)

    result = decode(SpeedProfiler(before_iteration=gate), small_model, warmup=1, iterations=2)
    assert (result["warmup_iterations"], result["rewarm_iterations"]) == (1, 1)
    assert len(result["samples_ms"]) == 2
    # Each sample is one decode, the gap and the re-warm outside it.
    assert max(result["samples_ms"]) < REWARM_GAP_S * 1000


def test_no_clocks_leaves_slept_unknown(small_model) -> None:
    result = decode(SpeedProfiler(clocks=None, injected_sleep_s=5.0), small_model, warmup=1)
    assert (result["slept_s"], result["sleep_clock"]) == (None, None)


@pytest.mark.skipif(system_clocks() is None, reason="no sleep clock pair here")
def test_an_injected_sleep_is_one_window_slept_and_flagged(monkeypatch) -> None:
    monkeypatch.setenv("MLX_FLEET_INJECT", "sleep=5@1")
    spec = MatrixSpec(models=("small",), n_prompt=(8,), n_gen=(2,), warmup=1, iterations=3)
    first, second = run_matrix(spec)
    assert first["slept_s"] == pytest.approx(5.0, abs=0.2)
    assert "slept" in first["verdict_reasons"]
    assert "injected" in first["flags"] and "sleep" in first["injected"]
    assert first["sleep_clock"] == system_clocks().name
    assert second["slept_s"] < 0.25
    assert "injected" not in second["flags"] and "slept" not in second["verdict_reasons"]
