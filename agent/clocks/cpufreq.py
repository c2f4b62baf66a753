"""Linux's CPU clocks from cpufreq: each CPU's `scaling_cur_freq` (kHz) under
/sys/devices/system/cpu/cpu*/cpufreq (Documentation/admin-guide/pm/cpufreq.rst). No GPU clock:
those fields stay None. On x86 the kernel computes it from APERF/MPERF over the last tick
(since Linux 4.13): a granted average, not a requested state."""

from __future__ import annotations

import time

from agent.clocks.base import ClockSource
from agent.sensors.base import SourceUnavailable
from agent.sensors.sysfs import LiveSysfs, SysfsView
from shared.cooling.clocks import ClockReading

CPU_DIRS = "devices/system/cpu/cpu[0-9]*/cpufreq"
CURRENT, MAXIMUM = "scaling_cur_freq", "cpuinfo_max_freq"
NOTE = "cpufreq scaling_cur_freq: the kernel's current clock per CPU"


def cpufreq_tiers(files: dict[str, tuple[int, int | None]]) -> tuple[float | None, float | None]:
    """(P, E) Hz from {cpu: (current kHz, maximum kHz or None)}: the CPUs of the highest
    maximum are the P tier, those of the lowest the E tier when the machine has two kinds (an
    Intel hybrid or a big.LITTLE Arm); each tier's mean. One kind of CPU is all P."""
    if not files:
        return None, None
    tops = {top for _, top in files.values()}
    high = max((top for top in tops if top is not None), default=None)
    low = min((top for top in tops if top is not None), default=None)

    def mean(wanted: int | None) -> float:
        values = [now for now, top in files.values() if top == wanted]
        return sum(values) / len(values) * 1e3

    if high is None or high == low:
        return sum(now for now, _ in files.values()) / len(files) * 1e3, None
    return mean(high), mean(low)


class CpufreqSource(ClockSource):
    name = "cpufreq"
    note = NOTE

    def __init__(self, sysfs: SysfsView | None = None) -> None:
        super().__init__()
        self._sysfs = sysfs or LiveSysfs()
        if not self._sysfs.glob(f"{CPU_DIRS}/{CURRENT}"):
            raise SourceUnavailable(
                f"cpufreq: no {CURRENT} under {self._sysfs.root}/devices/system/cpu "
                "(no cpufreq driver: a VM or a container usually has none)"
            )

    def read(self) -> ClockReading | None:
        files: dict[str, tuple[int, int | None]] = {}
        for path in self._sysfs.glob(f"{CPU_DIRS}/{CURRENT}"):
            directory = path.rsplit("/", 1)[0]
            try:
                now = int(self._sysfs.read(path).strip())
            except (OSError, ValueError):
                continue  # a CPU going offline between the glob and the read
            try:
                top: int | None = int(self._sysfs.read(f"{directory}/{MAXIMUM}").strip())
            except (OSError, ValueError):
                top = None
            files[directory] = (now, top)
        if not files:
            return self._fail(f"cpufreq: no readable {CURRENT}")
        p_hz, e_hz = cpufreq_tiers(files)
        self.last_error = None
        return ClockReading(time.time(), None, None, p_hz, e_hz, self.name, note=self.note)
