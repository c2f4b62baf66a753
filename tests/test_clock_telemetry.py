"""The clocks in every sample (issue 41): the optional fields an older agent lacks, the
coordinator's checks of them, the dashboard's column, Prometheus' gauges, the one-line summary."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import zmq
from prometheus_client import generate_latest
from rich.console import Console

from coordinator.commands.history import gpu_range, read_history, stats_table
from coordinator.telemetry.dashboard import Dashboard, host_snapshot, render
from coordinator.telemetry.store import TelemetryStore
from shared import shapes as s
from shared.cooling.clocks import MAX_CLOCK_HZ, ClockReading, clock_summary, sample_fields
from shared.io.metrics import TelemetryMetrics
from shared.wire import protocol as p
from shared.wire.agent_shapes import check_agent_body
from shared.wire.telemetry import CLOCK_COLUMNS, Sample
from tests.fleet_support import AgentPool, connect, receive, subscriber, trusted_agent
from tests.sysfs_support import build_sysfs
from tests.test_history_stats import sample, store_with
from tests.test_monitor_dashboard import INFO_OK
from tests.test_run_cli import write_curve


def clocked(at: float, **clocks: Any) -> dict[str, Any]:
    """A sample with clock fields, as an agent of this version publishes it."""
    fields = dict.fromkeys(CLOCK_COLUMNS) | {"clock_source": "ioreport", "clock_simulated": False}
    return sample(at, 70.0) | fields | clocks


def test_an_older_agents_sample_is_read_with_nil_clocks() -> None:
    body = sample(1000.0, 70.0)  # no clock field at all
    check_agent_body("telemetry.sample", body)
    p.check_body("telemetry.sample", dict(body))
    record = Sample.from_body(body)
    assert all(getattr(record, name) is None for name in CLOCK_COLUMNS)
    assert Sample.body_row(body)[-len(CLOCK_COLUMNS) :] == (None,) * len(CLOCK_COLUMNS)


def test_a_sample_keeps_its_clocks_through_the_store_row() -> None:
    body = clocked(1000.0, gpu_hz=1.1e9, gpu_active=0.84, cpu_p_hz=3.2e9, clock_simulated=True)
    record = Sample.from_body(body)
    again = Sample.from_row(record.row(), seq=1)
    assert (again.gpu_hz, again.gpu_active, again.cpu_p_hz) == (1.1e9, 0.84, 3.2e9)
    assert again.clock_simulated is True and again.clock_source == "ioreport"
    assert Sample.from_row(Sample.from_body(clocked(1.0)).row()).clock_simulated is False


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpu_hz", -1.0),
        ("gpu_hz", MAX_CLOCK_HZ * 2),
        ("gpu_hz", math.inf),
        ("cpu_p_hz", math.nan),
        ("cpu_e_hz", "3 GHz"),
        ("gpu_active", 1.5),
        ("gpu_active", -0.1),
        ("clock_simulated", "yes"),
        ("clock_source", 7),
    ],
)
def test_the_coordinator_refuses_a_clock_out_of_range(field: str, value: Any) -> None:
    with pytest.raises(s.Invalid, match=field):
        check_agent_body("telemetry.sample", clocked(1000.0, **{field: value}))


def test_the_summary_labels_and_says_why_there_is_none() -> None:
    assert clock_summary(clocked(1.0, gpu_hz=1.1e9, gpu_active=0.84, cpu_p_hz=3.2e9)) == (
        "GPU 1.10 GHz 84 % · P 3.20 · E — GHz"
    )
    assert clock_summary(clocked(1.0, gpu_active=0.0, cpu_p_hz=1e9, clock_simulated=True)) == (
        "GPU idle · P 1.00 · E — GHz (simulated)"
    )
    replayed = clocked(1.0, cpu_e_hz=2e9, clock_source="capture")
    assert clock_summary(replayed).endswith("(replayed)")
    none = clocked(1.0, clock_source="none", clock_note="unavailable: cpufreq: no scaling_cur_freq")
    assert clock_summary(none) == "unavailable: cpufreq: no scaling_cur_freq"
    assert clock_summary(sample(1.0, 70.0)) == "unavailable: no clock source"


def drawn(board: Dashboard) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(render(board, 1001.0, 200))
    return console.export_text()


def test_the_dashboard_shows_the_gpu_clock_labelled_and_only_when_some_host_has_one() -> None:
    board = Dashboard(["mac1:5555", "mac2:5555"])
    for name in board.hosts:
        board.connected(name, name.split(":")[0], INFO_OK, now=0.0)
    board.sample("mac1:5555", sample(1000.0, 70.0), now=1000.0)  # an older agent
    assert "GPU GHz" not in drawn(board)
    simulated = clocked(1000.0, gpu_hz=1.1e9, gpu_active=0.84, clock_simulated=True)
    board.sample("mac2:5555", simulated | {"host": "mac2"}, now=1000.0)
    text = drawn(board)
    assert "GPU GHz" in text and "1.10 84% sim" in text
    shown = host_snapshot(board.hosts["mac2:5555"], 1001.0)
    assert shown["gpu_hz"] == 1.1e9 and shown["clock_simulated"] is True
    assert host_snapshot(board.hosts["mac1:5555"], 1001.0)["gpu_hz"] is None


def test_prometheus_has_each_clock_labelled_and_drops_one_that_goes() -> None:
    metrics = TelemetryMetrics()
    metrics.observe_sample(clocked(1.0, gpu_hz=1.1e9, gpu_active=0.5, cpu_p_hz=3e9, cpu_e_hz=2e9))
    text = generate_latest(metrics.registry).decode()
    assert 'mlx_fleet_gpu_frequency_hertz{host="mac1",kind="measured",source="ioreport"} 1.1e+09' \
        in text  # fmt: skip
    assert 'mlx_fleet_gpu_active_ratio{host="mac1",kind="measured",source="ioreport"} 0.5' in text
    assert 'cluster="P",host="mac1",kind="measured",source="ioreport"} 3e+09' in text
    assert 'cluster="E"' in text
    metrics.observe_sample(clocked(2.0, gpu_active=0.0, clock_source="plant", clock_simulated=True))
    text = generate_latest(metrics.registry).decode()
    assert "mlx_fleet_gpu_frequency_hertz{" not in text  # idle: no clock, never a stale one
    assert "mlx_fleet_cpu_frequency_hertz{" not in text
    assert 'mlx_fleet_gpu_active_ratio{host="mac1",kind="simulated",source="plant"} 0.0' in text


@pytest.mark.slow
def test_a_real_agents_samples_carry_its_clocks_or_say_why_not(
    ctx: zmq.Context, agents: AgentPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cpufreq read from a tree standing in for /sys: its CPUs' clocks in every sample, and in
    the history the agent serves; with no cpufreq, the clock fields nil and the reason said."""
    files = {}
    for cpu, now in enumerate((2_000_000, 3_000_000)):
        files[f"devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq"] = f"{now}\n"
        files[f"devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq"] = "3500000\n"
    monkeypatch.setenv("MLX_FLEET_SYSFS_ROOT", str(build_sysfs(tmp_path / "sys", files)))
    curve = write_curve(tmp_path / "curve.csv", [(0, 60.0)])
    agent = trusted_agent(agents, thermal=curve, options=["--poll-interval", "0.1"])
    sub = subscriber(ctx, agent)
    body = receive(sub, lambda m: m.type == "telemetry.sample").body
    assert body["cpu_p_hz"] == pytest.approx(2.5e9) and body["cpu_e_hz"] is None
    assert body["gpu_hz"] is None and body["clock_source"] == "cpufreq"
    assert body["clock_simulated"] is False and "scaling_cur_freq" in body["clock_note"]
    client = connect(ctx, agent)
    served = client.request("history.get", {"samples_after": 0, "events_after": 0})["samples"]
    assert served[0]["cpu_p_hz"] == pytest.approx(2.5e9)
    assert served[0]["clock_simulated"] is False  # a bool again, read back from the store
    client.close()

    monkeypatch.setenv("MLX_FLEET_SYSFS_ROOT", str(tmp_path / "empty"))
    bare = trusted_agent(agents, name="bare", thermal=curve, options=["--poll-interval", "0.1"])
    body = receive(subscriber(ctx, bare), lambda m: m.type == "telemetry.sample").body
    assert [body[key] for key in ("gpu_hz", "gpu_active", "cpu_p_hz", "cpu_e_hz")] == [None] * 4
    assert body["clock_source"] == "none"
    assert body["clock_note"].startswith("unavailable: cpufreq: no scaling_cur_freq")


def test_history_gives_the_gpu_clocks_range_labelled(tmp_path: Path) -> None:
    rows = [
        clocked(1000.0, gpu_hz=1.4e9, gpu_active=1.0, clock_source="capture"),
        clocked(1001.0, gpu_hz=0.84e9, gpu_active=0.5, clock_source="capture"),
        clocked(1002.0, gpu_active=0.0, clock_source="capture"),  # idle: no clock
        sample(1003.0, 70.0),  # an older agent's
    ]
    path = store_with(tmp_path / "t.sqlite", rows)
    with TelemetryStore(path) as store:
        (stats,), _ = read_history(store, 0.0, None, plot=False)
    assert (stats["gpu_min_hz"], stats["gpu_max_hz"]) == (0.84e9, 1.4e9)
    assert stats["gpu_mean_active"] == pytest.approx(0.5)
    assert stats["clock_sources"] == ["capture"] and stats["clock_simulated"] is False
    assert stats["clock_notes"] == []  # none said
    assert gpu_range(stats) == "0.84–1.40 rep"
    console = Console(width=250, record=True, color_system=None)
    console.print(stats_table([stats], 0.0))
    assert "GPU GHz" in console.export_text()


@pytest.mark.parametrize(
    ("figures", "said"),
    [
        ({"gpu_hz": math.nan}, "gpu_hz nan is no clock"),
        ({"cpu_p_hz": -1e3}, "cpu_p_hz -1000.0 is no clock"),
        ({"cpu_e_hz": MAX_CLOCK_HZ * 10}, "is no clock"),
        ({"gpu_active": 1.2}, "gpu_active 1.2 is not a share"),
    ],
)
def test_an_implausible_clock_is_unavailable_at_the_agent_not_a_refused_sample(
    figures: dict[str, float], said: str
) -> None:
    """A driver's bogus figure (cpufreq's, a decoding fault) would make the coordinator refuse
    the whole sample: the agent sends the clocks as unavailable, saying why."""
    values = {"gpu_hz": 1e9, "gpu_active": 0.5, "cpu_p_hz": 3e9, "cpu_e_hz": 2e9} | figures
    reading = ClockReading(1.0, **values, source="cpufreq")
    fields = sample_fields(reading, "cpufreq", False, None)
    assert [fields[key] for key in values] == [None] * 4
    assert (
        fields["clock_note"].startswith("unavailable: cpufreq: ") and said in fields["clock_note"]
    )
    check_agent_body("telemetry.sample", sample(1.0, 70.0) | fields)
    good = ClockReading(1.0, 1e9, 0.5, 3e9, 2e9, source="cpufreq")
    assert sample_fields(good, "cpufreq", False, None)["gpu_hz"] == 1e9
