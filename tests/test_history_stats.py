"""Telemetry statistics: --since parsing, the policy in force, per-host statistics computed in
SQL and checked against a direct computation over every sample; and the telemetry store they
read from (real SQLite)."""

from __future__ import annotations

import bisect
import random
import re
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from coordinator.commands.history import policy_cell, read_history
from coordinator.telemetry.stats import (
    PLOT_POINTS,
    SPACING_PROBES,
    THRESHOLDS,
    Policies,
    host_stats,
    hosts_recorded,
    parse_since,
    policy_at,
    threshold_in_force,
)
from coordinator.telemetry.store import TelemetryStore
from shared.cooling.policy import ThermalPolicy
from shared.wire.telemetry import Cursor, Sample

POLICY = ThermalPolicy().to_dict()
"""The seed's defaults, as an agent reports them: pause at 85 °C, stop at 95 °C."""


def sample(
    at: float,
    celsius: float | None,
    state: str | None = "ok",
    *,
    jobs: list[dict[str, Any]] | None = None,
    host: str = "mac1",
    source: str = "replay:curve.csv",
    sensor: str | None = None,
    pause_s_total: float = 0.0,
) -> dict[str, Any]:
    """A telemetry.sample body as the agent publishes it (a replay's sensor is `replay`)."""
    return {
        "host": host,
        "time": at,
        "celsius": celsius,
        "pressure": None,
        "source": source,
        "sensor": "replay" if sensor is None and source.startswith("replay") else sensor,
        "simulated": source.startswith(("replay", "sim")),
        "state": state,
        "trend_c_per_min": None,
        "pause_s_total": pause_s_total,
        "jobs": jobs or [],
        "storage_error": None,
        "power_w": None,
        "energy_j": None,
        "power": None,
        "throttling": None,
        "throttle_evidence": None,
        "started": None,
        "seq": int(at),
    }


def job(state: str, name: str = "j1", pid: int = 4242) -> dict[str, Any]:
    return {
        "job": name,
        "pid": pid,
        "command": "python -m mlx_lm lora",
        "state": state,
        "kind": "run",
    }


def event(
    at: float,
    action: str,
    celsius: float | None = None,
    *,
    name: str | None = "j1",
    pid: int | None = 4242,
    detail: str | None = None,
) -> dict[str, Any]:
    """A telemetry.event body."""
    return {
        "host": "mac1",
        "time": at,
        "celsius": celsius,
        "action": action,
        "pid": pid,
        "job": name,
        "source": "replay:curve.csv",
        "simulated": True,
        "detail": detail,
        "policy": None,
        "seq": None,
    }


NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "ago"), [("30m", 1800), ("2h", 7200), ("1d", 86400), ("45s", 45), (" 1.5H ", 5400)]
)
def test_since_durations(text: str, ago: float) -> None:
    assert parse_since(text, NOW) == NOW - ago


def test_since_iso_times() -> None:
    assert (
        parse_since("2027-01-15T08:00:00Z", NOW)
        == datetime(2027, 1, 15, 8, tzinfo=timezone.utc).timestamp()
    )
    assert (
        parse_since("2027-01-15T10:00+02:00", NOW)
        == datetime(2027, 1, 15, 8, tzinfo=timezone.utc).timestamp()
    )
    assert parse_since("2027-01-15 08:00", NOW) == datetime(2027, 1, 15, 8).timestamp()


@pytest.mark.parametrize("text", ["", "2 hours", "-3h", "yesterday", "2027-13-01"])
def test_bad_since_says_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="30m, 2h or 1d"):
        parse_since(text, NOW)


HOTTER = {**POLICY, "pause_temp": 88.0}
LEARNED = [(100.0, POLICY), (200.0, HOTTER)]


def test_the_policy_in_force_is_the_last_learned_before() -> None:
    assert policy_at(LEARNED, 150.0) is POLICY
    assert policy_at(LEARNED, 200.0) is HOTTER


def test_before_any_policy_was_learned_the_first_is_in_force() -> None:
    assert policy_at(LEARNED, 50.0) is POLICY


def test_without_a_learned_policy_none_is_in_force() -> None:
    assert policy_at([], 1.0) is None


def test_the_threshold_in_force_as_sql_follows_policy_at(tmp_path: Path) -> None:
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        for policies in ([(100.0, POLICY)], LEARNED, [*LEARNED, (200.0, POLICY)]):
            expression, params = threshold_in_force(policies, "pause_temp")
            for at in (50.0, 100.0, 150.0, 200.0, 250.0):
                (found,) = store.conn.execute(
                    f"SELECT {expression} FROM (SELECT ? AS time)", (*params, at)
                ).fetchone()
                assert found == policy_at(policies, at)["pause_temp"], (policies, at)


def store_with(path: Path, rows: list[dict[str, Any]], events: list[dict[str, Any]] = ()) -> Path:
    with TelemetryStore(path) as store:
        store.add([(row["host"], row) for row in rows], [(e["host"], e) for e in events])
    return path


def direct_stats(
    rows: list[dict[str, Any]], events: list[dict[str, Any]], policies: Policies
) -> dict[str, Any]:
    """telemetry_stats' definitions (its module docstring) computed directly, in plain Python
    over every sample: the reference the SQL must match."""
    times = [row["time"] for row in rows]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    if len(times) > SPACING_PROBES + 1:  # the gap after the first sample at each probe instant
        step = (times[-1] - times[0]) / SPACING_PROBES
        found = [bisect.bisect_left(times, times[0] + k * step) for k in range(SPACING_PROBES)]
        gaps = [times[i + 1] - times[i] for i in found if i + 1 < len(times)]
    spacing = statistics.median(gaps) if gaps else 0.0
    readings = [row["celsius"] for row in rows if row["celsius"] is not None]

    def above(name: str) -> float | None:
        if not policies:
            return None
        hits = [
            row
            for row in rows
            if row["celsius"] is not None
            and row["celsius"] >= policy_at(policies, row["time"])[name]
        ]
        return len(hits) * spacing

    paused = [row for row in rows if any(job["state"] == "paused" for job in row["jobs"])]
    actions = [event["action"] for event in events]
    metered = [row for row in rows if row["power_w"] is not None]
    watts = [row["power_w"] for row in metered]

    def clock(key: str) -> list[float]:
        return [row[key] for row in rows if row.get(key) is not None]

    read_from: dict[tuple[str, str | None], int] = {}  # in the order they first gave a reading
    for row in rows:
        if row["celsius"] is not None:
            pair = (row["source"], row["sensor"])
            read_from[pair] = read_from.get(pair, 0) + 1
    return {
        "samples": len(rows),
        "first": times[0],
        "last": times[-1],
        "min_c": min(readings),
        "mean_c": statistics.fmean(readings),
        "max_c": max(readings),
        "spacing_s": spacing,
        "seconds_above": {name: above(name) for name in THRESHOLDS},
        "seconds_paused": len(paused) * spacing,
        "seconds_paced": sum(1 for row in rows if row["state"] == "pace") * spacing,
        "mean_duty": (
            sum(duties) / len(duties)
            if (duties := [row["duty"] for row in rows if row.get("duty") is not None])
            else None
        ),
        "seconds_throttled": (
            sum(1 for row in rows if row.get("throttling")) * spacing
            if any(row.get("throttling") is not None for row in rows)
            else None
        ),
        "pauses": actions.count("pause"),
        "stops": actions.count("stop"),
        "sources": sorted({row["source"] for row in rows}),
        "simulated": any(row["simulated"] for row in rows),
        "read_from": [
            {"source": source, "sensor": sensor, "readings": count}
            for (source, sensor), count in read_from.items()
        ],
        "policy": policy_at(policies, times[-1]),
        "energy_j": sum(watts) * spacing if metered else None,
        "mean_power_w": statistics.fmean(watts) if metered else None,
        "metered_s": len(metered) * spacing,
        "power_sources": sorted({row["power"]["source"] for row in metered}),
        "power_simulated": any(row["power"]["simulated"] for row in metered),
        "gpu_min_hz": min(clock("gpu_hz"), default=None),
        "gpu_mean_hz": statistics.fmean(clock("gpu_hz")) if clock("gpu_hz") else None,
        "gpu_max_hz": max(clock("gpu_hz"), default=None),
        "gpu_mean_active": statistics.fmean(clock("gpu_active")) if clock("gpu_active") else None,
        "cpu_p_mean_hz": statistics.fmean(clock("cpu_p_hz")) if clock("cpu_p_hz") else None,
        "cpu_e_mean_hz": None,
        "clock_sources": sorted({row["clock_source"] for row in rows if row.get("clock_source")}),
        "clock_simulated": any(row.get("clock_simulated") for row in rows),
        "clock_notes": sorted({row["clock_note"] for row in rows if row.get("clock_note")}),
    }


def jittery_curve(count: int, seed: int) -> list[dict[str, Any]]:
    """`count` samples about a second apart (jitter, two silences, missing readings), hot
    stretches with the job paused, warm ones paced, from two sources (one of them from two
    sensors); watts from two power sources (one simulated), some polls without a reading."""
    rng = random.Random(seed)
    rows, at = [], NOW
    for index in range(count):
        at += rng.uniform(0.97, 1.03) + (45.0 if index in (count // 3, count // 2) else 0.0)
        celsius = None if index % 17 == 0 else round(rng.uniform(60.0, 100.0), 2)
        paused = celsius is not None and 85.0 <= celsius < 95.0
        body = sample(
            at,
            celsius,
            jobs=[job("paused" if paused else "running"), job("running", "j2", 7)],
            source="iohid" if index % 5 else "sim",
            sensor=("PMU tdie1" if index % 3 else "PMU TP1g") if index % 5 else None,
        )
        watts = None if index % 11 == 0 else round(rng.uniform(5.0, 40.0), 2)
        power = "sim" if index % 4 == 0 else "rapl"
        body["power_w"] = watts
        body["power"] = {
            "source": power,
            "simulated": power == "sim",
            "watts": {} if watts is None else {"system": watts},
            "joules": {},
            "error": "no reading yet" if watts is None else None,
        }
        if index % 13:  # the rest: an older agent's samples, with no clock field
            idle = index % 3 == 0
            body |= {
                "gpu_hz": None if idle else round(rng.uniform(0.4e9, 1.4e9)),
                "gpu_active": 0.0 if idle else round(rng.uniform(0.1, 1.0), 3),
                "cpu_p_hz": round(rng.uniform(1e9, 4e9)),
                "cpu_e_hz": None,
                "clock_source": "plant" if index % 7 == 0 else "ioreport",
                "clock_simulated": index % 7 == 0,
                "clock_note": "simulated" if index % 7 == 0 else "M4: requested",
                "throttling": None if idle else index % 4 == 0,
                "throttle_evidence": None if idle else "GPU 0.97 GHz of 1.40 sustained",
            }
        if celsius is not None and 80.0 <= celsius < 85.0:  # the pace tier held it
            body |= {"state": "pace", "duty": round(rng.uniform(0.2, 0.99), 3)}
        rows.append(body)
    return rows


@pytest.mark.parametrize("count", [7, 400, 3000])  # 3000: the spacing from probes
def test_statistics_in_sql_equal_a_direct_computation(tmp_path: Path, count: int) -> None:
    rows = jittery_curve(count, seed=count)
    events = [event(rows[i]["time"], action) for i, action in ((1, "pause"), (2, "stop"))]
    store_with(tmp_path / "t.sqlite", rows, events)
    policies = [(NOW - 10, POLICY), (rows[count // 2]["time"], HOTTER)]
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        for when, policy in policies:
            store.record_policy("mac1", policy, when)
        since = rows[1]["time"]  # the first sample and nothing else left out
        stats = host_stats(store.conn, "mac1", since, store.policies()["mac1"])
    expected = direct_stats(rows[1:], [e for e in events if e["time"] >= since], policies)
    assert stats.pop("host") == "mac1"
    for key in ("mean_c", "energy_j", "mean_power_w", "gpu_mean_hz", "gpu_mean_active",
                "cpu_p_mean_hz"):  # sums taken in another order  # fmt: skip
        assert stats.pop(key) == pytest.approx(expected.pop(key), rel=1e-12)
    assert stats == expected


def test_rows_recorded_before_the_paused_flag_are_read_from_their_jobs(tmp_path: Path) -> None:
    rows = jittery_curve(50, seed=1)
    store_with(tmp_path / "t.sqlite", rows)
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        flagged = host_stats(store.conn, "mac1", 0, [])
        store.conn.execute("UPDATE samples SET job_paused = NULL")  # as a version 2 file has
        assert host_stats(store.conn, "mac1", 0, []) == flagged and flagged["seconds_paused"]


def test_host_stats_from_a_curve_that_pauses_then_stops(tmp_path: Path) -> None:
    curves = [70, 76, 86, 90, 80, 96, 50]
    samples = [
        sample(float(t), c, jobs=[job("paused" if 86 <= c < 95 else "running")])
        for t, c in enumerate(curves)
    ]
    samples.insert(4, sample(3.5, None, jobs=[job("paused")]))  # no reading: not counted
    events = [
        event(2, "pause", 86),
        event(4, "resume", 80),
        event(5, "stop", 96),
        event(6, "exit", detail="143"),
    ]
    store_with(
        tmp_path / "t.sqlite",
        [{**s, "host": "mac1:5555"} for s in samples],
        [{**e, "host": "mac1:5555"} for e in events],
    )
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        stats = host_stats(store.conn, "mac1:5555", 0, [(1000.0, POLICY)])
    assert stats["samples"] == 8 and stats["first"] == 0 and stats["last"] == 6
    assert stats["min_c"] == 50 and stats["max_c"] == 96
    assert stats["mean_c"] == pytest.approx(sum(curves) / len(curves))
    # each sample stands for the usual spacing, 1 s (the median gap)
    assert stats["spacing_s"] == 1.0
    assert stats["seconds_above"] == {"max_speed_temp": 5.0, "pause_temp": 3.0, "stop_temp": 1.0}
    assert stats["seconds_paused"] == 3.0  # 86, 90 and the sample without a reading
    assert (stats["pauses"], stats["stops"]) == (1, 1)
    assert stats["simulated"] and stats["sources"] == ["replay:curve.csv"]
    assert stats["policy"] == POLICY


def test_a_silence_counts_for_nothing(tmp_path: Path) -> None:
    rows = [sample(float(t), 90.0) for t in (0, 1, 2, 600, 601, 602)]
    store_with(tmp_path / "t.sqlite", [{**r, "host": "mac1"} for r in rows])
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        stats = host_stats(store.conn, "mac1", 0, [(0.0, POLICY)])
    assert stats["seconds_above"]["pause_temp"] == 6.0


def test_without_a_known_policy_time_above_is_unknown_not_zero(tmp_path: Path) -> None:
    store_with(tmp_path / "t.sqlite", [{**sample(t, 99), "host": "mac1"} for t in (0, 1)])
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        stats = host_stats(store.conn, "mac1", 0, [])
    assert stats["seconds_above"] == dict.fromkeys(THRESHOLDS)
    assert stats["policy"] is None


def test_hosts_recorded_in_the_window(tmp_path: Path) -> None:
    rows = [{**sample(t, 60.0), "host": h} for h in ("b:1", "a:1") for t in (1, 2)]
    store_with(tmp_path / "t.sqlite", [*rows, {**sample(9, 60.0), "host": "c:1"}])
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        assert hosts_recorded(store.conn, 0, None) == ["a:1", "b:1", "c:1"]
        assert hosts_recorded(store.conn, 5, None) == ["c:1"]
        assert hosts_recorded(store.conn, 0, ["c:1", "x:1", "a:1"]) == ["c:1", "a:1"]


def test_store_keeps_each_sample_and_event_once(tmp_path: Path) -> None:
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        first = [("a:1", sample(1, 70)), ("a:1", sample(2, 71)), ("b:1", sample(1, 60))]
        events = [
            ("a:1", event(2, "pause", 86)),
            ("a:1", event(3, "policy", name=None, pid=None, detail="x")),
        ]
        assert store.add(first, events) == (3, events)
        again = store.add([("a:1", sample(2, 71)), ("a:1", sample(3, 72))], events)
        assert again == (1, [])  # only the sample at 3 is new
        by_host = store.samples(2, ["a:1"])
        assert list(by_host) == ["a:1"] and by_host["a:1"] == [
            {k: v for k, v in Sample.completed(sample(t, c)).items() if k != "host"}
            for t, c in ((2, 71), (3, 72))  # an older agent's: its absent fields read as nil
        ]
        assert [e["action"] for e in store.events(0)["a:1"]] == ["pause", "policy"]
    with TelemetryStore(tmp_path / "t.sqlite") as reopened:
        assert len(reopened.samples(0)["a:1"]) == 3


def test_store_keeps_the_cursor_it_is_given_per_host(tmp_path: Path) -> None:
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        store.add([("a:1", sample(1, 70)), ("b:1", sample(1, 60))], [])
        assert store.cursor("a:1") is None
        store.add(cursors={"a:1": Cursor("h1", 3, 0)})
        assert store.cursor("a:1") == Cursor("h1", 3, 0) and store.cursor("b:1") is None


def test_store_records_a_policy_only_when_it_changes(tmp_path: Path) -> None:
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        store.record_policy("a:1", POLICY, 10)
        store.record_policy("a:1", dict(POLICY), 11)  # the same: not a change
        store.record_policy("a:1", {**POLICY, "stop_temp": 99.0}, 12)
        assert [t for t, _ in store.policies()["a:1"]] == [10, 12]


def test_store_keeps_where_a_policys_numbers_came_from(tmp_path: Path) -> None:
    """The same numbers from another origin are a change (a coordinator took them over); an
    agent that did not say has none, and `coordinator history` shows what it was told."""
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        store.record_policy("a:1", POLICY, 10, "defaults for smc")
        store.record_policy("a:1", POLICY, 11, "defaults for smc")
        store.record_policy("a:1", POLICY, 12, "set by coordinator policy")
        store.record_policy("b:1", POLICY, 10)
        learned = store.policies()
    assert [(t, p["origin"]) for t, p in learned["a:1"]] == [
        (10, "defaults for smc"),
        (12, "set by coordinator policy"),
    ]
    assert "origin" not in learned["b:1"][0][1]
    assert str(policy_cell(learned["a:1"][0][1])) == "75/85/95 (defaults for smc)"
    assert str(policy_cell(learned["b:1"][0][1])) == "75/85/95"


def fill_for_pruning(store: TelemetryStore) -> None:
    store.add(
        [("a:1", sample(1, 70)), ("a:1", sample(5, 71))],
        [("a:1", event(2, "pause", 86)), ("a:1", event(6, "resume", 80))],
    )
    store.record_policy("a:1", POLICY, 1)


def test_prune_drops_telemetry_older_than_the_cutoff(tmp_path: Path) -> None:
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        fill_for_pruning(store)
        assert store.prune(before=4) == 2
        assert [s["time"] for s in store.samples(0)["a:1"]] == [5]
        assert [e["action"] for e in store.events(0)["a:1"]] == ["resume"]


def test_prune_keeps_policies(tmp_path: Path) -> None:
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        fill_for_pruning(store)
        store.prune(before=4)
        assert store.policies()["a:1"]


def test_every_query_of_history_prune_and_the_monitor_start_uses_an_index(
    tmp_path: Path,
) -> None:
    """EXPLAIN QUERY PLAN of each statement run: samples and events are only ever searched
    through an index (the primary key, or the events' key), never scanned whole."""
    rows = jittery_curve(3000, seed=3)
    store_with(tmp_path / "t.sqlite", rows, [event(rows[5]["time"], "pause")])
    statements: list[str] = []
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        store.record_policy("mac1", POLICY, NOW)
        store.conn.set_trace_callback(statements.append)
        read_history(store, NOW + 100, None, plot=True)
        read_history(store, NOW + 100, ["mac1"], plot=False)
        store.readings(NOW + 2000, ["mac1"])
        store.prune(NOW + 50)
        store.conn.set_trace_callback(None)
        queries = [
            q for q in statements if q.lstrip().upper().startswith(("SELECT", "WITH", "DELETE"))
        ]
        assert len(queries) > 10
        for query in queries:
            plan = [row[3] for row in store.conn.execute(f"EXPLAIN QUERY PLAN {query}")]
            for detail in [d for d in plan if re.search(r"\b(samples|events)\b", d)]:
                assert detail.startswith("SEARCH") and " USING " in detail, (query, detail)


def test_a_long_window_is_read_at_plot_resolution(tmp_path: Path) -> None:
    rows = jittery_curve(6000, seed=6)
    store_with(tmp_path / "t.sqlite", rows)
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        (series,) = read_history(store, 0, None, plot=True)[1]
    assert len(series.points) <= PLOT_POINTS
    assert series.first == pytest.approx(rows[0]["time"], abs=series.silence)
    assert series.last == pytest.approx(rows[-1]["time"], abs=series.silence)
    gaps = [b[0] - a[0] for a, b in zip(series.points, series.points[1:], strict=False)]
    assert sum(gap > series.silence for gap in gaps) == 2  # the two silences, no other break
    paused = [r["time"] for r in rows if r["jobs"][0]["state"] == "paused"]
    assert all(any(start <= t <= end for start, end in series.paused) for t in paused)


def test_readings_before_and_after_sensors_were_kept_are_told_apart(tmp_path: Path) -> None:
    """One source, its sensor unrecorded in older rows (None) and named in newer ones: two
    entries, as the sensors may differ; samples without a reading are not among them."""
    rows = [sample(NOW + t, 60.0, source="iohid") for t in range(3)]
    rows += [sample(NOW + t, 61.0, source="iohid", sensor="PMU tdie1") for t in range(3, 5)]
    rows.append(sample(NOW + 5, None, None, source="iohid"))
    store_with(tmp_path / "t.sqlite", rows)
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        stats = host_stats(store.conn, "mac1", 0, [])
        only_named = host_stats(store.conn, "mac1", NOW + 3, [])
        none = host_stats(store.conn, "mac1", NOW + 5, [])
    assert stats["read_from"] == [
        {"source": "iohid", "sensor": None, "readings": 3},
        {"source": "iohid", "sensor": "PMU tdie1", "readings": 2},
    ]
    assert only_named["read_from"] == [{"source": "iohid", "sensor": "PMU tdie1", "readings": 2}]
    assert none["read_from"] == [] and none["samples"] == 1
