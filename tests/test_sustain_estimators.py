"""One estimator per figure of a sustained run (shared.benchmark.sustain, shared.reports.sustain,
the plots) and the temperature trend's window: pure functions fed windows and readings."""

from __future__ import annotations

from typing import Any

import pytest

from agent.commands.temp import render
from agent.daemon.telemetry import TREND_WINDOW, trend_c_per_min
from shared.benchmark.sustain import STEADY_WINDOWS, steady_unknown, summarize, sustained_speed
from shared.reports.benchmark import render_text
from shared.reports.sustain import markdown_sustain


def window(index: int, tokens: int, timed_s: float, celsius: float = 60.0) -> dict[str, Any]:
    return {
        "index": index,
        "start_s": index * 10.0,
        "end_s": index * 10.0 + 10,
        "iterations": tokens // 16,
        "tokens": tokens,
        "timed_s": timed_s,
        "tokens_per_sec": tokens / timed_s if timed_s else None,
        "celsius": celsius,
        "state": "ok",
        "watts": None,
        "joules": None,
        "pause_s": 0.0,
        "paused": False,
    }


def sustain(windows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"duration_s": 10.0 * len(windows), "window_s": 10.0, "windows": windows}


def test_a_sustained_cells_tok_s_is_its_tokens_over_its_timed_seconds() -> None:
    """The issue's cell: windows of 261 and 281 tok/s; its tok/s lies between them (a mean of
    per-iteration rates said 341 ± 132), and its spread is the windows'."""
    windows = [window(0, 2610, 10.0), window(1, 2810, 10.0)]
    speed = sustained_speed(sustain(windows))
    assert speed["tokens_per_sec"] == pytest.approx(5420 / 20.0)
    assert 261 <= speed["tokens_per_sec"] <= 281
    assert speed["std_tokens_per_sec"] == pytest.approx(14.142, abs=1e-3)
    assert speed["ci95_tokens_per_sec"] == pytest.approx(12.706 * 14.142 / 2**0.5, rel=1e-3)


def test_a_slow_window_weighs_by_its_seconds_not_by_its_count() -> None:
    windows = [window(0, 1000, 1.0), window(1, 1000, 9.0)]  # 1000 and 111 tok/s: mean 556
    assert sustained_speed(sustain(windows))["tokens_per_sec"] == pytest.approx(200.0)


def test_one_window_has_no_spread_and_nothing_timed_has_no_speed() -> None:
    one = sustained_speed(sustain([window(0, 500, 10.0)]))
    assert one["tokens_per_sec"] == 50.0 and one["std_tokens_per_sec"] is None
    assert sustained_speed(sustain([window(0, 0, 0.0)]))["tokens_per_sec"] is None


def test_steady_never_counts_the_first_window() -> None:
    """Two full windows: steady was the mean of both, the first included; now N/A, saying why."""
    two = [window(0, 1000, 10.0), window(1, 900, 10.0)]
    summary = summarize(two, None, 10.0)
    assert summary["first_tokens_per_sec"] == 100.0
    assert summary["steady_tokens_per_sec"] is None and summary["throttle_ratio"] is None
    why = steady_unknown(sustain(two) | summary)
    assert why is not None and f"needs {STEADY_WINDOWS} full windows after the first" in why
    assert "this run has 1" in why


def test_steady_is_the_last_windows_after_the_first_once_there_are_enough() -> None:
    rows = [window(i, tokens, 10.0) for i, tokens in enumerate((1000, 950, 900, 850, 800))]
    summary = summarize(rows, None, 10.0)
    assert summary["steady_tokens_per_sec"] == pytest.approx((90 + 85 + 80) / 3)
    assert steady_unknown(sustain(rows) | summary) is None
    first_three = summarize(rows[:4], None, 10.0)  # exactly three after the first
    assert first_three["steady_tokens_per_sec"] == pytest.approx((95 + 90 + 85) / 3)


def record(windows: list[dict[str, Any]]) -> dict[str, Any]:
    plan = sustain(windows)
    return {
        "name": "small/f16 pp16 b1",
        "model": "small",
        "bits": None,
        "test": "pp16",
        "batch_size": 1,
        "flags": [],
        "sustain": plan | summarize(windows, None, 10.0) | {"stopped": None},
    }


def test_the_sustained_tables_say_why_steady_is_na() -> None:
    cell = record([window(0, 1000, 10.0), window(1, 900, 10.0)])
    markdown = "\n".join(markdown_sustain([cell]))
    assert "steady = mean of the last 3 full windows after the first" in markdown
    assert "small/f16 pp16 b1: steady needs 3 full windows after the first" in markdown
    table = render_text({"cells": [cell]}, "table", width=200)
    assert "small/f16 pp16 b1: steady needs 3 full windows" in " ".join(table.split())


def test_an_axis_keeps_its_minimum_span() -> None:
    from coordinator.reports.plot import widened

    assert widened((10.0, 10.01), 1.0) == pytest.approx((9.505, 10.505))
    assert widened((40.0, 80.0), 2.0) == (40.0, 80.0)


def test_a_flat_sustain_plot_does_not_draw_a_cliff() -> None:
    pytest.importorskip("matplotlib")
    from coordinator.reports.sustain_plot import plot_sustain

    windows = [window(i, 1000 + i, 10.0, celsius=60.0 + i / 100) for i in range(4)]
    for i, w in enumerate(windows):
        w["watts"] = 12.0 + i / 100  # a 0.03 W change
    cell = record(windows) | {"host": "mac1", "status": "ok"}
    speed, heat, power = plot_sustain({"title": "run", "cells": [cell]}).axes
    low, high = speed.get_ylim()
    assert high - low >= 0.05 * 100.15 - 1e-9
    assert heat.get_ylim()[1] - heat.get_ylim()[0] >= 2.0
    assert power.get_ylim()[1] - power.get_ylim()[0] >= 1.0


def test_no_trend_before_the_seeds_window_of_readings() -> None:
    """`agent temp --watch` once showed ↑ +105.7 °C/min one second in, from two readings."""
    assert TREND_WINDOW == 5
    readings = [50.0, 51.76, 53.5, 55.3, 57.0]
    for seen in range(1, TREND_WINDOW):
        assert trend_c_per_min(readings[:seen], 1.0) is None
    assert trend_c_per_min(readings, 1.0) == pytest.approx(105.7, abs=0.5)


def test_the_watch_view_says_when_the_trend_will_come() -> None:
    from rich.console import Console

    data = {
        "source": "replay",
        "kind": "simulated",
        "celsius": 51.8,
        "sensor": None,
        "pressure": None,
        "policy": {"max_speed_temp": 75.0, "pause_temp": 85.0, "stop_temp": 95.0},
        "policy_origin": "defaults",
        "state": "ok",
        "sensors": {},
        "reason": None,
        "time": None,
    }
    console = Console(width=120, record=True, color_system=None)
    console.print(render(data, [50.0, 51.8], trend_c_per_min([50.0, 51.8], 1.0)))
    shown = console.export_text()
    assert "— (after 5 readings)" in shown and "°C/min" not in shown


def test_an_agents_names_in_the_sustained_tables_are_never_markup() -> None:
    """Issue 42: a sustained cell's test, host and stop reason (an agent's words) were drawn
    as Rich markup: `[/]` raised MarkupError."""
    payload = "[/][bold red]X[link=file:///etc/passwd]y"
    cell = record([window(0, 1000, 10.0), window(1, 900, 10.0)])
    cell |= {"test": f"pp16{payload}", "name": f"small/f16 pp16{payload} b1", "host": payload}
    cell["sustain"]["stopped"] = f"thermal stop{payload}"
    table = " ".join(render_text({"cells": [cell]}, "table", width=400).split())
    assert table.count("[/][bold red]X") >= 3, table  # the name, the host, the stop reason
