"""policy.get / policy.set against a real `agent serve`: validated, announced, persisted, and
still in force after a restart; a bad policy is refused with its reason and changes nothing."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest
import zmq

from shared.cooling.calibration import SET_BY_COORDINATOR, source_defaults
from shared.cooling.policy import ThermalPolicy
from shared.io.transport import AgentError
from shared.wire import protocol as p
from tests.fleet_support import AgentPool, connect, receive, subscriber, trusted_agent

DEFAULT = ThermalPolicy().to_dict()
SEED = source_defaults(None).origin  # the agents here read sim: no Mac calibrates it
PUSHED = f"{SET_BY_COORDINATOR}, the rest {SEED}"


@pytest.mark.parametrize(
    ("policy", "needle"),
    [
        ({"max_speed_temp": 90}, "thresholds out of order"),
        ({"stop_temp": 80}, "stop_temp=80"),
        ({"pause_temp": True}, "pause_temp must be a finite number"),
        ({"pause_temp": "hot"}, "pause_temp must be a finite number"),
        ({"pause_tmp": 80}, "unknown ThermalPolicy keys: pause_tmp"),
        ({"pause_duration": 0}, "pause_duration must be > 0"),
    ],
)
@pytest.mark.slow
def test_a_bad_policy_is_refused_with_its_reason_and_the_old_one_stays(
    ctx: zmq.Context, agents: AgentPool, policy: dict[str, Any], needle: str
) -> None:
    client = connect(ctx, trusted_agent(agents))
    with pytest.raises(AgentError) as refused:
        client.request("policy.set", {"policy": policy})
    assert refused.value.code == p.BAD_POLICY and needle in str(refused.value)
    assert "stays max_speed_temp=75" in str(refused.value)
    assert client.request("policy.get") == {"policy": DEFAULT, "origin": SEED}
    client.close()


@pytest.mark.slow
def test_a_policy_is_applied_announced_and_kept_across_a_restart(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    agent = trusted_agent(agents, options=["--poll-interval", "0.1"])
    client = connect(ctx, agent)
    assert client.request("policy.get") == {"policy": DEFAULT, "origin": SEED}
    sub = subscriber(ctx, agent)
    receive(sub, lambda m: m.type == "telemetry.sample")  # subscribed for sure
    pushed = client.request("policy.set", {"policy": {"pause_temp": 80, "hysteresis": 2}})
    expected = {**DEFAULT, "pause_temp": 80.0, "hysteresis": 2.0}
    assert pushed == {"policy": expected, "origin": PUSHED}
    announced = receive(sub, lambda m: m.type == "telemetry.event")
    assert announced.body["action"] == "policy" and announced.body["job"] is None
    assert "pause_temp=80 " in announced.body["detail"]
    assert announced.body["policy"] == expected  # the whole map: no policy.get needed
    client.request("policy.set", {"policy": {"pause_temp": 80}})  # no change: no event
    assert client.request("info")["policy"] == expected
    # only what the coordinator set is kept: the rest stays the source's defaults
    assert json.loads((agent.home / "policy.json").read_text()) == {
        "pause_temp": 80,
        "hysteresis": 2,
    }
    events = client.request("history.get", {"samples_after": 0, "events_after": 0})["events"]
    assert [e["action"] for e in events] == ["policy"]
    client.close()

    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(timeout=15) == 0
    assert not (agent.home / "agent-serve.json").exists()
    again = connect(ctx, agents.start("agent"))
    assert again.request("policy.get") == {"policy": expected, "origin": PUSHED}
    again.close()


@pytest.mark.slow
def test_an_unusable_saved_policy_falls_back_to_the_default_loudly(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    agent = trusted_agent(agents)
    agent.kill()
    (agent.home / "policy.json").write_text('{"pause_temp": 99}')
    again = agents.start("agent")
    assert connect(ctx, again).request("policy.get") == {"policy": DEFAULT, "origin": SEED}
    assert "cannot use the saved policy" in again.log_text()
