"""`agent temp --watch` shows the throttle rule's verdict on the clock it reads: on the thermal
plant, driven flat out past its limit, the firmware's lower clock becomes `throttling` with
its evidence; a single reading, an idle GPU or no clock give no verdict and say why."""

from __future__ import annotations

from agent.clocks.base import NoClockSource
from agent.clocks.registry import open_clock_source
from agent.commands.temp import read_clocks, throttle_cell
from agent.daemon.clock_throttle import ClockThrottle
from agent.thermal.registry import open_source


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
