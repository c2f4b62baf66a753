"""Boot times (agent.awake.boot) from captured text, and reboots during a run
(shared.benchmark.reboots)."""

from __future__ import annotations

from pathlib import Path

from agent.awake.boot import boot_time, parse_proc_stat, parse_sysctl
from shared.benchmark.reboots import rebooted, rebooted_hosts
from shared.reports.benchmark import header_lines

SYSCTL = "{ sec = 1733112345, usec = 123000 } Mon Dec  2 04:05:45 2024\n"
"""`sysctl -n kern.boottime` as macOS prints it (the struct timeval, then ctime's text)."""
PROC_STAT = "cpu  1 2 3 4\nintr 5\nctxt 6\nbtime 1733112345\nprocesses 7\n"


def test_boot_time_parses() -> None:
    assert parse_sysctl(SYSCTL) == 1733112345.123
    assert parse_sysctl("kern.boottime: unknown oid") is None
    assert parse_proc_stat(PROC_STAT) == 1733112345.0
    assert parse_proc_stat("cpu 1 2\n") is None


def test_boot_time_reads_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(PROC_STAT)
    assert boot_time(stat) in (1733112345.0, boot_time())  # macOS reads sysctl instead
    assert boot_time(tmp_path / "missing") in (None, boot_time())


def test_a_boot_time_that_moves_is_a_reboot() -> None:
    same = [{"host": "a", "boot_time": 1000.0}, {"host": "a", "boot_time": 1001.0}]
    assert not rebooted(same)
    moved = [*same, {"host": "b", "boot_time": 5.0}, {"host": "a", "boot_time": 4600.0}]
    assert rebooted_hosts(moved) == ["a"]
    assert not rebooted([{"boot_time": None}, {"boot_time": 3.0}])
    report = {"cells": [{"boot_time": 1000.0}, {"boot_time": 4600.0}]}
    assert "the machine rebooted during it" in header_lines(report)
