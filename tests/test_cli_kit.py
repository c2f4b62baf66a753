"""One CLI kit: an option is declared once (shared.io.options) and every command that takes it
gets the same flags, help, default and check."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import pytest
import typer
import typer.testing

from agent.cli import app as agent_app
from coordinator.cli import app as coordinator_app
from shared.cooling.policy import ThermalPolicy
from shared.io.options import MatrixOptions, PolicyOptions, ThermalOptions, with_options


def command(app: typer.Typer, name: str) -> Any:
    """The Click command Typer builds for `name`."""
    return typer.main.get_command(app).get_command(None, name)  # type: ignore[attr-defined]


def options_of(cmd: Any, group: type) -> dict[str, tuple[Any, ...]]:
    """The group's options as the command exposes them: flags, default, help."""
    names = {f.name for f in fields(group)}
    return {
        p.name: (tuple(p.opts), p.default, getattr(p, "help", None))
        for p in cmd.params
        if p.name in names
    }


def test_agent_bench_and_coordinator_benchmark_take_the_same_matrix() -> None:
    bench = options_of(command(agent_app, "bench"), MatrixOptions)
    benchmark = options_of(command(coordinator_app, "benchmark"), MatrixOptions)
    assert bench == benchmark and len(bench) == len(fields(MatrixOptions))
    assert bench["n_prompt"][:2] == (
        ("-p", "--n-prompt", "-s", "--seq-lengths", "--prompt-tokens"),
        "512",
    )
    assert bench["n_gen"][:2] == (
        ("-n", "--n-gen", "--decode-tokens", "--generation-tokens"),
        "128",
    )
    assert bench["repetitions"][:2] == (
        ("-r", "--repetitions", "-i", "--iterations", "--num-trials"),
        "5",
    )
    assert bench["pg"][0] == ("-pg",) and bench["n_depth"][:2] == (("-d", "--n-depth"), "0")


@pytest.mark.parametrize("name", ["bench", "run", "temp", "serve"])
def test_every_agent_command_takes_the_thermal_options_alike(name: str) -> None:
    thermal = options_of(command(agent_app, name), ThermalOptions)
    assert thermal == options_of(command(agent_app, "bench"), ThermalOptions)
    assert thermal["thermal_source"][:2] == (("--thermal-source", "--source"), "auto")


@pytest.mark.parametrize("name", ["bench", "run", "temp"])
def test_the_policy_options_unset_take_the_thermal_sources_defaults(name: str) -> None:
    exposed = options_of(command(agent_app, name), PolicyOptions)
    assert {key: value[1] for key, value in exposed.items()} == dict.fromkeys(
        ("max_speed_temp", "pause_temp", "stop_temp", "hysteresis", "pace_temp", "pace_slice",
         "pace_min_duty", "pace_at_onset")
    )  # fmt: skip
    smc = PolicyOptions().in_force("smc")
    assert str(smc) == "policy 95/114/120 °C (defaults for smc)"
    given = PolicyOptions(stop_temp=118.0).in_force("smc")
    assert given.policy == replace(smc.policy, stop_temp=118.0)
    assert given.origin == "set on the command line, the rest defaults for smc"
    assert PolicyOptions().in_force(None).policy == ThermalPolicy()  # sim, replay: the seed's


def test_with_options_builds_each_group_for_the_command() -> None:
    heard: list[Any] = []

    @with_options
    def probe(first: str, thermal: ThermalOptions, limits: PolicyOptions, last: int = 3) -> None:
        heard.append((first, thermal, limits, last))

    app = typer.Typer()
    app.command()(probe)
    result = typer.testing.CliRunner().invoke(
        app, ["x", "--thermal-source", "none", "--pause-temp", "80", "--last", "4"]
    )
    assert result.exit_code == 0, result.output
    assert heard == [("x", ThermalOptions("none", 1.0), PolicyOptions(pause_temp=80.0), 4)]
    refused = typer.testing.CliRunner().invoke(app, ["x", "--poll-interval", "0"])
    assert refused.exit_code == 2
