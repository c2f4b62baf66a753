"""When this machine booted (epoch seconds): each cell records it, and boot times that differ
between the cells of one run mean the machine rebooted during it (shared.benchmark.reboots).

macOS: sysctl kern.boottime, a struct timeval (sysctl(3); `sysctl -n kern.boottime` prints it as
`{ sec = 1733112345, usec = 123 } Mon Dec  2 ...`), read with sysctlbyname through ctypes.
Linux: /proc/stat's `btime` line (proc(5)), whole seconds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import sys
from pathlib import Path

PROC_STAT = Path("/proc/stat")
_TIMEVAL = re.compile(r"\{\s*sec\s*=\s*(\d+),\s*usec\s*=\s*(\d+)\s*\}")


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


def parse_sysctl(text: str) -> float | None:
    """`sysctl -n kern.boottime`'s output -> epoch seconds; None when it is not that."""
    found = _TIMEVAL.search(text)
    return int(found[1]) + int(found[2]) / 1e6 if found else None


def parse_proc_stat(text: str) -> float | None:
    """/proc/stat's text -> its btime (epoch seconds); None without one."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "btime" and value.strip().isdigit():
            return float(value.strip())
    return None


def _darwin() -> float | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        value = _Timeval()
        size = ctypes.c_size_t(ctypes.sizeof(value))
        if libc.sysctlbyname(b"kern.boottime", ctypes.byref(value), ctypes.byref(size), None, 0):
            return None
    except (OSError, AttributeError):
        return None
    return value.tv_sec + value.tv_usec / 1e6 if value.tv_sec > 0 else None


def boot_time(proc_stat: Path = PROC_STAT) -> float | None:
    """This machine's boot time (epoch seconds), None where it cannot be read."""
    if sys.platform == "darwin":
        return _darwin()
    try:
        return parse_proc_stat(proc_stat.read_text(encoding="ascii", errors="replace"))
    except OSError:
        return None
