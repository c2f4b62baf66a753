"""The SMC die temperature on macOS, without root: the die keys read through the AppleSMC
connection (agent.sensors.smc), the die picked by agent.thermal.smc_die."""

from __future__ import annotations

import sys

from agent.sensors.base import SourceUnavailable
from agent.sensors.macos_libs import apple_silicon
from agent.sensors.smc import AppleSMC, SMCError
from agent.sensors.smc_protocol import decode
from agent.thermal.base import ThermalReading, ThermalSource
from agent.thermal.smc_die import choose_die, die_keys


class SMCSource(ThermalSource):
    """The SMC die temperature (`TCMz`, the die maximum the 75/85/95 °C defaults are set for),
    with `TCMb` beside it; the hottest plausible Tp*/Te*/Tg* key on chips without them."""

    name = "smc"

    def __init__(self) -> None:
        super().__init__()
        if sys.platform != "darwin":
            raise SourceUnavailable(
                f"smc reads the AppleSMC through IOKit and needs macOS; this is {sys.platform}"
            )
        if not apple_silicon():
            raise SourceUnavailable(
                "smc: an Intel Mac (its SMC keys name other things): use powermetrics"
            )
        self._smc = AppleSMC()
        try:
            every_key = self._smc.keys()
        except SMCError as exc:
            self._smc.close()
            raise SourceUnavailable(f"smc: cannot list the SMC's keys: {exc}") from exc
        self._keys = die_keys(every_key)
        if not self._keys:
            self._smc.close()
            raise SourceUnavailable(
                f"smc: none of the {len(every_key)} SMC keys is a die temperature "
                "(TCMz, TCMb, Tp*, Te*, Tg*): not Apple Silicon?"
            )

    def read(self) -> ThermalReading | None:
        values: dict[str, float | None] = {}
        for key in self._keys:
            try:
                values[key] = decode(*self._smc.read(key))
            except SMCError:
                values[key] = None
        choice = choose_die(values)
        if choice is None:
            shown = ", ".join(f"{key}={value}" for key, value in values.items())
            return self._fail(f"smc: no plausible die temperature: {shown}")
        return self._reading(choice.celsius, choice.sensors, sensor=choice.sensor)

    def close(self) -> None:
        self._smc.close()
