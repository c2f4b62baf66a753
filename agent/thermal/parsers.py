"""Pure parsing and selection for every thermal source.

Nothing here touches a process, a file or the OS: the sources are thin shells over these
functions, and the tests feed them captured text.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Readings outside this range are sensor faults or placeholders, not temperatures.
PLAUSIBLE_MIN_C = 0.0
PLAUSIBLE_MAX_C = 150.0


def plausible(celsius: float) -> bool:
    return math.isfinite(celsius) and PLAUSIBLE_MIN_C < celsius <= PLAUSIBLE_MAX_C


def hottest(sensors: Mapping[str, float]) -> float | None:
    """The value to act on: the policy must protect the hottest part of the chip."""
    return max(sensors.values(), default=None)


# --- powermetrics -------------------------------------------------------------------------------

_SAMPLE_HEADER = re.compile(r"^\*\*\* Sampled system activity")
_DIE_TEMPERATURE = re.compile(r"^(?P<name>.+ die temperature):\s*(?P<value>-?[\d.]+)\s*C\s*$")
_PRESSURE = re.compile(r"^Current pressure level:\s*(?P<level>\S.*?)\s*$")
# Some macOS versions spell it "unrecongnized".


@dataclass(frozen=True)
class PowermetricsSample:
    """Die temperatures (Intel smc sampler) and/or the pressure level (thermal sampler)."""

    sensors: dict[str, float]
    pressure: str | None


def parse_powermetrics(text: str) -> PowermetricsSample | None:
    """One sample's text -> its values; None when it holds neither degrees nor a pressure level."""
    sensors: dict[str, float] = {}
    pressure: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        die = _DIE_TEMPERATURE.match(line)
        if die:
            value = float(die["value"])
            if plausible(value):
                sensors[die["name"]] = value
            continue
        level = _PRESSURE.match(line)
        if level:
            pressure = level["level"]
    if not sensors and pressure is None:
        return None
    return PowermetricsSample(sensors, pressure)


class PowermetricsAssembler:
    """Cuts powermetrics' text stream into samples, as lines arrive.

    A sample starts at `*** Sampled system activity ...`. Waiting for the next header would lag one
    interval behind, so the sample so far is published whenever a blank line closes a block that
    changed it (and once more at the next header if its last block had no blank line after it).
    """

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._published: PowermetricsSample | None = None

    def feed(self, line: str) -> PowermetricsSample | None:
        if _SAMPLE_HEADER.match(line.strip()):
            sample = self._flush()
            self._lines = []
            self._published = None
            return sample
        if line.strip():
            self._lines.append(line)
            return None
        return self._flush()

    def _flush(self) -> PowermetricsSample | None:
        sample = parse_powermetrics("\n".join(self._lines))
        if sample is None or sample == self._published:
            return None
        self._published = sample
        return sample


# --- macmon -------------------------------------------------------------------------------------


def parse_macmon_line(line: str) -> dict[str, float]:
    """One `macmon pipe` JSON line -> plausible `temp` values by key (cpu_temp_avg, gpu_temp_avg).

    Raises ValueError for a line that is not a macmon sample, so the caller can say why.
    """
    try:
        sample = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    temps = sample.get("temp") if isinstance(sample, dict) else None
    if not isinstance(temps, dict):
        raise ValueError("no 'temp' object")
    return {
        key: float(value)
        for key, value in temps.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and plausible(value)
    }


# --- Linux sysfs --------------------------------------------------------------------------------

_ZONE_TEMP = re.compile(r"^class/thermal/(?P<zone>thermal_zone\d+)/temp$")
_HWMON_INPUT = re.compile(r"^class/hwmon/(?P<hwmon>hwmon\d+)/(?P<sensor>temp\d+)_input$")
_CPU_SENSOR = re.compile(
    r"x86_pkg_temp|coretemp|k10temp|zenpower|cpu|soc|tdie|tctl|package", re.IGNORECASE
)


def _millidegrees(text: str | None) -> float | None:
    try:
        value = int((text or "").strip()) / 1000.0
    except ValueError:
        return None
    return value if plausible(value) else None


def parse_sysfs(files: Mapping[str, str]) -> dict[str, float]:
    """Thermal-zone and hwmon files (paths relative to the sysfs root -> contents) -> °C by sensor.

    Keys name where a value came from: `thermal_zone0/x86_pkg_temp`, `hwmon1/coretemp/Core 0`.
    """
    sensors: dict[str, float] = {}
    for path, text in sorted(files.items()):
        zone = _ZONE_TEMP.match(path)
        hwmon = _HWMON_INPUT.match(path)
        if zone:
            base = path.rsplit("/", 1)[0]
            label = files.get(f"{base}/type", "").strip() or "unknown"
            key = f"{zone['zone']}/{label}"
        elif hwmon:
            base = path.rsplit("/", 1)[0]
            chip = files.get(f"{base}/name", "").strip() or "unknown"
            label = files.get(f"{base}/{hwmon['sensor']}_label", "").strip() or hwmon["sensor"]
            key = f"{hwmon['hwmon']}/{chip}/{label}"
        else:
            continue
        value = _millidegrees(text)
        if value is not None:
            sensors[key] = value
    return sensors


def linux_soc_celsius(sensors: Mapping[str, float]) -> float | None:
    """The hottest CPU/SoC sensor; the hottest of all when none is recognisably the CPU."""
    cpu = {key: value for key, value in sensors.items() if _CPU_SENSOR.search(key)}
    return hottest(cpu or sensors)


# --- IOHID (macOS) ------------------------------------------------------------------------------

# Die sensors by generation (captures: exelban/stats#210 base M1, oshi/oshi#3534 M2 Max and M3 Pro,
# aristocratos/btop#1601 M2 Pro): `PMU tdie*` on every generation seen; `PMU TP*g` on M2 Max/Pro
# (g = GPU: the hottest part under MLX's GPU work, btop#1601 reads them as the GPU); `PMGR SOC Die
# Temp Sensor*` and pACC/eACC/GPU/SOC `MTR Temp Sensor*` where present (base M1 and others).
# Not the die: `PMU tcal` (~51.9, a calibration constant: macmade/Hot#29, angristan/MacThrottle#38),
# `PMU2 TR0Z` (the same constant, Hot#90), `PMU tdev*` (device sensors, some stuck at -21.5),
# `PMU2 TR*`, NAND, battery / gas gauge, `noname` (0.0).
_DIE_SENSOR = re.compile(
    r"^(PMU\d* tdie\d*"
    r"|PMU\d* TP\d+g"
    r"|PMGR SOC Die Temp Sensor\d*"
    r"|(pACC|eACC|GPU|SOC) MTR Temp Sensor\d*)$",
    re.IGNORECASE,
)


def select_die_sensors(
    values: Mapping[str, float] | Iterable[tuple[str, float]],
) -> dict[str, float]:
    """Die sensors by name from IOHID's (name, °C) pairs; a name that repeats keeps its hottest."""
    pairs = values.items() if isinstance(values, Mapping) else values
    dies: dict[str, float] = {}
    for name, value in pairs:
        name = name.strip()
        if _DIE_SENSOR.match(name) and plausible(value):
            dies[name] = max(value, dies.get(name, value))
    return dies


_GPU_SENSOR = re.compile(r"^(PMU\d* TP\d+g|GPU MTR Temp Sensor\d*)$", re.IGNORECASE)
"""The HID die sensors that are the GPU: `PMU TP*g` (M2 Max/Pro, aristocratos/btop#1601) and
`GPU MTR Temp Sensor*` (base M1; exelban/stats Modules/Sensors/values.swift HIDSensorsList
"GPU core %")."""


def select_gpu_sensors(
    values: Mapping[str, float] | Iterable[tuple[str, float]],
) -> dict[str, float]:
    """The GPU's die sensors among IOHID's (name, °C) pairs: the smc source's fallback when the
    SMC's GPU keys cannot be used (agent.thermal.smc_die.GpuWatch)."""
    dies = select_die_sensors(values)
    return {name: value for name, value in dies.items() if _GPU_SENSOR.match(name)}


class NoDieStreak:
    """Counts reads in a row that found no plausible die sensor. HID services are re-created
    across sleep (macmon, Stats and mactop make a client per read: mac-desk-check.md), and a
    client made before may keep only services that still answer but are no die (NAND, battery,
    `PMU tdev*`), so after `limit` such reads the client is made again: die services that come
    back are found within `limit` reads."""

    def __init__(self, limit: int = 3) -> None:
        self.limit = limit
        self.count = 0

    def rebuild_after(self, dies: int) -> bool:
        """Note one read that found `dies` die sensors; True when the client must be rebuilt."""
        self.count = 0 if dies else self.count + 1
        if self.count < self.limit:
            return False
        self.count = 0
        return True
