"""Pure decoding of Apple Silicon's clocks, as vladkens/macmon reads them (src_lib/sources.rs,
src_lib/metrics.rs): the pmgr DVFS tables, IOReport's performance-state residencies, and the
average active frequency they give. Nothing here calls macOS: agent.clocks.ioreport hands these
functions the bytes and counters it read, and a capture hands them the same ones recorded
(docs/thermal.md, Clocks).
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from shared.cooling.clocks import MAX_CLOCK_HZ

ENTRY_BYTES = 8
"""A `voltage-states*` entry: frequency then voltage, each a little-endian u32 (macmon
src_lib/sources.rs `get_dvfs_mhz`: `freqs[i] = u32::from_le_bytes(x[0..4])`, volts x[4..8])."""
HZ_BELOW = 1e8
"""A table entry below this is in kHz, at or above it in Hz. M1-M3 tables are in Hz, M4 and
later CPU tables in kHz (macmon `cpu_freq_scale` by chip name), but the unit is per table, not
per chip: an M4's GPU `voltage-states9` is still Hz (oshi/oshi#3674, which measured every real
maximum at or below 4.7e6 in kHz or at or above 3.38e8 in Hz). So the magnitude decides."""

GPU_TABLE = "voltage-states9"
E_TABLE = "voltage-states1-sram"
P_TABLE = "voltage-states5-sram"
ACC_CLUSTERS = "acc-clusters"
PMGR_KEYS = (GPU_TABLE, E_TABLE, P_TABLE, ACC_CLUSTERS)
"""The `pmgr` IORegistry properties read (macmon `load_soc_info`: the GPU's `voltage-states9`,
the E and P clusters' `voltage-states1-sram` and `-5-sram`; the non-sram keys powermetrics names
read zero). M5 Max drops `voltage-states1-sram` and names its tables in `acc-clusters`
(macmon `parse_acc_clusters`, oshi/oshi#3674)."""

CPU_GROUP, CPU_CORE_STATES = "CPU Stats", "CPU Core Performance States"
CPU_COMPLEX_STATES = "CPU Complex Performance States"
GPU_GROUP, GPU_STATES = "GPU Stats", "GPU Performance States"
GPU_CHANNEL = "GPUPH"
SUBSCRIBED = (
    (CPU_GROUP, CPU_CORE_STATES),
    (CPU_GROUP, CPU_COMPLEX_STATES),
    (GPU_GROUP, GPU_STATES),
)
"""The IOReport (group, subgroup) pairs read: macmon's `ioreport_channels_filter` (per-core
states, GPUPH), and the per-cluster complex states, recorded in captures only: the per-core
states show the requested state on an M4 (vladkens/macmon#78) and the cluster channel may show
the granted one (oshi/oshi#3675, dehydratedpotato/socpowerbud#15): a capture lets a real Mac
settle it."""
INACTIVE = frozenset({"IDLE", "DOWN", "OFF"})
"""States that are not a clock: CPU channels are [IDLE, states...] or [DOWN, IDLE, states...],
GPUPH [OFF, P1...] (macmon `calc_freq_from_residencies`)."""

_V_STATE = re.compile(r"^V(?P<index>\d+)P\d+$")
_P_STATE = re.compile(r"^P(?P<number>\d+)$")

Residencies = list[tuple[str, int]]
"""One channel's states in order, each with its ticks over an interval (or cumulative)."""
Channel = tuple[str, str, str]
"""(group, subgroup, channel)."""


def dvfs_frequencies_hz(blob: bytes) -> list[float]:
    """A `voltage-states*` blob -> its frequencies in Hz, in table order. ValueError naming
    the fault: a length that is not whole entries, no entry, or a frequency no Mac runs."""
    if not blob or len(blob) % ENTRY_BYTES:
        raise ValueError(f"{len(blob)} bytes is not a whole number of {ENTRY_BYTES}-byte entries")
    raw = [entry[0] for entry in struct.iter_unpack("<II", blob)]
    top = max(raw)
    scale = 1.0 if top >= HZ_BELOW else 1e3
    frequencies = [value * scale for value in raw]
    for value in frequencies:
        if value > MAX_CLOCK_HZ:
            raise ValueError(f"an entry of {value / 1e9:g} GHz is no Apple Silicon clock")
    if top == 0:
        raise ValueError("every entry reads 0 Hz")
    return frequencies


def acc_cluster_keys(blob: bytes) -> tuple[str, str]:
    """`acc-clusters` -> the (lower tier, higher tier) tables' keys: 8-byte entries, byte 0 the
    table number, byte 1 the cluster's tier; the highest tier is the P (M5: Super) cluster, the
    next the E (M5 Pro/Max: the Performance) one (macmon `parse_acc_clusters`)."""
    if len(blob) < 2 * ENTRY_BYTES or len(blob) % ENTRY_BYTES:
        raise ValueError(f"acc-clusters of {len(blob)} bytes names fewer than two clusters")
    entries = sorted(
        (blob[i + 1], f"voltage-states{blob[i]}-sram") for i in range(0, len(blob), ENTRY_BYTES)
    )
    return entries[-2][1], entries[-1][1]


@dataclass(frozen=True)
class ClockTables:
    """Each clock's DVFS table in Hz (None: not found, `problems` says why). The GPU's drops
    its first entry, the powered-off state, as macmon does (`&self.soc.gpu_freqs[1..]`), so
    GPUPH's P1 is its first entry."""

    gpu: list[float] | None
    cpu_e: list[float] | None
    cpu_p: list[float] | None
    problems: tuple[str, ...] = ()


def pmgr_tables(properties: Mapping[str, bytes]) -> ClockTables:
    """The pmgr entry's properties (PMGR_KEYS present, as bytes) -> the clocks' tables: the
    fixed keys first, `acc-clusters` where one is missing (M5+)."""
    problems: list[str] = []

    def table(key: str) -> list[float] | None:
        blob = properties.get(key)
        if blob is None:
            return None
        try:
            return dvfs_frequencies_hz(blob)
        except ValueError as exc:
            problems.append(f"pmgr {key}: {exc}")
            return None

    cpu_e, cpu_p = table(E_TABLE), table(P_TABLE)
    if (cpu_e is None or cpu_p is None) and ACC_CLUSTERS in properties:
        try:
            e_key, p_key = acc_cluster_keys(properties[ACC_CLUSTERS])
        except ValueError as exc:
            problems.append(f"pmgr {ACC_CLUSTERS}: {exc}")
        else:
            cpu_e = cpu_e if cpu_e is not None else table(e_key)
            cpu_p = cpu_p if cpu_p is not None else table(p_key)
    gpu = table(GPU_TABLE)
    if gpu is not None:
        gpu = gpu[1:] or None
    for name, found in (("GPU", gpu), ("E-cluster", cpu_e), ("P-cluster", cpu_p)):
        if found is None and not any(name in problem for problem in problems):
            problems.append(f"pmgr: no {name} table")
    return ClockTables(gpu, cpu_e, cpu_p, tuple(problems))


def state_delta(before: Residencies, after: Residencies) -> Residencies:
    """The ticks of each state between two cumulative samples of one channel (what
    IOReportCreateSamplesDelta gives macmon). ValueError when the states differ or a counter
    went back (a reset): that interval cannot be told."""
    if [name for name, _ in before] != [name for name, _ in after]:
        raise ValueError("the channel's states changed between samples")
    delta = [(name, now - then) for (name, then), (_, now) in zip(before, after, strict=True)]
    if any(ticks < 0 for _, ticks in delta):
        raise ValueError("a residency counter went back (reset)")
    return delta


def _table_index(name: str, position: int) -> int:
    """Which table entry an active state is: `V<i>P<j>` is entry i (M2's E cores skip a state:
    dehydratedpotato/socpowerbud#8), GPUPH's `P<k>` entry k-1 of the table without its off
    state; any other name by its position among the active states (macmon)."""
    if (v_state := _V_STATE.match(name)) is not None:
        return int(v_state["index"])
    if (p_state := _P_STATE.match(name)) is not None:
        return int(p_state["number"]) - 1
    return position


@dataclass(frozen=True)
class ActiveClock:
    """One channel over an interval: its frequency averaged over its active ticks (None with
    none), the share of the interval it was active, and its active ticks."""

    hz: float | None
    active: float
    active_ticks: int


def active_clock(residencies: Residencies, table: list[float]) -> ActiveClock | None:
    """macmon's `calc_freq_from_residencies`: the states after the first inactive ones are the
    table's, each weighted by its ticks. None for an interval of no ticks; ValueError for a
    state the table has no entry for (a table that does not belong to the channel)."""
    total = sum(ticks for _, ticks in residencies)
    if total <= 0:
        return None
    offset = next(
        (i for i, (name, _) in enumerate(residencies) if name not in INACTIVE), len(residencies)
    )
    weighted, active = 0.0, 0
    for position, (name, ticks) in enumerate(residencies[offset:]):
        index = _table_index(name, position)
        if not 0 <= index < len(table):
            raise ValueError(f"state {name} has no entry in a {len(table)}-entry table")
        weighted += ticks * table[index]
        active += ticks
    return ActiveClock(weighted / active if active else None, active / total, active)


def cpu_tier(channel: str) -> str | None:
    """`P` or `E` for a per-core channel, None for any other: PCPU is the highest tier (M5:
    Super), ECPU and MCPU the lower (M5 Pro/Max: Performance); Ultras prefix `DIE_<n>_` (macmon
    `parse_cpu_core_channel`, issue #47)."""
    if "PCPU" in channel:
        return "P"
    if "ECPU" in channel or "MCPU" in channel:
        return "E"
    return None


@dataclass(frozen=True)
class Clocks:
    """One interval's clocks (ClockReading's figures) and what could not be told."""

    gpu_hz: float | None
    gpu_active: float | None
    cpu_p_hz: float | None
    cpu_e_hz: float | None
    problems: tuple[str, ...]


def interval_clocks(deltas: Mapping[Channel, Residencies], tables: ClockTables) -> Clocks:
    """The clocks of one interval from each channel's ticks in it: the GPU's from GPUPH; each
    CPU tier's frequency averaged over its cores' active ticks (macmon takes the mean of the
    cores' frequencies, which counts an idle core as 0 Hz; this counts each core as long as it
    ran), the tier's lowest state when no core ran (macmon's floor)."""
    problems = list(tables.problems)
    gpu_hz = gpu_active = None
    tiers: dict[str, list[ActiveClock]] = {"P": [], "E": []}
    for (group, subgroup, channel), residencies in deltas.items():
        if (group, subgroup, channel) == (GPU_GROUP, GPU_STATES, GPU_CHANNEL):
            if tables.gpu is None:
                continue
            try:
                clock = active_clock(residencies, tables.gpu)
            except ValueError as exc:
                problems.append(f"{GPU_CHANNEL}: {exc}")
                continue
            if clock is not None:
                gpu_hz, gpu_active = clock.hz, clock.active
        elif (group, subgroup) == (CPU_GROUP, CPU_CORE_STATES):
            tier = cpu_tier(channel)
            table = {"P": tables.cpu_p, "E": tables.cpu_e}.get(tier or "")
            if tier is None or table is None:
                continue
            try:
                clock = active_clock(residencies, table)
            except ValueError as exc:
                problems.append(f"{channel}: {exc}")
                continue
            if clock is not None:
                tiers[tier].append(clock)
    gpu_channel = (GPU_GROUP, GPU_STATES, GPU_CHANNEL)
    if tables.gpu is not None and gpu_channel not in deltas:
        problems.append(f"no {GPU_CHANNEL} channel in IOReport's {GPU_STATES}")
    for tier, table in (("P", tables.cpu_p), ("E", tables.cpu_e)):
        if table is not None and not tiers[tier]:
            problems.append(f"no {tier}-cluster core channel in IOReport's {CPU_CORE_STATES}")
    cpu = {tier: _tier_hz(clocks, tables.cpu_p if tier == "P" else tables.cpu_e)
           for tier, clocks in tiers.items()}  # fmt: skip
    return Clocks(gpu_hz, gpu_active, cpu["P"], cpu["E"], tuple(problems))


def clocks_between(
    before: Mapping[Channel, Residencies], after: Mapping[Channel, Residencies], tables: ClockTables
) -> Clocks:
    """The clocks between two cumulative samples of every channel (a channel whose counters
    reset, or that only one sample holds, is left out: its interval cannot be told)."""
    deltas = {}
    for channel, residencies in after.items():
        if channel in before:
            try:
                deltas[channel] = state_delta(before[channel], residencies)
            except ValueError:
                continue
    return interval_clocks(deltas, tables)


def _tier_hz(clocks: list[ActiveClock], table: list[float] | None) -> float | None:
    if not clocks or table is None:
        return None
    ticks = sum(clock.active_ticks for clock in clocks)
    if ticks == 0:
        return min(value for value in table if value > 0)
    return sum(clock.hz * clock.active_ticks for clock in clocks if clock.hz) / ticks


def plausible_hz(value: float | None) -> bool:
    return value is None or (math.isfinite(value) and 0.0 <= value <= MAX_CLOCK_HZ)


_GENERATION = re.compile(r"\bM(?P<generation>\d+)\b")


def ioreport_note(chip: str) -> str:
    """What IOReport's residencies mean on this chip (`machdep.cpu.brand_string`, `Apple M4
    Pro`), as far as public evidence goes (docs/thermal.md, Requested or granted): a reading
    shows it wherever it is shown."""
    found = _GENERATION.search(chip)
    generation = int(found["generation"]) if found else None
    if generation == 4:
        return (
            "M4: CPU clocks are the requested state, not the granted one: CPU throttling does "
            "not show (macmon#78); GPU unconfirmed"
        )
    if generation is not None and generation >= 5:
        return (
            "M5: GPU clock granted as of macOS 26A5388g, stuck at the top state in an earlier "
            "build (FB23754032); CPU unconfirmed"
        )
    return f"{chip or 'this chip'}: requested or granted state unconfirmed (docs/thermal.md)"
