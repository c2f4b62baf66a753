"""bench/bench_thermal.py runs and prints both measurements beside their baselines (no timings
are asserted: they depend on the machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[1] / "bench" / "bench_thermal.py"


def test_bench_prints_cost_per_sample_and_idle_share_with_baselines() -> None:
    result = subprocess.run(
        [
            *(sys.executable, str(BENCH), "--seconds", "0.2", "--samples", "5"),
            *("--sources", "sim,none", "--repeats", "1"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "cost per sample (5 reads a round)" in out and "idle CPU over 0.2 s at 1 Hz" in out
    for row in (
        "baseline: python function",
        "baseline: process per reading",
        "baseline: no monitor",
        "baseline: bare 1 Hz thread",
        "monitor over sim",
        "monitor over none",
    ):
        assert row in out
