"""Throttling where it is shown: `agent temp --watch` judges the clock it reads (on the thermal
plant driven flat out past its limit, the firmware's lower clock becomes `throttling` with its
evidence; a single reading, an idle GPU or no clock give no verdict and say why), and
`coordinator history` counts the time the samples said a host throttled."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from agent.clocks.base import NoClockSource
from agent.clocks.registry import open_clock_source
from agent.commands.temp import read_clocks, throttle_cell
from agent.daemon.clock_throttle import ClockThrottle
from agent.thermal.registry import open_source
from coordinator.commands.history import read_history, stats_table
from coordinator.telemetry.store import TelemetryStore
from tests.test_history_stats import sample, store_with


def test_agent_temp_watch_judges_the_plants_clock() -> None:
    source = open_source("sim:plant:air,start_c=100")
    try:
        clock = open_clock_source(source)
        throttle = ClockThrottle(source.name)
        shown = []
        for _ in range(40):
            source.plant.advance(10.0, 1.0)  # ten plant seconds flat out, each poll
            shown.append(throttle_cell(read_clocks(clock, throttle)).plain)
    finally:
        source.close()
    assert shown[0] == "no (GPU 1.40 GHz of 1.40 sustained)"
    assert shown[-1].startswith("yes: GPU ") and shown[-1].endswith(" GHz of 1.40 sustained")
    first = next(i for i, text in enumerate(shown) if text.startswith("yes"))
    assert all(text.startswith("yes") for text in shown[first:])


def test_no_verdict_says_why() -> None:
    source = open_source("sim:plant:air")
    try:
        clock = open_clock_source(source)
        assert throttle_cell(read_clocks(clock)).plain == (
            "— (the rule needs 3 polls under load: agent temp --watch)"
        )
        idle = read_clocks(clock, ClockThrottle(source.name))  # nothing ran: duty 0
        assert throttle_cell(idle).plain == "— (no load on the GPU, or no clock: no verdict)"
    finally:
        source.close()
    none = read_clocks(NoClockSource("unavailable: no clock here"), ClockThrottle("none"))
    assert none["throttling"] is None and none["throttle_evidence"] is None


def test_history_counts_the_time_the_samples_said_the_host_throttled(tmp_path: Path) -> None:
    """Four samples a second apart, two of them throttling: 2 s throttled; a host whose samples
    never judged (an older agent's) shows no such time rather than 0."""
    judged = [
        sample(1000.0 + i, 70.0, host="mac1") | {"throttling": verdict, "throttle_evidence": None}
        for i, verdict in enumerate((False, True, True, None))
    ]
    older = [sample(1000.0 + i, 70.0, host="mac2") for i in range(4)]
    path = store_with(tmp_path / "t.sqlite", judged + older)
    with TelemetryStore(path) as store:
        (mac1, mac2), _ = read_history(store, 0.0, None, plot=False)
    assert mac1["seconds_throttled"] == 2.0 and mac2["seconds_throttled"] is None
    console = Console(width=250, record=True, color_system=None)
    console.print(stats_table([mac1, mac2], 0.0))
    text = console.export_text()
    assert "throttled" in text and "2 s" in text
    console = Console(width=250, record=True, color_system=None)
    console.print(stats_table([mac2], 0.0))
    assert "throttled" not in console.export_text()  # no host judged: no column
