"""What recorded telemetry says about a stretch of time, per host, computed by SQLite: every
query reads one host's rows through the samples' primary key (host, time), so `coordinator
history` holds a few numbers per host and a plot's few thousand points, never a window's samples,
however long the window (docs/performance.md has the figures).

Each sample stands for the host's usual spacing: the median gap between its samples (of all
of them when the window holds at most SPACING_PROBES + 1, else of the gaps after the samples at
SPACING_PROBES evenly spaced instants, a few milliseconds of index seeks). A silence therefore
counts for nothing: nobody knows a silent host's temperature. Time at or above a threshold is
the number of readings at or above the threshold in force when each was taken, times the
spacing; time paused, the samples with a supervised job paused, likewise.
"""

from __future__ import annotations

import json
import re
import sqlite3
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from coordinator.telemetry.store import recorded_hosts

THRESHOLDS = ("max_speed_temp", "pause_temp", "stop_temp")
GAP_FACTOR = 3.0
"""A plot's line breaks where two points are further apart than this many spacings."""
SPACING_PROBES = 1000
PLOT_POINTS = 2000
"""A plot reads at most this many points per host (bucket means): about two per pixel."""
PAUSED = "COALESCE(job_paused, instr(jobs, ?) > 0)"
"""Whether a sample lists a paused job: the store's flag, or in a row recorded before the flag
(coordinator.telemetry.store, version 4), its `jobs` text read for PAUSED_JOB."""
THROTTLED = "COUNT(*) FILTER (WHERE throttling = 1), COUNT(throttling)"
"""The samples that said the host throttled, and those with any verdict (none: the window's
agents predate the throttle rule, or nothing ran: its time throttled is unknown, not 0)."""
PACED = "COUNT(*) FILTER (WHERE state = 'pace'), AVG(duty)"
"""The samples whose host the pace tier held duty-cycled, and the mean duty over them."""
PAUSED_JOB = json.dumps({"state": "paused"})[1:-1]
"""How a paused job reads in a sample's stored `jobs` (shared.wire.telemetry stores it with
json.dumps): `"state": "paused"` cannot occur inside a JSON string, whose quotes are escaped."""
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_AGO = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", re.IGNORECASE)
_WINDOW = "FROM samples WHERE host = ? AND time >= ?"

Policies = list[tuple[float, dict[str, Any]]]


def parse_since(text: str, now: float) -> float:
    """`30m`, `2h`, `1d` before `now`, or an ISO time (local time when it names no zone), as
    epoch seconds; ValueError saying what is accepted."""
    match = _AGO.fullmatch(text)
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2).lower()]
    stripped = text.strip()
    try:
        # Python 3.10's fromisoformat does not take a trailing Z.
        moment = datetime.fromisoformat(
            stripped[:-1] + "+00:00" if stripped.endswith("Z") else stripped
        )
    except ValueError:
        raise ValueError(
            f"bad --since {text!r}: expected a duration such as 30m, 2h or 1d, or "
            "an ISO time such as 2026-05-01T14:00"
        ) from None
    return (moment if moment.tzinfo else moment.astimezone()).timestamp()


def policy_at(policies: Policies, at: float) -> dict[str, Any] | None:
    """The policy learned last at or before `at`. Before the first one learned, that first one:
    the agent persists its policy, so it most likely enforced it already."""
    current = policies[0][1] if policies else None
    for learned, policy in policies:
        if learned > at:
            break
        current = policy
    return current


def threshold_in_force(policies: Policies, name: str) -> tuple[str, list[float]]:
    """An SQL expression of a sample's `time`: threshold `name` of the policy in force then
    (policy_at's rule), and its parameters."""
    first, *later = policies
    sql, params = "CASE", []
    previous = first[1][name]
    for learned, policy in later:
        sql += " WHEN time < ? THEN ?"
        params += [learned, previous]
        previous = policy[name]
    return f"{sql} ELSE ? END" if later else "?", [*params, previous]


def hosts_recorded(conn: sqlite3.Connection, since: float, hosts: list[str] | None) -> list[str]:
    """The hosts with samples at or after `since`: those of `hosts` in its order, else all by
    name (a seek or two per host, never a read of the table)."""
    if hosts is None:
        hosts = recorded_hosts(conn, "samples")
    exists = f"SELECT 1 {_WINDOW} LIMIT 1"
    return [host for host in hosts if conn.execute(exists, (host, since)).fetchone()]


def usual_spacing(
    conn: sqlite3.Connection, host: str, since: float, first: float, last: float, count: int
) -> float:
    """The median gap between the host's samples in the window (module docstring); 0 with
    fewer than two samples."""
    if count < 2:
        return 0.0
    if count <= SPACING_PROBES + 1:
        rows = conn.execute(f"SELECT time {_WINDOW} ORDER BY time", (host, since))
        times = [row[0] for row in rows]
        return statistics.median(b - a for a, b in zip(times, times[1:], strict=False))
    step = (last - first) / SPACING_PROBES
    probe = f"SELECT time {_WINDOW} ORDER BY time LIMIT 2"
    gaps = []
    for index in range(SPACING_PROBES):
        pair = conn.execute(probe, (host, first + index * step)).fetchall()
        if len(pair) == 2:
            gaps.append(pair[1][0] - pair[0][0])
    return statistics.median(gaps)


def host_stats(
    conn: sqlite3.Connection, host: str, since: float, policies: Policies
) -> dict[str, Any]:
    """Min / mean / max °C, seconds at or above each threshold of the policy in force, seconds
    with a job paused, seconds throttling (the samples' throttle verdict), seconds paced and
    the mean duty then (the pace tier's), the energy and mean
    watts its power source read (each reading over the usual spacing, as the rest), and the
    pauses and stops its events count: one pass over the host's samples in the window, one
    over its events."""
    above_sql, above_params = [], []
    for name in THRESHOLDS if policies else ():
        expression, params = threshold_in_force(policies, name)
        above_sql.append(f", COUNT(*) FILTER (WHERE celsius >= {expression})")
        above_params += params
    row = conn.execute(
        "SELECT COUNT(*), MIN(celsius), AVG(celsius), MAX(celsius), MAX(simulated), "
        f"COUNT(*) FILTER (WHERE {PAUSED}), {THROTTLED}, {PACED}, {_READ_FROM}, {_POWER}, "
        f"{_CLOCKS}"
        f"{''.join(above_sql)} {_WINDOW}",
        (PAUSED_JOB, *above_params, host, since),
    ).fetchone()
    count, low, mean, high, simulated, paused, throttled, judged, paced, duty, *rest = tuple(row)
    # a lone MIN or MAX is one seek of the key on (host, time), not a share of the pass
    first = conn.execute(f"SELECT MIN(time) {_WINDOW}", (host, since)).fetchone()[0]
    last = conn.execute(f"SELECT MAX(time) {_WINDOW}", (host, since)).fetchone()[0]
    read_from, rest = rest[: len(READ_FROM_COLUMNS)], rest[len(READ_FROM_COLUMNS) :]
    power, rest = rest[: len(POWER_COLUMNS)], rest[len(POWER_COLUMNS) :]
    clocks, above = rest[: len(CLOCK_STATS)], rest[len(CLOCK_STATS) :]
    spacing = usual_spacing(conn, host, since, first, last, count)
    pauses, stops = conn.execute(
        "SELECT COUNT(*) FILTER (WHERE action = 'pause'), COUNT(*) FILTER (WHERE action = "
        "'stop') FROM events WHERE host = ? AND time >= ?",
        (host, since),
    ).fetchone()
    return {
        "host": host,
        "samples": count,
        "first": first,
        "last": last,
        "min_c": low,
        "mean_c": mean,
        "max_c": high,
        "spacing_s": spacing,
        "seconds_above": {
            name: above[index] * spacing if above else None for index, name in enumerate(THRESHOLDS)
        },
        "seconds_paused": paused * spacing,
        "seconds_throttled": throttled * spacing if judged else None,
        "seconds_paced": paced * spacing,
        "mean_duty": duty,
        "pauses": pauses,
        "stops": stops,
        "sources": sources_read(conn, host, since, read_from),
        "simulated": bool(simulated),
        "read_from": readings_by_sensor(conn, host, since, count, read_from),
        "policy": policy_at(policies, last),
        **host_energy(power, spacing),
        **host_clocks(conn, host, since, clocks),
    }


READ_FROM_COLUMNS = (
    "COUNT(celsius)",
    "MIN(source)",
    "MAX(source)",
    "MIN(sensor)",
    "MAX(sensor)",
    "COUNT(sensor)",
)
"""What sources_read and readings_by_sensor need of host_stats' one pass (aggregates that
stream, no DISTINCT, no FILTER: each costs a share of the pass): whether one (source, sensor)
pair is on every sample of the window, and which."""
_READ_FROM = ", ".join(READ_FROM_COLUMNS)


def sources_read(
    conn: sqlite3.Connection, host: str, since: float, read_from: Sequence[Any]
) -> list[str]:
    """The thermal sources of the window's samples, sorted; a second pass only when there
    are several."""
    _, source, last_source, *_ = read_from
    if source == last_source:
        return [] if source is None else [source]
    rows = conn.execute(f"SELECT DISTINCT source {_WINDOW} ORDER BY source", (host, since))
    return [row[0] for row in rows]


def readings_by_sensor(
    conn: sqlite3.Connection, host: str, since: float, count: int, read_from: Sequence[Any]
) -> list[dict[str, Any]]:
    """Which source and sensor gave the window's readings, with how many each, in the order
    they first did: more than one means the figures combine readings that may differ by tens
    of °C (a sensor None: the source names none, or the row predates sensors being kept).
    When one pair is on all `count` samples it gave every reading; otherwise (several, maybe
    only on samples without a reading) a second pass counts the readings of each."""
    readings, source, last_source, sensor, last_sensor, named = read_from
    if not readings:
        return []
    if (source, sensor) == (last_source, last_sensor) and named in (0, count):
        return [{"source": source, "sensor": sensor, "readings": readings}]
    rows = conn.execute(
        f"SELECT source, sensor, COUNT(*) {_WINDOW} AND celsius IS NOT NULL "
        "GROUP BY source, sensor ORDER BY MIN(time)",
        (host, since),
    )
    return [{"source": row[0], "sensor": row[1], "readings": row[2]} for row in rows]


_METERED = "FILTER (WHERE power_w IS NOT NULL)"
POWER_COLUMNS = (
    "SUM(power_w)",
    "COUNT(power_w)",
    f"json_group_array(DISTINCT json_extract(power, '$.source')) {_METERED}",
    f"MAX(json_extract(power, '$.simulated')) {_METERED}",
)
"""What host_energy needs, aggregated in host_stats' one pass over the samples."""
_POWER = ", ".join(POWER_COLUMNS)


def host_energy(power: Sequence[Any], spacing: float) -> dict[str, Any]:
    """From POWER_COLUMNS' values: joules (each reading's watts over the usual `spacing`, so a
    silence never counts as power drawn), the mean watts of the readings, the seconds they
    stand for, and which power sources gave them (simulated ones said)."""
    total_w, readings, sources, simulated = power
    return {
        "energy_j": None if total_w is None else total_w * spacing,
        "mean_power_w": None if total_w is None else total_w / readings,
        "metered_s": readings * spacing,
        "power_sources": sorted(name for name in json.loads(sources) if name is not None),
        "power_simulated": bool(simulated),
    }


CLOCK_STATS = {
    "gpu_min_hz": "MIN(gpu_hz)",
    "gpu_mean_hz": "AVG(gpu_hz)",
    "gpu_max_hz": "MAX(gpu_hz)",
    "gpu_mean_active": "AVG(gpu_active)",
    "cpu_p_mean_hz": "AVG(cpu_p_hz)",
    "cpu_e_mean_hz": "AVG(cpu_e_hz)",
    "clock_source_first": "MIN(clock_source)",
    "clock_source_last": "MAX(clock_source)",
    "clock_simulated": "MAX(clock_simulated)",
}
"""What host_clocks needs of host_stats' one pass: the GPU clock's range and mean over the polls
that read one (an idle GPU's polls have none), its mean active share, the clusters' means, and
which clock sources gave them (rows recorded before clocks were kept add nothing)."""
_CLOCKS = ", ".join(CLOCK_STATS.values())


MAX_NOTES = 8
"""The clock notes a host's history lists at most (a note changes only with its machine)."""


def host_clocks(
    conn: sqlite3.Connection, host: str, since: float, values: Sequence[Any]
) -> dict[str, Any]:
    """From CLOCK_STATS' values: the figures, the clock sources of the window, sorted (a second
    pass only when there are several), whether any was a model's (`clock_simulated`), and what
    the agents said the clocks mean (`clock_notes`: the notes of the polls with a clock)."""
    figures = dict(zip(CLOCK_STATS, values, strict=True))
    first, last = figures.pop("clock_source_first"), figures.pop("clock_source_last")
    if first == last:
        figures["clock_sources"] = [] if first is None else [first]
    else:
        rows = conn.execute(
            f"SELECT DISTINCT clock_source {_WINDOW} AND clock_source IS NOT NULL "
            "ORDER BY clock_source",
            (host, since),
        )
        figures["clock_sources"] = [row[0] for row in rows]
    figures["clock_simulated"] = bool(figures["clock_simulated"])
    figures["clock_notes"] = []
    if figures["clock_sources"]:  # what the clocks meant, as each agent said (requested ...)
        rows = conn.execute(
            f"SELECT DISTINCT clock_note {_WINDOW} AND clock_note IS NOT NULL AND (gpu_active "
            f"IS NOT NULL OR cpu_p_hz IS NOT NULL OR cpu_e_hz IS NOT NULL) LIMIT {MAX_NOTES}",
            (host, since),
        )
        figures["clock_notes"] = sorted(row[0] for row in rows)
    return figures


@dataclass(frozen=True)
class HostSeries:
    """What a plot draws of one host: `points` (time, mean °C or None) at most PLOT_POINTS,
    oldest first; `power` (time, mean watts or None) at the same points; the stretches with a
    job paused; the policies learned; the line breaks between two points further apart than
    `silence` seconds; `stops` (time, °C or None) of every job the policy stopped in the
    window."""

    host: str
    points: list[tuple[float, float | None]]
    paused: list[tuple[float, float]]
    policies: Policies
    silence: float
    simulated: bool
    power: list[tuple[float, float | None]] = field(default_factory=list)
    power_simulated: bool = False
    stops: list[tuple[float, float | None]] = field(default_factory=list)

    @property
    def first(self) -> float:
        return self.points[0][0]

    @property
    def last(self) -> float:
        return self.points[-1][0]


def host_series(
    conn: sqlite3.Connection, stats: dict[str, Any], since: float, policies: Policies
) -> HostSeries:
    """The host's samples in the window at plot resolution: one point per bucket of
    max(window / PLOT_POINTS, spacing) seconds (a sample each, in a short window), the mean of
    the readings in it (and of the watts read); a bucket holding a paused sample is shaded
    whole."""
    first, last = stats["first"], stats["last"]
    width = max((last - first) / PLOT_POINTS, stats["spacing_s"]) or 1.0
    points: list[tuple[float, float | None]] = []
    power: list[tuple[float, float | None]] = []
    paused: list[tuple[float, float]] = []
    power_simulated = False
    for bucket, at, celsius, any_paused, watts, simulated in conn.execute(
        "SELECT CAST((time - ?) / ? AS INTEGER) AS bucket, AVG(time), AVG(celsius), "
        f"MAX({PAUSED}), AVG(power_w), MAX(json_extract(power, '$.simulated')) {_WINDOW} "
        "GROUP BY bucket ORDER BY bucket",
        (first, width, PAUSED_JOB, stats["host"], since),
    ):
        points.append((at, celsius))
        power.append((at, watts))
        power_simulated = power_simulated or bool(simulated)
        if any_paused:
            start, end = first + bucket * width, first + (bucket + 1) * width
            if paused and paused[-1][1] >= start:
                paused[-1] = (paused[-1][0], end)
            else:
                paused.append((start, end))
    stops = conn.execute(
        "SELECT time, celsius FROM events WHERE host = ? AND time >= ? AND action = 'stop' "
        "ORDER BY time",
        (stats["host"], since),
    ).fetchall()
    return HostSeries(
        stats["host"],
        points,
        paused,
        policies,
        GAP_FACTOR * width,
        stats["simulated"],
        power=power,
        power_simulated=power_simulated,
        stops=[(at, celsius) for at, celsius in stops],
    )
