"""Pure telemetry statistics: --since parsing, sample spans across silences, the policy in force,
paused stretches, per-host stats; and the telemetry store they read from (real SQLite)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from coordinator.telemetry_stats import (
    HostHistory,
    host_stats,
    parse_since,
    paused_intervals,
    policy_at,
    sample_spans,
)
from coordinator.telemetry_store import TelemetryStore
from shared.telemetry import Cursor

POLICY = {
    "max_speed_temp": 75.0,
    "pause_temp": 85.0,
    "stop_temp": 95.0,
    "pause_duration": 0.5,
    "hysteresis": 0.0,
}


def sample(
    at: float,
    celsius: float | None,
    state: str | None = "ok",
    *,
    jobs: list[dict[str, Any]] | None = None,
    host: str = "mac1",
    source: str = "replay:curve.csv",
    pause_s_total: float = 0.0,
) -> dict[str, Any]:
    """A telemetry.sample body as the agent publishes it."""
    return {
        "host": host,
        "time": at,
        "celsius": celsius,
        "pressure": None,
        "source": source,
        "simulated": source.startswith(("replay", "sim")),
        "state": state,
        "trend_c_per_min": None,
        "pause_s_total": pause_s_total,
        "jobs": jobs or [],
        "storage_error": None,
        "power_w": None,
        "energy_j": None,
        "power": None,
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


def test_spans_cap_a_silence_at_three_usual_intervals() -> None:
    assert sample_spans([]) == []
    assert sample_spans([5.0]) == [0.0]
    assert sample_spans([0, 1, 2, 60, 61]) == [1, 1, 3, 1, 1]


HOTTER = {**POLICY, "pause_temp": 88.0}
LEARNED = [(100.0, POLICY), (200.0, HOTTER)]


def test_the_policy_in_force_is_the_last_learned_before() -> None:
    assert policy_at(LEARNED, 150.0) is POLICY
    assert policy_at(LEARNED, 200.0) is HOTTER


def test_before_any_policy_was_learned_the_first_is_in_force() -> None:
    assert policy_at(LEARNED, 50.0) is POLICY


def test_without_a_learned_policy_none_is_in_force() -> None:
    assert policy_at([], 1.0) is None


def test_paused_stretches_follow_job_states_and_merge() -> None:
    samples = [
        sample(0, 80),
        sample(1, 86, "pause", jobs=[job("paused")]),
        sample(2, 86, "pause", jobs=[job("paused"), job("paused", "j2")]),
        sample(3, 80, jobs=[job("running")]),
        sample(4, 87, jobs=[job("paused")]),
    ]
    assert paused_intervals(samples, sample_spans([s["time"] for s in samples])) == [(1, 3), (4, 5)]


def test_host_stats_from_a_curve_that_pauses_then_stops() -> None:
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
    stats = host_stats(HostHistory("mac1:5555", samples, events, [(1000.0, POLICY)]))
    assert stats["samples"] == 8 and stats["first"] == 0 and stats["last"] == 6
    assert stats["min_c"] == 50 and stats["max_c"] == 96
    assert stats["mean_c"] == pytest.approx(sum(curves) / len(curves))
    # each sample stands for 1 s (0.5 s around the gap; the last for the median, 1 s)
    assert stats["seconds_above"] == {"max_speed_temp": 4.5, "pause_temp": 2.5, "stop_temp": 1.0}
    assert stats["seconds_paused"] == 2.0
    assert (stats["pauses"], stats["stops"]) == (1, 1)
    assert stats["simulated"] and stats["sources"] == ["replay:curve.csv"]
    assert stats["policy"] == POLICY


def test_without_a_known_policy_time_above_is_unknown_not_zero() -> None:
    stats = host_stats(HostHistory("mac1:5555", [sample(0, 99), sample(1, 99)]))
    assert stats["seconds_above"] == dict.fromkeys(("max_speed_temp", "pause_temp", "stop_temp"))
    assert stats["policy"] is None


def test_store_keeps_each_sample_and_event_once(tmp_path: Path) -> None:
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        first = [("a:1", sample(1, 70)), ("a:1", sample(2, 71)), ("b:1", sample(1, 60))]
        events = [
            ("a:1", event(2, "pause", 86)),
            ("a:1", event(3, "policy", name=None, pid=None, detail="x")),
        ]
        assert store.add(first, events) == (first, events)
        again = store.add([("a:1", sample(2, 71)), ("a:1", sample(3, 72))], events)
        assert again == ([("a:1", sample(3, 72))], [])
        by_host = store.samples(2, ["a:1"])
        assert list(by_host) == ["a:1"] and by_host["a:1"] == [
            {k: v for k, v in sample(t, c).items() if k != "host"} for t, c in ((2, 71), (3, 72))
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
