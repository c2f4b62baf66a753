"""No sleep under a measurement: a power assertion held while a benchmark job or an `agent run`
job runs, so that idle system sleep never lands inside a timed window.

macOS: IOKit's power-management assertion, as Apple's IOPMLib.h declares it and as
`caffeinate -i` (and KeepingYouAwake, Stats) takes it: IOPMAssertionCreateWithName with
kIOPMAssertionTypePreventUserIdleSystemSleep at kIOPMAssertionLevelOn, named
"mlx-fleet: <reason>" so that `pmset -g assertions` shows who holds it, and
IOPMAssertionRelease at the end. Never a display assertion (PreventUserIdleDisplaySleep, what
`caffeinate -d` takes): a display kept on under a GPU-bound job is what triggers the GPU-watchdog
panics of atomantic/PortOS#1750, and a benchmark needs no screen.

Linux with systemd (`/run/systemd/system` exists, the test sd_booted(3) makes):
`systemd-inhibit --what=sleep:idle --mode=block ... cat` as a child whose stdin we hold: the
inhibitor lives while the pipe is open and ends when we close it, or when we die.

Elsewhere nothing is held, and held() says why. A failure to take the assertion never stops the
job: held() keeps the reason and one line goes to stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agent.sensors.macos_libs import CORE_FOUNDATION, IOKIT, bind, load

WHO = "mlx-fleet"
SYSTEMD_RUNTIME = Path("/run/systemd/system")
"""sd_booted(3): systemd is the init system iff this directory exists."""
ASSERTION_TYPE = "PreventUserIdleSystemSleep"
"""kIOPMAssertionTypePreventUserIdleSystemSleep (IOPMLib.h); never a display assertion."""
K_IOPM_ASSERTION_LEVEL_ON = 255
K_CF_STRING_ENCODING_UTF8 = 0x08000100
INHIBIT_WHAT = "sleep:idle"
STARTUP_S = 0.5
"""How long systemd-inhibit must stay up before it counts as holding its inhibitor."""
RELEASE_S = 5.0
"""How long systemd-inhibit gets to exit after its stdin closes, before it is killed."""

# The C prototypes these tables bind (tests/test_awake_assertion.py parses them and compares):
#   IOPMLib.h:  IOReturn IOPMAssertionCreateWithName(CFStringRef AssertionType,
#                   IOPMAssertionLevel AssertionLevel, CFStringRef AssertionName,
#                   IOPMAssertionID *AssertionID);
#               IOReturn IOPMAssertionRelease(IOPMAssertionID AssertionID);
#   CFString.h: CFStringRef CFStringCreateWithCString(CFAllocatorRef alloc, const char *cStr,
#                   CFStringEncoding encoding);
#   CFBase.h:   void CFRelease(CFTypeRef cf);
# IOReturn is kern_return_t (int); IOPMAssertionLevel, IOPMAssertionID and CFStringEncoding are
# 32-bit unsigned; every CF reference is a pointer, so c_void_p (the default int truncates it).
IOKIT_FUNCTIONS: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "IOPMAssertionCreateWithName": (
        ctypes.c_int32,
        (ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)),
    ),
    "IOPMAssertionRelease": (ctypes.c_int32, (ctypes.c_uint32,)),
}
CORE_FOUNDATION_FUNCTIONS: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "CFStringCreateWithCString": (
        ctypes.c_void_p,
        (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32),
    ),
    "CFRelease": (None, (ctypes.c_void_p,)),
}

_lock = threading.Lock()
_holding: list[str] = []

Release = Callable[[], None]


def held() -> str | None:
    """What this process holds right now, e.g. 'IOKit PreventUserIdleSystemSleep "mlx-fleet:
    benchmark job"', 'not available: ...', 'failed: ...'; None outside hold_awake."""
    with _lock:
        return _holding[-1] if _holding else None


def _bound(path: str, table: dict[str, tuple[Any, tuple[Any, ...]]]) -> dict[str, Any]:
    lib = load(path, "sleep assertion")
    return {name: bind(lib, name, restype, *args) for name, (restype, args) in table.items()}


def _iokit(reason: str) -> tuple[str, Release | None]:
    iokit = _bound(IOKIT, IOKIT_FUNCTIONS)
    cf = _bound(CORE_FOUNDATION, CORE_FOUNDATION_FUNCTIONS)
    name = f"{WHO}: {reason}"
    refs = [
        cf["CFStringCreateWithCString"](None, text.encode(), K_CF_STRING_ENCODING_UTF8)
        for text in (ASSERTION_TYPE, name)
    ]
    try:
        if not all(refs):
            return "failed: CFStringCreateWithCString returned NULL", None
        ident = ctypes.c_uint32(0)
        code = iokit["IOPMAssertionCreateWithName"](
            refs[0], K_IOPM_ASSERTION_LEVEL_ON, refs[1], ctypes.byref(ident)
        )
    finally:
        for ref in refs:
            if ref:
                cf["CFRelease"](ref)
    if code != 0:
        return f"failed: IOPMAssertionCreateWithName returned {code & 0xFFFFFFFF:#x}", None

    def release() -> None:
        code = iokit["IOPMAssertionRelease"](ident)
        if code != 0:
            _say(f"IOPMAssertionRelease returned {code & 0xFFFFFFFF:#x}")

    return f'IOKit {ASSERTION_TYPE} "{name}"', release


def _systemd(reason: str, runtime: Path) -> tuple[str, Release | None]:
    if not runtime.is_dir():
        return f"not available: no systemd ({runtime} absent)", None
    program = shutil.which("systemd-inhibit")
    if program is None:
        return "failed: systemd-inhibit not found on PATH", None
    child = subprocess.Popen(
        [
            program,
            f"--what={INHIBIT_WHAT}",
            f"--who={WHO}",
            f"--why={reason}",
            "--mode=block",
            "cat",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + STARTUP_S
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if child.returncode is not None:
        message = child.stderr.read().decode(errors="replace").strip() if child.stderr else ""
        if child.stdin:
            child.stdin.close()
        if child.stderr:
            child.stderr.close()
        last = message.splitlines()[-1] if message else "no message"
        return f"failed: systemd-inhibit exited {child.returncode}: {last}", None

    def release() -> None:
        with contextlib.suppress(OSError):
            if child.stdin:
                child.stdin.close()  # cat sees EOF; systemd-inhibit exits and drops the lock
        try:
            child.wait(RELEASE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if child.stderr:
            child.stderr.close()

    return f"systemd-inhibit {INHIBIT_WHAT} (pid {child.pid})", release


def _say(problem: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"{WHO}: cannot keep the machine awake: {problem}\n")
        sys.stderr.flush()


def _take(reason: str, platform: str, runtime: Path) -> tuple[str, Release | None]:
    try:
        if platform == "darwin":
            return _iokit(reason)
        if platform.startswith("linux"):
            return _systemd(reason, runtime)
        return f"not available: no power assertion on {platform}", None
    except Exception as exc:  # the job runs regardless; the reason is kept
        return f"failed: {type(exc).__name__}: {exc}", None


@contextlib.contextmanager
def hold_awake(
    reason: str, *, platform: str | None = None, systemd_runtime: Path = SYSTEMD_RUNTIME
) -> Iterator[str]:
    """Keep idle system sleep away while the body runs; yields what held() says. Never raises
    for a failure to take the assertion: the body runs, and one stderr line says why."""
    what, release = _take(reason, platform or sys.platform, systemd_runtime)
    if what.startswith("failed: "):
        _say(what.removeprefix("failed: "))
    with _lock:
        _holding.append(what)
    try:
        yield what
    finally:
        with _lock:
            _holding.remove(what)
        if release is not None:
            try:
                release()
            except Exception as exc:  # releasing never turns a job's result into an error
                _say(f"release failed: {type(exc).__name__}: {exc}")
