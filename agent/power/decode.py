"""Pure decoding for every power source: counter arithmetic, IOReport's channel names and units,
RAPL's zones, macmon's and powermetrics' lines, a replayed curve's energy. Nothing here touches a
process, a file or the OS: the sources are thin shells over these functions, and the tests feed
them captured text.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from agent.sensors.replay import ReplayRows
from shared.benchmark.energy import ANE, CPU, DRAM, GPU, SYSTEM

MAX_PLAUSIBLE_W = 5000.0
"""More than any Mac or workstation draws: a reading above it is a decoding fault."""


def plausible_watts(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and 0.0 <= value <= MAX_PLAUSIBLE_W


# --- RAPL (Linux powercap) ----------------------------------------------------------------------


def counter_delta(previous: int, current: int, wraps_at: int) -> int:
    """What a counter that wraps back to 0 at `wraps_at` (RAPL's max_energy_range_uj) counted
    between two reads, assuming it wrapped at most once (RAPL wraps after minutes at the
    least: a 32-bit counter of ~61 µJ units holds ~262 kJ)."""
    if current >= previous:
        return current - previous
    return current + wraps_at - previous


def rapl_rail(zone_name: str) -> str | None:
    """The rail of a powercap zone by its `name` file: a package (the CPU socket: cores, uncore
    and an on-die GPU) is `cpu`, `dram` is memory, `psys` the whole platform (Skylake and later
    laptops). `core` and `uncore` are parts of a package, already in it: None."""
    name = zone_name.strip().lower()
    if name.startswith("package"):
        return CPU
    return {"dram": DRAM, "psys": SYSTEM}.get(name)


# --- IOReport "Energy Model" (macOS) ------------------------------------------------------------

_ANE_OR_DRAM = re.compile(r"^(?P<rail>ANE|DRAM)\d*(_\d+)?$")
_GPU_PART = re.compile(r"^GPU\d+(_\d+)?$")
UNIT_JOULES = {"mJ": 1e-3, "uJ": 1e-6, "µJ": 1e-6, "μJ": 1e-6, "nJ": 1e-9, "J": 1.0}
"""Each channel says its unit (IOReportChannelGetUnitLabel): mJ on most, nJ on `GPU Energy`,
uJ on PCIe (macmon platform/io_report.rs trims the label and knows mJ/uJ/nJ; zeus-apple-silicon
apple_energy.hpp also spells µJ)."""


def ioreport_rail(channel: str, has_gpu_energy: bool) -> str | None:
    """The rail an Energy Model channel belongs to, matched exactly, never by substring (summing
    every name that contains "CPU" counted the 300-odd per-core and DTL channels into the CPU
    five times over: lablup/all-smi#410): names ending in `CPU Energy` (`DIE_<n>_CPU Energy` on
    an Ultra) are cpu; `GPU Energy` is gpu, and `GPU<n>`/`GPU<n>_<m>` only where a sample has no
    `GPU Energy`; top-level `ANE`, `ANE<n>`, `ANE<n>_<m>` and the same of `DRAM` (all-smi#415,
    macmon src_lib/metrics.rs). Per-core, cluster, SRAM, DTL, ISP, display and PCIe
    channels name no rail."""
    if channel.endswith("CPU Energy"):
        return CPU
    if channel == "GPU Energy":
        return GPU
    match = _ANE_OR_DRAM.match(channel)
    if match:
        return ANE if match["rail"] == "ANE" else DRAM
    if not has_gpu_energy and _GPU_PART.match(channel):
        return GPU
    return None


@dataclass(frozen=True)
class ChannelSum:
    """What one IOReport delta sample says: joules per rail, and each channel that belongs to
    a rail but could not be counted (its unit unknown), named."""

    joules: dict[str, float]
    problems: list[str]


def ioreport_energy(channels: Iterable[tuple[str, str, int]]) -> ChannelSum:
    """(channel name, unit label, integer value) of a delta sample -> joules per rail."""
    items = list(channels)
    has_gpu_energy = any(name == "GPU Energy" for name, _, _ in items)
    joules: dict[str, float] = {}
    problems: list[str] = []
    for name, unit, value in items:
        rail = ioreport_rail(name, has_gpu_energy)
        if rail is None:
            continue
        scale = UNIT_JOULES.get(unit.strip())
        if scale is None:
            problems.append(f"{name}: unknown unit {unit.strip()!r}")
            continue
        joules[rail] = joules.get(rail, 0.0) + value * scale
    return ChannelSum(joules, problems)


def ioreport_rails(channels: Iterable[str]) -> tuple[str, ...]:
    """The rails a subscription's channel names give."""
    names = list(channels)
    has_gpu_energy = "GPU Energy" in names
    found = {ioreport_rail(name, has_gpu_energy) for name in names}
    return tuple(rail for rail in (CPU, GPU, ANE, DRAM) if rail in found)


# --- macmon -------------------------------------------------------------------------------------

MACMON_RAILS = {
    "cpu_power": CPU,
    "gpu_power": GPU,
    "ane_power": ANE,
    "ram_power": DRAM,
    "sys_power": SYSTEM,
}
"""`macmon pipe`'s watts over its interval (mac-desk-check.md): sys_power is the SMC's PSTR,
clamped to at least all_power (= cpu + gpu + ane); gpu_ram_power (GPU SRAM) and all_power are
parts or sums of these."""
PARTS_OF_ALL_POWER = (CPU, GPU, ANE)


def parse_macmon_power(line: str) -> dict[str, float]:
    """One `macmon pipe` JSON line -> watts per rail (the keys it has). ValueError for a line
    that is not a macmon sample, so the caller can say why.

    sys_power is kept only when it is a reading: macmon writes 0.0 when PSTR cannot be read
    (src_lib/metrics.rs) and clamps a good one to at least all_power, so one at or below zero,
    or below all_power (or the rails' sum when all_power is missing), is dropped, and the
    machine's watts fall back to the rails."""
    try:
        sample = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(sample, dict):
        raise ValueError("not a JSON object")
    watts = {
        rail: float(sample[key])
        for key, rail in MACMON_RAILS.items()
        if isinstance(sample.get(key), (int, float)) and not isinstance(sample.get(key), bool)
    }
    if not watts:
        raise ValueError("no *_power field")
    all_power = sample.get("all_power")
    if not isinstance(all_power, (int, float)) or isinstance(all_power, bool):
        all_power = sum(watts.get(rail, 0.0) for rail in PARTS_OF_ALL_POWER)
    if SYSTEM in watts and (watts[SYSTEM] <= 0.0 or watts[SYSTEM] < all_power):
        del watts[SYSTEM]
    return {rail: value for rail, value in watts.items() if plausible_watts(value)}


# --- powermetrics -------------------------------------------------------------------------------

_HEADER = re.compile(r"^\*\*\* Sampled system activity .*\((?P<ms>[\d.]+)\s*ms elapsed\)")
_POWER_LINE = re.compile(
    r"^(?P<name>CPU|GPU|ANE|Combined) Power[^:]*:\s*(?P<value>[\d.]+)\s*(?P<unit>mW|W)\s*$"
)
POWERMETRICS_RAILS = {"CPU": CPU, "GPU": GPU, "ANE": ANE}


@dataclass(frozen=True)
class PowermetricsPower:
    """One powermetrics sample's watts per rail over its interval (`seconds`, from the header's
    `(1003.51ms elapsed)`)."""

    watts: dict[str, float]
    seconds: float


class PowermetricsPowerAssembler:
    """Cuts the text of `powermetrics --samplers cpu_power,gpu_power,ane_power` into samples as
    lines arrive. Its lines: `CPU Power: 954 mW`, `GPU Power: ...`, `ANE Power: ...`, then
    `Combined Power (CPU + GPU + ANE): 983 mW` (mac-desk-check.md; BinSquare/powermetrics-go);
    the gpu_power block prints `GPU Power` again later: the first of each rail counts. A
    sample is complete at its Combined line, or at the next header without one."""

    def __init__(self) -> None:
        self._seconds: float | None = None
        self._watts: dict[str, float] = {}

    def feed(self, line: str) -> PowermetricsPower | None:
        text = line.strip()
        header = _HEADER.match(text)
        if header:
            sample = self._flush()
            self._seconds = float(header["ms"]) / 1000.0
            return sample
        power = _POWER_LINE.match(text)
        if power is None or self._seconds is None:
            return None
        if power["name"] == "Combined":
            return self._flush()
        value = float(power["value"]) / (1000.0 if power["unit"] == "mW" else 1.0)
        self._watts.setdefault(POWERMETRICS_RAILS[power["name"]], value)
        return None

    def _flush(self) -> PowermetricsPower | None:
        watts, seconds = self._watts, self._seconds
        self._watts, self._seconds = {}, None
        if not watts or seconds is None:
            return None
        return PowermetricsPower(watts, seconds)


# --- replay -------------------------------------------------------------------------------------


def replay_energy(rows: ReplayRows, elapsed: float) -> float | None:
    """Joules from 0 to `elapsed` seconds of a `seconds,watts` curve: each row holds until the
    next, the last one forever, a gap (no watts) adds nothing; None before the first row."""
    if not rows or elapsed < rows[0][0]:
        return None
    total = 0.0
    for (start, watts), (end, _) in zip(rows, [*rows[1:], (math.inf, None)], strict=True):
        if start >= elapsed:
            break
        if watts is not None:
            total += watts * (min(end, elapsed) - start)
    return total
