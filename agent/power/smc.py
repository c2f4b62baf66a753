"""Whole-system power on Apple Silicon, without root: the SMC's `PSTR` key (watts, `flt `), read
through agent.sensors.smc's AppleSMC client, as macmon reads it for its sys_power
(src_lib/metrics.rs, `get_sys_power`: `self.smc.read_float_val("PSTR")`) and Stats for "System
Total".

PSTR is a power, not a counter: energy is its trapezoid integral between reads.
"""

from __future__ import annotations

import sys
import time

from agent.power.base import Integrator, PowerReading, PowerSource
from agent.power.decode import plausible_watts
from agent.sensors.base import SourceUnavailable
from agent.sensors.macos_libs import apple_silicon
from agent.sensors.smc import AppleSMC, SMCError
from agent.sensors.smc_protocol import decode
from shared.benchmark.energy import SYSTEM

KEY = "PSTR"
RESOLUTION_S = 1.0
"""How often PSTR changes is not published; macmon and Stats sample it each second, and
energy between two reads is their trapezoid: shorter windows are flagged."""


class SMCPowerSource(PowerSource):
    """Cumulative joules of the `system` rail, integrated from PSTR."""

    name = "smc"
    rails = (SYSTEM,)
    resolution_s = RESOLUTION_S

    def __init__(self) -> None:
        super().__init__()
        if sys.platform != "darwin":
            raise SourceUnavailable(f"smc power needs macOS (AppleSMC); this is {sys.platform}")
        if not apple_silicon():
            raise SourceUnavailable("smc power: PSTR is read on Apple Silicon only")
        self._smc = AppleSMC()
        self._energy = Integrator()
        self._watts = self._pstr()
        if self._watts is None:
            self._smc.close()
            raise SourceUnavailable(f"smc power: {self.last_error}")
        self._last = time.monotonic()

    def _pstr(self) -> float | None:
        try:
            watts = decode(*self._smc.read(KEY))
        except SMCError as exc:
            return self._fail(f"cannot read {KEY}: {exc}")
        if not plausible_watts(watts):
            return self._fail(f"{KEY} reads {watts!r}, not a power")
        return watts

    def read(self) -> PowerReading | None:
        watts = self._pstr()
        if watts is None:
            return None
        now = time.monotonic()
        previous = self._watts if self._watts is not None else watts
        self._energy.add_watts({SYSTEM: (previous + watts) / 2.0}, now - self._last)
        self._energy.watts = {SYSTEM: watts}
        self._watts, self._last = watts, now
        return self._reading(self._energy.joules, self._energy.watts, at=now)

    def close(self) -> None:
        self._smc.close()
