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
from agent.cooling.clock_throttle import ClockThrottle
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


def test_a_captures_clocks_replay_its_throttling(tmp_path: Path) -> None:
    """A capture (agent doctor --capture's format) of a GPU flat out at 1.40 GHz for five
    seconds, then at 1.00 GHz: replayed through the capture's own clock source into the rule
    the agent applies (agent.cooling.clock_throttle), it reads throttling from the third low
    poll on, with the figures; and a capture is labelled replayed in every reading."""
    from agent.thermal.capture import CaptureSource
    from tests.test_clocks import clock_capture, states_row

    polls, fast, slow = [], 0, 0
    for second in range(12):
        if second:
            fast, slow = (fast + 100, slow) if second <= 5 else (fast, slow + 100)
        row = states_row("GPUPH", [("OFF", 0), ("P1", slow), ("P2", fast)])
        polls.append({"t": second, "iohid": {"PMU tdie1": 80.0}, "ioreport_states": [row]})
    path = clock_capture(tmp_path / "throttling.jsonl", polls)
    now = [0.0]
    with CaptureSource(str(path), lambda: now[0]) as source:
        clocks = open_clock_source(source)
        throttle = ClockThrottle(source.name)
        verdicts = []
        for second in range(1, 12):
            now[0] = float(second)
            reading = clocks.read()
            assert reading is not None and reading.source == "capture"
            verdicts.append(throttle.observe(reading))
    assert [v.throttling for v in verdicts] == [False] * 7 + [True] * 4
    assert verdicts[-1].text == "GPU 1.00 GHz of 1.40 sustained"
