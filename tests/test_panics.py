"""Kernel panic reports (agent.awake.panics) from public reports' panic strings
(tests/fixtures/README.md): parsed in both layouts, scanned by modification time, carried by
records, checked by a coordinator, listed under a reboot in the report, and counted by
`agent doctor`."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from agent.awake.panics import BOOT_SLACK_S, MAX_READ, RECENT_S, parse, read, scan, since_boot
from agent.doctor.capture import boot_facts, machine_facts
from agent.doctor.checks import panic_check
from shared.benchmark.reboots import MAX_PANICS, PANIC_TEXT_CAP, reboot_panics
from shared.reports.benchmark import NO_PANIC_REPORT, header_lines, render_text
from shared.shapes import Invalid
from shared.wire.agent_shapes import check_agent_body, salvaged_record
from tests.fleet_support import cli
from tests.test_agent_shapes import RECORD, cell
from tests.test_doctor import free_port

FIXTURES = Path(__file__).parent / "fixtures" / "panics"
IOGPU = "panic-full-2026-04-24-101503.0002.panic"
WATCHDOG = "panic-full-2026-04-19-024710.0001.panic"
OLD = "Kernel_2018-08-08-221522_MacBook-Pro.panic"
IOGPU_LINE = (
    'panic(cpu 8 caller 0xfffffe00513bbe28): "completeMemory() prepare count underflow" '
    "@IOGPUMemory.cpp:550"
)
WATCHDOG_LINE = (
    "panic(cpu 23 caller 0xfffffe003848c02c): watchdog timeout: no checkins from watchdogd in "
    "92 seconds (11276 total checkins since monitoring last enabled)"
)
SYSCTL = "{ sec = 1733112345, usec = 123000 } Mon Dec  2 04:05:45 2024\n"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def placed(directory: Path, name: str, mtime: float, text: str | None = None) -> Path:
    """A report in `directory` modified at `mtime`: a fixture's text, or `text`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(fixture(name) if text is None else text, encoding="utf-8")
    os.utime(path, (mtime, mtime))
    return path


def test_each_fixture_parses_to_its_panic_line_and_time() -> None:
    assert parse(fixture(IOGPU)) == (
        IOGPU_LINE,
        datetime(2026, 4, 24, 17, 15, 3, tzinfo=timezone.utc).timestamp(),
    )
    assert parse(fixture(WATCHDOG)) == (
        WATCHDOG_LINE,
        datetime(2026, 4, 19, 6, 47, 10, tzinfo=timezone.utc).timestamp(),
    )
    line, when = parse(fixture(OLD))  # plain text: the ctime line is the Mac's local time
    assert line is not None and len(line) == PANIC_TEXT_CAP
    assert line.startswith('panic(cpu 1 caller 0xffffff7f8b9a09e9): "GPU Panic: mux-regs 5 3 7f')
    assert when == time.mktime((2018, 8, 8, 22, 15, 22, 0, 0, -1))


def test_an_intel_macs_report_gives_its_macos_panic_string_not_its_t2s() -> None:
    header = '{"bug_type":"210","timestamp":"2021-03-02 09:00:00 +0000"}'
    body = {"panicString": "panic(cpu 0): bridgeOS", "macOSPanicString": "\npanic(cpu 2): macOS\n"}
    assert parse(f"{header}\n{json.dumps(body)}") == ("panic(cpu 2): macOS", 1614675600.0)


def test_a_report_cut_at_the_read_limit_still_gives_its_panic_string(tmp_path: Path) -> None:
    """The process table follows the panic string and runs to megabytes: the first MAX_READ
    bytes are read, no longer JSON, and the string is found by its literal; a header without
    a timestamp gives the body's `date`."""
    header, _, body = fixture(IOGPU).partition("\n")
    table = ",".join(f'"{pid}":{{"procname":"p{pid}"}}' for pid in range(200_000))
    header = header.replace('"timestamp"', '"stamp"')
    path = tmp_path / "big.panic"
    path.write_text(f'{header}\n{body.rstrip().rstrip("}")},"processByPid":{{{table}}}}}\n')
    assert path.stat().st_size > 2 * MAX_READ
    line, when = read(path)
    assert line == IOGPU_LINE
    assert when == datetime(2026, 4, 24, 17, 15, 3, 410000, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "not a panic report at all\n",
        '{"bug_type":"210"}\n',
        '{"bug_type":"210"}\n{"panicString": 42}\n',
        '{"bug_type":"210","timestamp":"yesterday"}\n{"panicString":"\\ud800 broken',
        "[1, 2]\n{}\n",
        '{"bug_type":"210"}\n' + "{" * 100_000,
        "Sun Jan 32 99:99:99 2018\npanic(cpu 0): x\n",
    ],
)
def test_a_malformed_report_parses_to_what_it_holds_and_never_raises(text: str) -> None:
    line, when = parse(text)
    assert line is None or line.startswith("panic(")
    assert when is None


def test_garbage_and_huge_files_are_read_bounded(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.panic"
    garbage.write_bytes(bytes(range(256)) * 256)
    assert read(garbage) == (None, None)
    huge = tmp_path / "huge.panic"
    with huge.open("wb") as out:
        out.write(b"panic(cpu 0 caller 0x1): " + b"A" * (MAX_READ * 3) + b"\n")
    line, _ = read(huge)
    assert line is not None and len(line) == PANIC_TEXT_CAP
    assert read(tmp_path / "missing.panic") == (None, None)


def test_a_scan_lists_the_panic_reports_modified_since_oldest_first(tmp_path: Path) -> None:
    reports, retired = tmp_path / "DiagnosticReports", tmp_path / "DiagnosticReports" / "Retired"
    placed(retired, OLD, 1_000.0)
    placed(reports, WATCHDOG, 2_000.0)
    placed(reports, IOGPU, 3_000.0)
    placed(reports, "python3_2026-04-24-101503.ips", 3_000.0, "{}")  # not a panic report
    (reports / "folder.panic").mkdir()
    directories = [reports, retired, tmp_path / "absent"]
    scanned = scan(0.0, directories)
    assert scanned.unreadable == [] and scanned.cannot_tell() is None, "absent: nothing there"
    found = scanned.reports
    assert [r["file"] for r in found] == [OLD, WATCHDOG, IOGPU]
    assert found[2] == {
        "file": IOGPU,
        "panic_string": IOGPU_LINE,
        "time": datetime(2026, 4, 24, 17, 15, 3, tzinfo=timezone.utc).timestamp(),
    }
    assert [r["file"] for r in scan(2_000.0, directories).reports] == [WATCHDOG, IOGPU]
    assert scan(3_000.5, directories).reports == []


def test_a_scan_keeps_the_newest_reports_and_finds_nothing_off_a_mac_unasked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(MAX_PANICS + 4):
        placed(tmp_path, f"Kernel-{n:02d}.panic", 100.0 + n, "panic(cpu 0): x\n")
    found = scan(0.0, [tmp_path]).reports
    assert len(found) == MAX_PANICS and found[-1]["file"] == f"Kernel-{MAX_PANICS + 3:02d}.panic"
    assert found[0]["file"] == "Kernel-04.panic"
    monkeypatch.setattr(sys, "platform", "linux")
    assert scan(0.0).reports == []


def test_a_record_carries_the_reports_of_this_boot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """macOS writes a panic's report on the next boot: those written since this boot (less
    BOOT_SLACK_S) are the panic that ended the boot before."""
    boot = 10_000.0
    placed(tmp_path, OLD, boot - 2 * BOOT_SLACK_S)
    placed(tmp_path, IOGPU, boot + 30.0)
    assert since_boot(None, [tmp_path]) is None
    assert [r["file"] for r in since_boot(boot, [tmp_path]) or []] == [IOGPU]
    monkeypatch.setattr(sys, "platform", "linux")
    assert since_boot(boot) is None, "off a Mac, nowhere to look: no key at all"
    assert since_boot(boot + 3600, [tmp_path]) is None
    monkeypatch.setattr(sys, "platform", "darwin")
    assert since_boot(boot + 3600, [tmp_path]) == [], "on a Mac: looked, found none"


def unlistable(root: Path) -> Path:
    """A report folder that is there but cannot be listed, for root too: a file where the
    folder should be (NotADirectoryError). Root reads a mode-0 folder, so a permission test
    needs another user: test_a_folder_the_service_account_cannot_list_is_cannot_tell."""
    path = root / "DiagnosticReports"
    path.write_text("not a folder", encoding="utf-8")
    return path


def test_a_folder_that_cannot_be_listed_is_cannot_tell_not_no_panics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = unlistable(tmp_path)
    scanned = scan(0.0, [folder, tmp_path / "absent"])
    assert scanned.reports == [] and scanned.unreadable == [f"{folder}: Not a directory"]
    assert scanned.cannot_tell() == f"cannot tell: cannot read {folder}: Not a directory"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert since_boot(0.0, [folder]) is None, "cannot tell: no `panics` in the record"
    readable = tmp_path / "readable"
    placed(readable, IOGPU, 100.0)
    assert [r["file"] for r in since_boot(0.0, [folder, readable]) or []] == [IOGPU]
    check = panic_check([folder], 1_000.0)
    assert not check.ok and not check.required and check.detail == scanned.cannot_tell()
    assert check.fix is not None and "sudo ls" in check.fix
    both = panic_check([folder, readable], 1_000.0)
    assert both.detail.startswith(f"at least 1; the latest {IOGPU}: ")
    assert both.detail.endswith(f"({scanned.cannot_tell()})")


def scan_as_nobody(folder: Path) -> dict[str, Any]:
    """scan() in a forked child that dropped root for nobody (uid/gid 65534), as a service
    account outside the folder's group: the kernel refuses its listing, as macOS refuses a
    standard account the root-owned /Library/Logs/DiagnosticReports (mac-desk-check.md N12)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            found = scan(0.0, [folder])
            os.write(write_end, json.dumps(asdict(found)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        told = reader.read()
    os.waitpid(pid, 0)
    return json.loads(told)


NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")
def test_a_folder_the_service_account_cannot_list_is_cannot_tell() -> None:
    top = Path(tempfile.mkdtemp(prefix="panics-"))  # not under pytest's root-only tmp folder
    try:
        top.chmod(0o755)
        folder = top / "DiagnosticReports"
        folder.mkdir(mode=0o700)
        placed(folder, IOGPU, 100.0)
        assert [r["file"] for r in scan(0.0, [folder]).reports] == [IOGPU], "root lists it"
        as_nobody = scan_as_nobody(folder)
        assert as_nobody == {"reports": [], "unreadable": [f"{folder}: Permission denied"]}
    finally:
        shutil.rmtree(top)


PANIC = {"file": IOGPU, "panic_string": IOGPU_LINE, "time": 1777050903.0}


@pytest.mark.parametrize(
    ("panics", "problem"),
    [
        ("none", "record.panics is a str, not a list"),
        ([PANIC] * (MAX_PANICS + 1), f"more than {MAX_PANICS}"),
        ([None], "record.panics[0] is nil, not a map"),
        ([{"panic_string": None, "time": None}], "record.panics[0].file is missing"),
        ([PANIC | {"file": ""}], "record.panics[0].file has 0 characters"),
        ([PANIC | {"file": "x" * 256}], "record.panics[0].file has 256 characters"),
        ([PANIC | {"panic_string": "p" * 201}], "panic_string has 201 characters"),
        ([PANIC | {"panic_string": 7}], "record.panics[0].panic_string is a int"),
        ([PANIC | {"time": -1.0}], "record.panics[0].time is -1"),
        ([PANIC | {"time": float("nan")}], "record.panics[0].time is nan"),
        ([PANIC | {"backtrace": "..."}], "unknown field 'backtrace'"),
    ],
)
def test_a_coordinator_refuses_panics_that_are_not_a_few_small_reports(
    panics: Any, problem: str
) -> None:
    check_agent_body("bench.cell", cell(panics=[PANIC, {**PANIC, "panic_string": None}]))
    check_agent_body("bench.cell", cell(panics=[]))
    with pytest.raises(Invalid) as refused:
        check_agent_body("bench.cell", cell(panics=panics))
    assert problem in str(refused.value)


def mac1(boot: float, panics: list[dict[str, Any]] | None) -> dict[str, Any]:
    record = RECORD | {"host": "mac1", "boot_time": boot}
    return record if panics is None else record | {"panics": panics}


def test_a_reboot_lists_the_panic_reports_written_after_it_escaped() -> None:
    """The report of a panic before the run is carried by every cell and is not this
    reboot's; a hostile panic string shows its escapes, never runs them."""
    before = {"file": OLD, "panic_string": "panic(cpu 1): long ago", "time": 1.0}
    hostile = {**PANIC, "panic_string": "panic(cpu 0): \x1b]52;c;SGk=\x07\u202e\nFAKE"}
    records = [
        mac1(1_000.0, [before]),
        mac1(9_000.0, [before, PANIC]),
        mac1(9_001.0, [before, PANIC, hostile | {"file": WATCHDOG}]),
        RECORD | {"host": "mac2", "boot_time": 5.0, "panics": [PANIC]},
    ]
    assert reboot_panics(records, "mac1") == [PANIC, hostile | {"file": WATCHDOG}]
    assert reboot_panics(records, "mac2") is None, "it did not reboot: no cell after"
    lines = header_lines({"hosts": [], "cells": records})
    assert f"mac1: the machine rebooted during it; panic report {IOGPU}: {IOGPU_LINE}" in lines
    assert f"  panic report {WATCHDOG}: panic(cpu 0): \\x1b]52;c;SGk=\\x07\\u202e FAKE" in lines
    assert not any("mac2" in line for line in lines)
    report = {"title": "t", "hosts": [{"host": "mac1", "machine": None}], "cells": records}
    for fmt in ("table", "md"):
        text = render_text(report, fmt)
        assert IOGPU in text and "\x1b" not in text and "\u202e" not in text, fmt
        assert not any(line.startswith("FAKE") for line in text.splitlines()), fmt


def test_a_reboot_without_a_new_report_says_so_on_a_mac_and_nothing_more_elsewhere() -> None:
    mac = [mac1(1_000.0, []), mac1(9_000.0, [])]
    assert header_lines({"cells": mac}) == [
        f"mac1: the machine rebooted during it; {NO_PANIC_REPORT}"
    ]
    linux = [mac1(1_000.0, None), mac1(9_000.0, None)]
    assert header_lines({"cells": linux}) == ["mac1: the machine rebooted during it"]
    unnamed = [{"boot_time": 1_000.0}, {"boot_time": 9_000.0, "panics": [PANIC]}]
    assert header_lines({"cells": unnamed}) == [
        f"the machine rebooted during it; panic report {IOGPU}: {IOGPU_LINE}"
    ]


def test_a_stored_record_keeps_its_panics_and_drops_bad_ones() -> None:
    kept = salvaged_record(mac1(1_000.0, [PANIC]))
    assert kept["panics"] == [PANIC] and kept["status"] == "ok"
    bad = salvaged_record(mac1(1_000.0, [PANIC | {"time": "soon"}]))
    assert bad["panics"] is None and bad["status"] == "failed"


def test_doctor_warns_of_the_panics_of_the_last_week(tmp_path: Path) -> None:
    now = 2_000_000.0
    assert panic_check([tmp_path], now).ok
    assert panic_check([tmp_path], now).detail == "none"
    placed(tmp_path, OLD, now - RECENT_S - 60)  # older than a week: not counted
    placed(tmp_path, WATCHDOG, now - 3 * 86400)
    placed(tmp_path, IOGPU, now - 3600)
    check = panic_check([tmp_path], now)
    assert check.name == "kernel panics (last 7 days)"
    assert not check.ok and not check.required, "a warning: the agent runs"
    assert check.detail == f"2; the latest {IOGPU}: {IOGPU_LINE}"
    assert check.fix is not None and "docs/reliability.md" in check.fix
    placed(tmp_path, "unreadable.panic", now, "\x00\x01")
    assert panic_check([tmp_path], now).detail.endswith("unreadable.panic: no panic string read")


@pytest.mark.skipif(sys.platform == "darwin", reason="a Mac lists its own panic reports")
@pytest.mark.slow
def test_agent_doctor_says_kernel_panics_are_not_applicable_off_a_mac() -> None:
    result = cli("agent", "doctor", "--format", "json", "--bind", f"0.0.0.0:{free_port()}")
    found = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    check = found["kernel panics (last 7 days)"]
    assert not check["ok"] and not check["required"]
    assert check["detail"].startswith("not applicable: not a Mac")


def test_a_capture_holds_the_sysctl_text_and_whether_it_agrees() -> None:
    assert boot_facts(SYSCTL, 1733112345.123) == {
        "boot_time": 1733112345.123,
        "sysctl": SYSCTL,
        "sysctl_parsed": 1733112345.123,
        "agrees": True,
    }
    assert boot_facts(SYSCTL, 1733112345.123 + 3600)["agrees"] is False
    assert boot_facts("kern.boottime: unknown oid", 5.0)["agrees"] is None
    assert boot_facts(None, None)["sysctl"] is None
    if sys.platform != "darwin":
        facts = machine_facts()
        assert facts["boot"]["sysctl"] is None and facts["panics"] == []
        json.dumps(facts)


def test_the_fixtures_are_copied_whole(tmp_path: Path) -> None:
    """Each fixture reads the same from a copy (no line ending or encoding of this checkout)."""
    for name in (IOGPU, WATCHDOG, OLD):
        copied = shutil.copy(FIXTURES / name, tmp_path / name)
        assert read(Path(copied)) == parse(fixture(name))
