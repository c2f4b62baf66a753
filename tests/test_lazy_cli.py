"""Instant CLIs: `agent` and `coordinator` import a command's module only when that command
runs, so --help and every command pay only for what they use (shared.io.app). Checked in fresh
interpreters, by the modules each one ends up holding, never by a clock."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer
import typer.testing

from agent.cli import COMMANDS as AGENT_COMMANDS
from agent.cli import app as agent_app
from coordinator.cli import COMMANDS as COORDINATOR_COMMANDS
from coordinator.cli import app as coordinator_app
from shared.io.app import LazyCommand
from tests.conftest import subprocess_env

pytestmark = pytest.mark.timeout(120)

HEAVY = ("mlx", "mlx_lm", "matplotlib", "prometheus_client", "zmq", "psutil", "numpy")
PROBE = """
import json, sys
sys.argv = {argv!r}
from {program}.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted({{name.split(".")[0] for name in sys.modules}})), file=sys.stderr)
"""


def imported_by(*argv: str) -> set[str]:
    """The top-level packages a fresh interpreter holds after running `argv` (the help shown)."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=list(argv), program=argv[0])],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout, result.stdout
    return set(json.loads(result.stderr.splitlines()[-1]))


@pytest.mark.parametrize("program", ["agent", "coordinator"])
def test_top_level_help_imports_no_mlx_nor_any_heavy_package(program: str) -> None:
    assert imported_by(program, "--help") & set(HEAVY) == set()


NEEDS_MLX = {"bench", "serve"}
"""`agent serve` names the device and MLX version in info.ok (agent.profiling.machine)."""


@pytest.mark.parametrize("entry", AGENT_COMMANDS, ids=lambda entry: entry.name)
@pytest.mark.slow
def test_an_agent_command_imports_mlx_only_when_it_runs_mlx(entry: LazyCommand) -> None:
    held = imported_by("agent", entry.name, "--help")
    assert held & {"matplotlib", "prometheus_client", "mlx_lm"} == set()
    assert ("mlx" in held) == (entry.name in NEEDS_MLX)


@pytest.mark.parametrize("entry", COORDINATOR_COMMANDS, ids=lambda entry: entry.name)
def test_no_coordinator_command_imports_mlx_plotting_or_metrics_at_start(
    entry: LazyCommand,
) -> None:
    held = imported_by("coordinator", entry.name, "--help")
    assert held & {"mlx", "mlx_lm", "matplotlib", "prometheus_client"} == set()


def test_history_needs_no_zeromq() -> None:
    assert "zmq" not in imported_by("coordinator", "history", "--help")


@pytest.mark.parametrize(
    ("app", "entry"),
    [(agent_app, e) for e in AGENT_COMMANDS] + [(coordinator_app, e) for e in COORDINATOR_COMMANDS],
    ids=lambda value: getattr(value, "name", ""),
)
def test_each_listed_summary_is_its_commands_docstring(
    app: typer.Typer, entry: LazyCommand
) -> None:
    loaded = typer.main.get_command(app).get_command(None, entry.name)  # type: ignore[attr-defined]
    first_paragraph = (loaded.help or "").split("\n\n")[0]
    assert " ".join(entry.summary.split()) == " ".join(first_paragraph.split())


def test_a_mistyped_command_is_answered_with_the_closest_ones() -> None:
    result = typer.testing.CliRunner().invoke(coordinator_app, ["statu"])
    assert result.exit_code == 2
    assert "No such command 'statu'. Did you mean 'status', 'stage'?" in result.output
