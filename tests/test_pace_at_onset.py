"""Pacing at the onset (issue 41, Build 5): one setting, for the fleet, that paces each Mac
under its own calibrated throttle onset. The pure rule (the cap, the pause it must stay under,
a Mac without a calibration), then real `agent serve` processes on the thermal plant: the
setting pushed, its origin shown, kept across a restart; an uncalibrated one says it is not
paced; bad input refused in one line. And the clock a daemon's samples carry reaching the jobs
it feeds (the pace tier's second input)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

import pytest
import zmq

from agent.cooling.calibration_file import save_calibration
from agent.cooling.session import connect_daemon, sample_clock
from shared.cooling.calibration import (
    NOT_PACED,
    PACE_BELOW_PAUSE_C,
    SET_BY_COORDINATOR,
    calibrated_defaults,
    check_given,
    merged_changes,
    with_given,
)
from shared.cooling.policy import check_changes
from shared.cooling.throttle_point import ThrottlePoint, find_throttle_point
from shared.io.transport import AgentError
from shared.wire import protocol as p
from tests.conftest import run_cli
from tests.fleet_support import (
    AgentPool,
    cli,
    connect,
    exchange_keys,
    receive,
    subscriber,
    trusted_agent,
)
from tests.test_throttle_point import run_model

PLANT = "sim:plant:air,speed=120"
AT_ONSET = {"pace_at_onset": True}


@pytest.fixture(scope="module")
def point() -> ThrottlePoint:
    """A calibration made on the plant source the agents here read (2026-12-05)."""
    return find_throttle_point(run_model(), PLANT, True, 1796428800.0)


def test_a_calibrated_mac_is_paced_at_its_onset(point: ThrottlePoint) -> None:
    base = calibrated_defaults("sim", PLANT, point)
    onset = round(point.onset_c, 1)
    paced = with_given("sim", AT_ONSET, SET_BY_COORDINATOR, base)
    assert paced.policy.pace_temp == onset == paced.policy.pause_temp
    said = f"paced at its onset {onset:g} °C, {SET_BY_COORDINATOR}"
    assert paced.origin == f"{point.origin()}; {said}"
    # the rest of the policy is the calibration's, unchanged
    assert paced.policy.max_speed_temp == base.policy.max_speed_temp


def test_an_operators_pause_below_the_onset_caps_the_pace_under_it(point: ThrottlePoint) -> None:
    base = calibrated_defaults("sim", PLANT, point)
    pause = round(point.onset_c, 1) - 10
    given = {"max_speed_temp": pause - 5, "pause_temp": pause, **AT_ONSET}
    paced = with_given("sim", given, SET_BY_COORDINATOR, base)
    assert paced.policy.pace_temp == pause - PACE_BELOW_PAUSE_C
    assert f"{PACE_BELOW_PAUSE_C:g} °C under pause_temp (below its onset" in paced.origin


def test_a_mac_without_a_calibration_made_with_its_source_says_it_is_not_paced(
    point: ThrottlePoint,
) -> None:
    for base in (calibrated_defaults("sim", "sim", point), calibrated_defaults("smc", "smc", None)):
        shown = with_given(base.origin, AT_ONSET, SET_BY_COORDINATOR, base)
        assert shown.policy == base.policy and shown.policy.pace_temp is None
        assert shown.origin == f"{base.origin}; {NOT_PACED}"
        assert NOT_PACED in str(shown)


def test_a_cap_and_the_onset_replace_each_other() -> None:
    assert merged_changes({"pace_temp": 90.0}, AT_ONSET) == AT_ONSET
    assert merged_changes(AT_ONSET, {"pace_temp": 90.0}) == {"pace_temp": 90.0}
    assert merged_changes(AT_ONSET, {"pace_temp": None}) == {"pace_temp": None}
    assert merged_changes({**AT_ONSET, "pause_temp": 80.0}, {"pace_at_onset": False}) == {
        "pause_temp": 80.0
    }
    with pytest.raises(ValueError, match="not both"):
        merged_changes({}, {"pace_temp": 90.0, **AT_ONSET})
    with pytest.raises(ValueError, match="--pace-temp or --pace-at-onset, not both"):
        check_given({"pace_temp": 90.0, **AT_ONSET})
    with pytest.raises(ValueError, match="pace_at_onset must be true or false, got 1"):
        check_changes({"pace_at_onset": 1})


@pytest.mark.slow
def test_pushed_once_each_agent_paces_at_its_own_onset_and_a_restart_keeps_it(
    ctx: zmq.Context, agents: AgentPool, point: ThrottlePoint
) -> None:
    (agents.root / "mac1").mkdir(parents=True)
    save_calibration(point, agents.root / "mac1" / "calibration.json")
    calibrated = trusted_agent(agents, "mac1", thermal=PLANT)
    bare = trusted_agent(agents, "mac2", thermal=PLANT)
    onset = round(point.onset_c, 1)
    said = f"{point.origin()}; paced at its onset {onset:g} °C, {SET_BY_COORDINATOR}"
    client = connect(ctx, calibrated)
    reply = client.request("policy.set", {"policy": AT_ONSET})
    assert reply["policy"]["pace_temp"] == onset and reply["origin"] == said
    client.close()
    other = connect(ctx, bare)
    reply = other.request("policy.set", {"policy": AT_ONSET})
    assert "pace_temp" not in reply["policy"]  # not paced, and it says so
    assert reply["origin"].endswith(f"; {NOT_PACED}")
    other.close()
    assert json.loads((calibrated.home / "policy.json").read_text()) == AT_ONSET

    calibrated.process.send_signal(signal.SIGTERM)
    assert calibrated.process.wait(timeout=15) == 0
    again = connect(ctx, agents.start("mac1", thermal=PLANT))
    kept = again.request("policy.get")
    assert kept["policy"]["pace_temp"] == onset and kept["origin"] == said
    with pytest.raises(AgentError) as refused:  # bad input: refused, the policy stays
        again.request("policy.set", {"policy": {"pace_at_onset": "yes"}})
    assert refused.value.code == p.BAD_POLICY
    assert "pace_at_onset must be true or false" in str(refused.value)
    off = again.request("policy.set", {"policy": {"pace_at_onset": False}})
    assert "pace_temp" not in off["policy"] and off["origin"] == point.origin()
    again.close()


@pytest.mark.slow
def test_agent_run_paces_at_the_onset_of_the_calibration_made_with_its_source(
    point: ThrottlePoint, fleet_home: Path
) -> None:
    save_calibration(point)
    done = run_cli(
        "agent", "run", "--thermal-source", PLANT, "--pace-at-onset", "--", sys.executable, "-c",
        "pass",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    onset = round(point.onset_c, 1)
    assert f"paced under {onset:g} °C ({point.origin()}; paced at its onset" in done.stderr
    other = run_cli(
        "agent", "run", "--thermal-source", "sim", "--pace-at-onset", "--", sys.executable, "-c",
        "pass",
    )  # fmt: skip
    assert f"(the seed's defaults; {NOT_PACED})" in other.stderr


@pytest.mark.slow
def test_a_cap_and_the_onset_together_are_one_line_exit_2() -> None:
    done = run_cli("coordinator", "policy", "--pace-at-onset", "--pace-temp", "80")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: give --pace-temp or --pace-at-onset, not both"


@pytest.mark.slow
def test_a_job_under_the_daemon_gets_the_clock_its_samples_carry(
    ctx: zmq.Context, agents: AgentPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Build 5's second input under `agent serve`: the feed of a job it supervises (the local
    session, agent.cooling.session) hands on each sample's clocks, as a local plant's does."""
    agent = trusted_agent(agents, thermal=PLANT, options=["--poll-interval", "0.1"])
    sub = subscriber(ctx, agent)
    monkeypatch.setenv("MLX_FLEET_HOME", str(agent.home))  # a process of the agent's user
    session = connect_daemon(warn=False)
    assert session is not None
    try:
        published = receive(sub, lambda m: m.type == "telemetry.sample").body
        seen = session.next_sample(threading.Event())
        assert seen is not None and seen.clock is not None
        assert seen.clock.source == published["clock_source"] != "none"
        assert seen.clock.simulated is True  # the plant's clocks, a model's: labelled so
        assert sample_clock({**published, "clock_source": None}) is None  # an older agent
    finally:
        session.close()
        sub.close()


@pytest.mark.slow
def test_coordinator_policy_sets_it_once_for_the_fleet(
    agents: AgentPool, point: ThrottlePoint
) -> None:
    (agents.root / "mac1").mkdir(parents=True)
    save_calibration(point, agents.root / "mac1" / "calibration.json")
    calibrated, bare = agents.start("mac1", thermal=PLANT), agents.start("mac2", thermal=PLANT)
    for agent in (calibrated, bare):
        exchange_keys(agent)
    hosts = f"{calibrated.address},{bare.address}"
    done = cli("coordinator", "policy", "--hosts", hosts, "--pace-at-onset", "-o", "json")
    assert done.returncode == 0, done.stderr
    first, second = json.loads(done.stdout)
    onset = round(point.onset_c, 1)
    assert first["policy"]["pace_temp"] == onset and "paced at its onset" in first["origin"]
    assert "pace_temp" not in second["policy"] and second["origin"].endswith(NOT_PACED)
    table = cli("coordinator", "policy", "--hosts", hosts)  # shown, and said, in the table
    assert f"{onset:g}" in table.stdout and "run agent calibrate" in table.stdout
