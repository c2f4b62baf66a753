"""Every table command's table at 200, 80 and 50 columns (shared.tables): at 200 nothing folds,
at 80 the columns of less value drop in their documented order while every `N ± M`, host name,
run id and header stays whole on one line, under 60 each row is a record. Then `agent bench` in
a real terminal, tmux at 80 columns, read from the pane."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console, RenderableType

from agent.commands.service import status_table as service_table
from agent.commands.temp import render as temp_view
from coordinator.commands.benchmark import cancel_table
from coordinator.commands.deploy import DEPLOY_FOLDS, results_table
from coordinator.commands.history import JOBS_FOLDS, STATS_FOLDS, history_tables
from coordinator.commands.policy import POLICY_FOLDS, policy_table
from coordinator.commands.runs import RUNS_FOLDS, runs_table
from coordinator.commands.status import STATUS_FOLDS, status_table
from coordinator.reports.compare import COMPARE_FOLDS, rich_comparison
from coordinator.telemetry.dashboard import GANG_FOLDS, gang_table
from coordinator.telemetry.gang_rows import GangRow
from shared.reports.benchmark import BENCH_FOLDS, rich_report
from shared.reports.doctor import doctor_table
from shared.reports.sustain import SUMMARY_FOLDS, WINDOW_FOLDS
from shared.tables import NATURAL, RECORD_WIDTH, FitTable
from tests.conftest import console_script

HOSTS = ("127.0.0.1:6110", "127.0.0.1:6120")
RUN_ID = "r-20261203-1347-3f2a"
FIGURE = re.compile(r"\d+\.\d+ ± \d+\.\d+")


def drawn(renderable: RenderableType, width: int) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text().splitlines()


def bench_cell(host: str, test: str, tokens: float, **more: Any) -> dict[str, Any]:
    return {
        "host": host,
        "name": f"small/f16 {test} b1",
        "model": "small",
        "bits": None,
        "test": test,
        "batch_size": 1,
        "tokens_per_sec": tokens,
        "std_tokens_per_sec": 4.8,
        "latency_ms": 12.3456,
        "std_latency_ms": 0.5,
        "peak_memory_gb": 1.234,
        "active_memory_gb": 0.5,
        "soc_temp_start_c": 45.2,
        "soc_temp_end_c": 60.1,
        "status": "ok",
        "flags": [],
        "verdict": "valid",
        "verdict_reasons": [],
        **more,
    }


def window(index: int, paused: bool) -> dict[str, Any]:
    return {
        "index": index,
        "start_s": 10.0 * index,
        "end_s": 10.0 * index + 10,
        "iterations": 12,
        "tokens_per_sec": 281.25,
        "celsius": 71.5,
        "watts": 14.2,
        "state": "pause" if paused else "ok",
        "paused": paused,
        "pause_s": 3.5,
    }


def bench_report() -> dict[str, Any]:
    sustain = {
        "windows": [window(0, False), window(1, True)],
        "first_tokens_per_sec": 300.5,
        "steady_tokens_per_sec": 281.25,
        "throttle_ratio": 0.94,
        "time_to_throttle_s": 12.0,
        "temp_rise_c": 8.5,
        "mean_power_w": 14.2,
        "pause_s": 3.5,
        "stopped": None,
    }
    failed = "the agent ran out of memory while building the model and gave up"
    cells = [
        bench_cell(HOSTS[0], "pp32", 335.39, energy_source="sim", power_w=14.2),
        bench_cell(HOSTS[1], "tg16", 35.39, status="failed", error=failed),
        bench_cell(HOSTS[0], "tg16", 36.01, sustain=sustain),
    ]
    return {"hosts": [{"host": host} for host in HOSTS], "cells": cells}


def stats_row(host: str) -> dict[str, Any]:
    return {
        "host": host,
        "simulated": True,
        "read_from": [{"source": "sim", "sensor": None, "readings": 120}],
        "samples": 1200,
        "first": 1_796_300_000.0,
        "last": 1_796_307_200.0,
        "min_c": 41.5,
        "mean_c": 63.25,
        "max_c": 88.75,
        "policy": {"max_speed_temp": 95, "pause_temp": 114, "stop_temp": 120, "origin": "smc"},
        "seconds_above": {"max_speed_temp": 600.0, "pause_temp": 90.0, "stop_temp": 0.0},
        "seconds_paused": 91.0,
        "pauses": 2,
        "stops": 0,
        "energy_j": 36000.0,
        "mean_power_w": 14.25,
        "power_simulated": True,
    }


def job_row(host: str) -> dict[str, Any]:
    return {
        "host": host,
        "job": "j-7f3a9c2e",
        "readable": True,
        "ended": 1_796_307_000.0,
        "wall_s": 3600.0,
        "paused_s": 91.0,
        "max_celsius": 88.75,
        "energy_j": 51000.0,
        "tok_s_first": 310.0,
        "tok_s_last": 281.0,
        "throttle": 0.91,
        "last_pause": "pause_temp 114 °C reached at 114.2 °C (smc · TCMz)",
    }


def compare_rows() -> list[dict[str, Any]]:
    side = {"tokens_per_sec": 335.39, "std_tokens_per_sec": 4.8, "cells": 1, "metered": True}
    side |= {"tokens_per_joule": 23.6, "energy_simulated": True, "power_w": 14.2}
    row = {"hosts": ", ".join(HOSTS), "model": "small/f16", "batch": 1, "test": "pp32"}
    row |= {"a": side, "b": {**side, "tokens_per_sec": 342.51}, "speedup": 1.02}
    return [row | {"within_noise": True, "note": "settings differ: power_mode low vs high"}]


def status_rows() -> list[dict[str, Any]]:
    up = {
        "host": HOSTS[0],
        "reachable": True,
        "agent": "0.4.0",
        "device": "Apple M2 Max",
        "hardware": "Mac14,6, 38-core GPU, 8P+4E, Metal working set 21.3 GiB",
        "memory_gb": 32.0,
        "memory_gib": 32,
        "thermal_source": "smc",
        "sensor": "TCMz",
        "celsius": 70.25,
        "pressure": None,
        "simulated": True,
        "job": {"id": "j-7f3a9c2e", "done": 3, "total": 8},
    }
    down = {"host": HOSTS[1], "reachable": False, "error": "connection refused: no agent there"}
    return [up, down]


def policy_rows() -> list[dict[str, Any]]:
    policy = {"max_speed_temp": 95, "pause_temp": 114, "stop_temp": 120}
    policy |= {"hysteresis": 5, "pause_duration": 30}
    shown = {"host": HOSTS[0], "result": "shown", "policy": policy, "origin": "defaults for smc"}
    refused = {"host": HOSTS[1], "result": "refused", "policy": None, "origin": None}
    refused["error"] = "pause_temp 130 is above stop_temp 120: thresholds out of order"
    return [{**shown, "error": None}, refused]


def doctor_hosts() -> list[dict[str, Any]]:
    checks = [
        {"name": "python", "ok": True, "required": True, "detail": "3.11.9", "fix": None},
        {
            "name": "thermal source",
            "ok": False,
            "required": False,
            "detail": "no SMC on Linux: the cooling policy cannot act here",
            "fix": "run on an Apple Silicon Mac",
        },
    ]
    return [{"host": host, "report": {"checks": checks}} for host in HOSTS]


def runs_rows() -> list[dict[str, Any]]:
    run = {"id": RUN_ID, "kind": "benchmark", "started": "2026-12-03T13:47:00+00:00"}
    run |= {"finished": "2026-12-03T13:52:10+00:00", "status": "ok", "interrupted": False}
    return [run | {"hosts": list(HOSTS), "ok": 12, "failed": 0}]


def cancel_rows() -> list[dict[str, Any]]:
    cancelled = {"host": HOSTS[0], "job": "j-7f3a9c2e", "result": "cancelled", "error": None}
    refused = {"host": HOSTS[1], "job": None, "result": "unreachable"}
    refused["error"] = "connection refused: no agent listening on 127.0.0.1:6120 after 3 tries"
    return [cancelled, refused]


def deploy_results() -> list[dict[str, object]]:
    done = ["check python", "copy wheel", "install wheel", "write service", "restart service"]
    ok = {"host": HOSTS[0], "ok": True, "failed": None, "done": done, "service": "launchd user"}
    failed = {"host": HOSTS[1], "ok": False, "failed": "install wheel", "done": done[:2]}
    failed["error"] = "pip: No matching distribution found for mlx>=0.20 (Python 3.9.6 too old)"
    return [{**ok, "error": None}, failed]


def gang_rows_shown() -> list[GangRow]:
    cause = {"host": HOSTS[1], "rank": 1, "celsius": 96.4, "source": "smc", "sensor": "TCMz"}
    row = GangRow("lora-7f3a", 4, "ring", ranks={0: HOSTS[0], 1: HOSTS[1]})
    row.hottest, row.state, row.cause = (96.4, HOSTS[1], "smc · TCMz"), "reduce_batch", cause
    return [row]


CASES: dict[str, Callable[[], RenderableType]] = {
    "agent bench / benchmark / show": lambda: rich_report(bench_report()),
    "compare": lambda: rich_comparison(compare_rows(), RUN_ID, "r-20261203-1400-aa01"),
    "history": lambda: history_tables(
        {"hosts": [stats_row(h) for h in HOSTS], "jobs": [job_row(h) for h in HOSTS]},
        1_796_300_000.0,
    ),
    "runs": lambda: runs_table(runs_rows()),
    "policy": lambda: policy_table(policy_rows()),
    "status": lambda: status_table(status_rows()),
    "doctor": lambda: doctor_table(doctor_hosts()),
    "cancel": lambda: cancel_table(cancel_rows()),
    "deploy": lambda: results_table(deploy_results()),
    "gang": lambda: gang_table(gang_rows_shown()),
}
WHOLE = (*HOSTS, RUN_ID, "latency ms", "j-7f3a9c2e", "pause ≥ °C", "lora-7f3a (ring)", "96.4")


def every_table(renderable: RenderableType) -> list[FitTable]:
    found = [renderable] if isinstance(renderable, FitTable) else []
    for part in getattr(renderable, "renderables", []):
        found += every_table(part)
    return found


def headers(renderable: RenderableType) -> list[str]:
    return [str(column.header) for table in every_table(renderable) for column in table.columns]


def figures(renderable: RenderableType) -> set[str]:
    """Every `N ± M` in the table's cells."""
    return {
        match
        for table in every_table(renderable)
        for column in table.columns
        for cell in column.cells
        for match in FIGURE.findall(str(getattr(cell, "plain", cell)))
    }


def whole_on_a_line(lines: list[str], words: set[str]) -> list[str]:
    """The `words` that no line holds whole."""
    return sorted(word for word in words if not any(word in line for line in lines))


@pytest.mark.parametrize("name", CASES)
def test_at_200_columns_nothing_folds(name: str) -> None:
    build = CASES[name]
    lines = drawn(build(), 200)
    text = "\n".join(lines)
    assert "not shown at" not in text
    assert all(len(line) <= 200 for line in lines)
    missing = [header for header in headers(build()) if header and header not in text]
    assert missing == []


def drawn_headers(lines: list[str]) -> list[list[str]]:
    """The headers each drawn table shows, table by table (a header is one line: never
    wrapped)."""
    return [
        [cell.strip() for cell in line.strip("┃").split("┃")]
        for line in lines
        if line.startswith("┃")
    ]


def check_fit(renderable: RenderableType, width: int) -> list[str]:
    """Draw at `width`: each table's dropped columns are the first of its fold order, and every
    `N ± M` of its shown columns is whole on a line; the lines drawn."""
    lines = drawn(renderable, width)
    screen = "\n".join(lines)
    assert all(len(line) <= width for line in lines), screen
    tables = every_table(renderable)
    shown_headers = drawn_headers(lines)
    assert len(shown_headers) == len(tables), screen
    for table, shown in zip(tables, shown_headers, strict=True):
        names = [str(column.header) for column in table.columns]
        dropped = [name for name in names if name not in shown]
        order = [name for name in table.fold_order if name in names]
        assert sorted(dropped) == sorted(order[: len(dropped)]), screen
        assert not dropped or f"not shown at {width} columns:" in screen
        numbers = {
            match
            for column in table.columns
            if str(column.header) in shown
            for cell in column.cells
            for match in FIGURE.findall(str(getattr(cell, "plain", cell)))
        }
        assert whole_on_a_line(lines, numbers) == [], screen
    return lines


@pytest.mark.parametrize("name", CASES)
def test_at_80_columns_figures_hosts_and_ids_stay_whole(name: str) -> None:
    build = CASES[name]
    lines = check_fit(build(), 80)
    screen = "\n".join(lines)
    kept = {word for word in WHOLE if word in "\n".join(drawn(build(), 200))}
    begun = {word for word in kept if word[:6] in screen}  # the rest went with their column
    assert whole_on_a_line(lines, begun) == [], screen
    if name != "compare":  # its hosts are the one column of them that folds
        assert begun == kept


@pytest.mark.parametrize("width", [90, 100, 120, 140, 170])
def test_every_width_between_folds_in_order(width: int) -> None:
    for build in CASES.values():
        check_fit(build(), width)


def test_the_benchmark_table_keeps_its_essentials_at_80() -> None:
    lines = drawn(rich_report(bench_report()), 80)
    header = drawn_headers(lines)[0]
    assert header == ["host", "model", "test", "tok/s", "verdict", "flags"]
    assert "335.39 ± 4.80" in "\n".join(lines) and "FAILED: the" in "\n".join(lines)


@pytest.mark.parametrize("name", CASES)
def test_under_60_columns_each_row_is_a_record(name: str) -> None:
    build = CASES[name]
    lines = drawn(build(), RECORD_WIDTH - 10)
    assert not any(line.startswith(("┃", "│")) for line in lines), "\n".join(lines)
    assert whole_on_a_line(lines, figures(build())) == []
    assert all(len(line) <= RECORD_WIDTH - 10 for line in lines)


DOCUMENTED = {
    "benchmark": BENCH_FOLDS,
    "sustained summary": SUMMARY_FOLDS,
    "sustained windows": WINDOW_FOLDS,
    "`compare`": COMPARE_FOLDS,
    "`history` hosts": STATS_FOLDS,
    "`history` jobs": JOBS_FOLDS,
    "`runs`": RUNS_FOLDS,
    "`policy`": POLICY_FOLDS,
    "`status`": STATUS_FOLDS,
    "`deploy`": DEPLOY_FOLDS,
    "distributed jobs": GANG_FOLDS,
}


def test_the_docs_give_each_tables_fold_order() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "monitoring.md").read_text(encoding="utf-8")
    section = doc.split("## Tables at any width", 1)[1]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ")]
    found = {row[0].removeprefix("| ").split(" (")[0]: tuple(row[1].split(", ")) for row in rows}
    assert {name: found.get(name) for name in DOCUMENTED} == DOCUMENTED


def test_a_pipe_gets_the_natural_width() -> None:
    """print_rich sizes a pipe by the table's measure: the table unfolded, every column."""
    table = runs_table(runs_rows())
    natural = Console(width=NATURAL, file=io.StringIO()).measure(table).maximum
    lines = drawn(table, natural)
    assert natural > 80 and max(len(line) for line in lines) == natural
    assert drawn_headers(lines)[0] == [str(column.header) for column in table.columns]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux for a real terminal")
@pytest.mark.timeout(180)
@pytest.mark.slow
def test_agent_bench_reads_whole_in_a_tmux_pane_80_wide(tmp_path: Path) -> None:
    tmux = ["tmux", "-S", str(tmp_path / "tmux.sock")]
    done = tmp_path / "done"
    bench = (
        f"env -u COLUMNS -u LINES MLX_FLEET_HOME={tmp_path / 'home'} "
        f"{console_script('agent')} bench --config-small "
        f"-p 16 -n 4 -r 2 -w 0; touch {done}; sleep 600"
    )
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "bench", "-x", "80", "-y", "60", bench],
        check=True,
        timeout=10,
    )
    try:
        deadline = time.monotonic() + 150
        while not done.exists():
            assert time.monotonic() < deadline, "agent bench did not finish"
            time.sleep(0.5)
        pane = subprocess.run(
            [*tmux, "capture-pane", "-p", "-J", "-t", "bench", "-S", "-200"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.splitlines()
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=10)
    rows = [line for line in pane if line.startswith("│") and "small/" in line]
    assert rows, "\n".join(pane)
    assert all(FIGURE.search(row) for row in rows), "\n".join(pane)
    table = [line for line in pane if line[:1] in "┏┃┡│└"]
    assert all(len(line) <= 80 for line in table), "\n".join(pane)  # log lines may run on


def service_report() -> dict[str, Any]:
    logs = [
        "/Users/lab/Library/Logs/mlx-fleet/agent.out.log",
        "/Users/lab/Library/Logs/mlx-fleet/agent.err.log",
    ]
    return {
        "flavour": "launchd",
        "scope": "user",
        "definition": "/Users/lab/Library/LaunchAgents/io.github.mlx-fleet.agent.plist",
        "installed": True,
        "loaded": "gui/501",
        "running": True,
        "pid": 48213,
        "last_exit": 0,
        "logs": logs,
    }


def temp_snapshot() -> dict[str, Any]:
    policy = {"max_speed_temp": 95, "pause_temp": 114, "stop_temp": 120}
    return {
        "source": "smc",
        "kind": "sensor",
        "celsius": 70.25,
        "sensor": "TCMz",
        "pressure": "nominal",
        "sensors": {"TCMz": 70.25, "TC0P": 64.125, "Tp09": 58.5},
        "time": "2026-12-03T13:47:00.125+00:00",
        "state": "ok",
        "reason": None,
        "policy": policy,
        "policy_origin": "defaults for smc, calibrated for Mac14,6 (M2 Max) on 2026-11-30",
    }


FIELD_LISTS: dict[str, tuple[Callable[[], RenderableType], tuple[str, ...]]] = {
    "agent service status": (lambda: service_table(service_report()), ("48213", "gui/501")),
    "agent temp": (
        lambda: temp_view(temp_snapshot(), [69.5, 70.0, 70.25], 0.75),
        ("70.2", "64.12", "58.50", "+0.8 °C/min", "2026-12-03T13:47:00.125+00:00", "reduce ≥ 95"),
    ),
}
"""The header-less `field  value` tables, and the figures each must keep whole."""


@pytest.mark.parametrize("width", [RECORD_WIDTH - 10, 80, 200])
@pytest.mark.parametrize("name", FIELD_LISTS)
def test_field_lists_keep_each_field_and_figure_on_one_line(name: str, width: int) -> None:
    build, words = FIELD_LISTS[name]
    lines = drawn(build(), width)
    screen = "\n".join(lines)
    assert all(len(line) <= width for line in lines), screen
    assert whole_on_a_line(lines, set(words)) == [], screen
    (table,) = every_table(build())
    fields = {str(getattr(cell, "plain", cell)).strip() for cell in table.columns[0].cells}
    assert whole_on_a_line(lines, fields) == [], screen
    assert "not shown at" not in screen
