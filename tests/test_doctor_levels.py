"""`coordinator doctor --level 2` on two real agents: one table, a verdict per host; the fixed
decode cell's figures stored, so the family's band is learned from them (bad levels:
tests/test_doctor_burn_in.py)."""

from __future__ import annotations

import json

import pytest

from tests.fleet_support import AgentPool, AgentProcess, cli, exchange_keys

pytestmark = pytest.mark.timeout(300)
COOL_SIM = "sim:max_w=10"
"""The simulated sensor follows this whole machine's CPU load: capped at 50 °C, so that other
tests' load cannot heat the decode cell into a cooling pause (this test is not about cooling)."""


def cool_pair(agents: AgentPool) -> tuple[list[AgentProcess], str]:
    """Agents mac1 and mac2 on COOL_SIM, each trusting the coordinator: they and their --hosts."""
    pair = [agents.start("mac1", thermal=COOL_SIM), agents.start("mac2", thermal=COOL_SIM)]
    for agent in pair:
        exchange_keys(agent)
    return pair, ",".join(agent.address for agent in pair)


@pytest.mark.slow
def test_level_2_on_two_agents_prints_one_table_with_a_verdict_per_host(
    agents: AgentPool,
) -> None:
    pair, names = cool_pair(agents)
    first = cli(
        "coordinator", "doctor", "--level", "2", "--hosts", names, "-o", "json", timeout=240
    )
    assert first.returncode in (0, 1), first.stderr
    rows = json.loads(first.stdout)
    assert [row["host"] for row in rows] == [agent.address for agent in pair]
    for row in rows:
        assert row["verdict"] in ("pass", "fail") and row["tokens_per_sec"], row["why"]
        assert row["band"] is None and row["band_runs"] == 0  # the family's first level 2
        assert row["sensor"].endswith("°C")  # the simulated source, labelled in the cell
        assert (row["verdict"] == "fail") == bool(row["why"])
        memory = row["memory"]
        # the probe, on MLX's CPU device here: the CPU's path, no spec
        assert memory["read"]["gbs"] > 0 and memory["read"]["repetitions"] == 5
        assert memory["copy"]["gbs"] > 0 and memory["backend"] == "cpu"
        assert memory["fraction"] is None and memory["spec_gbs"] is None
        assert "CPU's memory path" in memory["path"] and "no fraction" in memory["why"]
        assert row["memory_band"] is None and row["memory_band_runs"] == 0
    held = json.loads(cli("coordinator", "health", "--no-record", "-o", "json").stdout)
    failed = {row["host"] for row in rows if row["verdict"] == "fail"}
    assert {host for host, found in held["conditions"].items() if found} == failed

    valid = sum(1 for row in rows if not any("decode cell is" in why for why in row["why"]))
    result = cli("coordinator", "doctor", "--level", "2", "--hosts", names, timeout=240)
    assert result.returncode in (0, 1), result.stderr
    assert result.stdout.count("mlx-fleet doctor, level 2") == 1
    for agent in pair:
        line = next(line for line in result.stdout.splitlines() if agent.address in line)
        assert " pass" in line or " fail" in line
    assert f"no band yet ({valid} of 3" in result.stdout
    assert "CPU path" in result.stdout and "no band yet (2 of 3)" in result.stdout
