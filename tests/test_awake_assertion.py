"""agent.awake.assertion: the ctypes tables against Apple's C prototypes, and the Linux
systemd-inhibit path with a fake systemd-inhibit on PATH."""

from __future__ import annotations

import ctypes
import os
import re
import sys
import time
from pathlib import Path

import pytest

from agent.awake import assertion
from agent.awake.assertion import (
    CORE_FOUNDATION_FUNCTIONS,
    IOKIT_FUNCTIONS,
    held,
    hold_awake,
)
from tests.conftest import alive

# Verbatim from IOKit's IOPMLib.h (IOPMAssertionCreateWithName, IOPMAssertionRelease) and
# CoreFoundation's CFString.h / CFBase.h.
PROTOTYPES = """
IOReturn IOPMAssertionCreateWithName(
    CFStringRef          AssertionType,
    IOPMAssertionLevel   AssertionLevel,
    CFStringRef          AssertionName,
    IOPMAssertionID      *AssertionID);
IOReturn IOPMAssertionRelease(IOPMAssertionID AssertionID);
CFStringRef CFStringCreateWithCString(CFAllocatorRef alloc, const char *cStr,
    CFStringEncoding encoding);
void CFRelease(CFTypeRef cf);
"""
C_TYPES = {
    # IOReturn.h: typedef kern_return_t IOReturn; mach/kern_return.h: typedef int kern_return_t
    "IOReturn": ctypes.c_int32,
    # IOPMLib.h: typedef uint32_t IOPMAssertionLevel; typedef uint32_t IOPMAssertionID
    "IOPMAssertionLevel": ctypes.c_uint32,
    "IOPMAssertionID": ctypes.c_uint32,
    # CFString.h: typedef UInt32 CFStringEncoding
    "CFStringEncoding": ctypes.c_uint32,
    # CFBase.h: every *Ref is a pointer
    "CFStringRef": ctypes.c_void_p,
    "CFAllocatorRef": ctypes.c_void_p,
    "CFTypeRef": ctypes.c_void_p,
    "const char *": ctypes.c_char_p,
    "void": None,
}


def ctype(declared: str) -> object:
    declared = " ".join(declared.split())
    if declared in C_TYPES:
        return C_TYPES[declared]
    if declared.endswith("*"):
        return ctypes.POINTER(C_TYPES[declared[:-1].strip()])  # type: ignore[arg-type]
    raise AssertionError(f"no ctypes mapping for {declared!r}")


def parse(prototypes: str) -> dict[str, tuple[object, tuple[object, ...]]]:
    """name -> (restype, argtypes) for each `RET NAME(TYPE NAME, ...);` declaration."""
    table = {}
    for ret, name, params in re.findall(r"(\w+)\s+(\w+)\s*\(([^)]*)\)\s*;", prototypes):
        args = []
        for param in params.split(","):
            found = re.fullmatch(r"\s*(.*?[\s*])(\w+)\s*", param, re.S)
            assert found, param
            args.append(ctype(found.group(1).replace("*", " *")))
        table[name] = (ctype(ret), tuple(args))
    return table


def test_ctypes_tables_match_the_c_prototypes() -> None:
    expected = parse(PROTOTYPES)
    assert set(expected) == {
        "IOPMAssertionCreateWithName",
        "IOPMAssertionRelease",
        "CFStringCreateWithCString",
        "CFRelease",
    }
    assert expected == {**IOKIT_FUNCTIONS, **CORE_FOUNDATION_FUNCTIONS}


def test_never_a_display_assertion() -> None:
    assert assertion.ASSERTION_TYPE == "PreventUserIdleSystemSleep"
    assert "Display" not in assertion.ASSERTION_TYPE
    assert assertion.K_IOPM_ASSERTION_LEVEL_ON == 255


RECORDING_FAKE = """#!/bin/sh
printf '%s\\n' "$$" "$@" > "$FAKE_INHIBIT_LOG"
exec cat
"""
# systemd-inhibit refused by polkit/logind prints "Failed to inhibit: Access denied" and exits 1
# (systemd src/login/inhibit.c: log_error_errno(r, "Failed to inhibit: %s", ...); return r).
FAILING_FAKE = """#!/bin/sh
echo "Failed to inhibit: Access denied" >&2
exit 1
"""


@pytest.fixture
def systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    runtime = tmp_path / "run-systemd-system"
    runtime.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_INHIBIT_LOG", str(tmp_path / "argv"))
    return runtime


def install(runtime: Path, script: str) -> None:
    fake = runtime.parent / "bin" / "systemd-inhibit"
    fake.write_text(script)
    fake.chmod(0o755)


def wait_for(condition, deadline_s: float = 8.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_systemd_inhibit_held_inside_and_released_after(systemd: Path) -> None:
    install(systemd, RECORDING_FAKE)
    log = Path(os.environ["FAKE_INHIBIT_LOG"])
    assert held() is None
    with hold_awake("benchmark job", platform="linux", systemd_runtime=systemd) as what:
        assert wait_for(log.exists)
        assert wait_for(lambda: len(log.read_text().splitlines()) > 1)
        pid, *argv = log.read_text().splitlines()
        assert held() == what == f"systemd-inhibit sleep:idle (pid {pid})"
        assert alive(int(pid))
        assert "--what=sleep:idle" in argv
        assert "--mode=block" in argv
        assert "--why=benchmark job" in argv
        assert not any("handle-lid" in arg or "display" in arg for arg in argv)
    assert held() is None
    assert wait_for(lambda: not alive(int(pid)))


def test_failure_still_runs_the_body_and_says_so_once(
    systemd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    install(systemd, FAILING_FAKE)
    ran = False
    with hold_awake("benchmark job", platform="linux", systemd_runtime=systemd):
        ran = True
        now = held()
        assert now is not None and now.startswith("failed: ")
        assert "Access denied" in now
    assert ran
    assert held() is None
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("mlx-fleet: cannot keep the machine awake: ")
    assert "Access denied" in lines[0]


def test_no_systemd_is_not_available(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    absent = tmp_path / "no-such-dir"
    with hold_awake("agent run", platform="linux", systemd_runtime=absent):
        assert held() == f"not available: no systemd ({absent} absent)"
    assert held() is None
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(sys.platform != "darwin", reason="IOKit exists only on macOS")
def test_iokit_assertion_on_a_mac() -> None:
    with hold_awake("test") as what:
        assert what == 'IOKit PreventUserIdleSystemSleep "mlx-fleet: test"'
