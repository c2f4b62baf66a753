"""This machine's CPU load between two calls: what the simulated sources (thermal and power)
are driven by, read at every poll."""

from __future__ import annotations

import functools
import os

import psutil

PROC_STAT = "/proc/stat"


class CpuLoad:
    """Each call: the machine's CPU load (0..1) since the previous call (the first, since the
    object was made), counted as psutil.cpu_percent counts it: busy is all but idle and iowait,
    and guest time is already in user and nice.

    On Linux the counters come straight from /proc/stat's first line, the file held open:
    psutil parses the whole file in Python, much of an idle `agent serve --thermal-source
    sim`'s sensor thread at 1 Hz (docs/performance.md, The wire and the idle daemon). Elsewhere
    they are psutil's. Each object counts its own interval, so the thermal and the power model
    no longer shorten each other's."""

    def __init__(self) -> None:
        self._last = cpu_counters()

    def __call__(self) -> float:
        busy, total = cpu_counters()
        last_busy, last_total = self._last
        self._last = (busy, total)
        if total <= last_total:
            return 0.0
        return min(1.0, max(0.0, (busy - last_busy) / (total - last_total)))


def cpu_counters() -> tuple[float, float]:
    """(busy, total) CPU time of the whole machine so far, in the platform's units."""
    fd = _proc_stat()
    if fd is not None:
        try:
            return proc_stat_counters(os.pread(fd, 512, 0))
        except (OSError, ValueError):
            pass  # unreadable or not as documented: psutil knows other ways
    times = psutil.cpu_times()
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0), total


def proc_stat_counters(text: bytes) -> tuple[float, float]:
    """(busy, total) from /proc/stat's first line, `cpu  user nice system idle iowait irq softirq
    steal guest guest_nice` (proc(5); older kernels stop earlier). ValueError when it is not
    that line."""
    name, *fields = text.split(b"\n", 1)[0].split()
    if name != b"cpu" or len(fields) < 4:
        raise ValueError(f"not /proc/stat's cpu line: {text[:80]!r}")
    ticks = [*map(int, fields[:10]), *(0,) * (10 - min(len(fields), 10))]
    total = sum(ticks) - ticks[8] - ticks[9]
    return float(total - ticks[3] - ticks[4]), float(total)


@functools.cache
def _proc_stat() -> int | None:
    """/proc/stat, opened once for the process's life; None where there is none."""
    try:
        return os.open(PROC_STAT, os.O_RDONLY)
    except OSError:
        return None
