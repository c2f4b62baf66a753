"""Fixtures shared by the whole suite: an isolated data directory and the console scripts."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import zmq

if TYPE_CHECKING:
    from tests.fleet_support import AgentPool

# A suite started in the background of a non-interactive shell (`pytest &`) inherits SIGINT
# ignored, and an ignored signal stays ignored across exec: the agents and CLIs the Ctrl-C tests
# start would never see theirs. A handler, unlike SIG_IGN, is reset to the default at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def fleet_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own MLX_FLEET_HOME, so no test reads or writes the user's data."""
    home = tmp_path / "fleet-home"
    monkeypatch.setenv("MLX_FLEET_HOME", str(home))
    return home


def console_script(name: str) -> str:
    """The installed console script next to this interpreter (the venv's), else on PATH."""
    candidate = Path(sys.executable).with_name(name)
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"console script {name!r} is not installed; run pip install -e .")
    return found


@pytest.fixture
def agent_cli() -> str:
    return console_script("agent")


@pytest.fixture
def coordinator_cli() -> str:
    return console_script("coordinator")


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def run_cli(
    program: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """One of our console scripts run to its end, output captured, 250 columns so Rich wraps
    nothing a test reads; `env` added to the test's environment."""
    return subprocess.run(
        [console_script(program), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(COLUMNS="250", **(env or {})),
    )


SERVICE_MANAGER_FAKE = Path(__file__).parent / "fakes" / "service_manager.py"
"""launchctl and systemctl, faked (tests/test_service*.py)."""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An empty folder to be a user's home directory (`agent install`'s LaunchAgents and
    systemd user units go under it)."""
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def fake_managers(tmp_path: Path) -> Path:
    """A PATH directory whose launchctl and systemctl are SERVICE_MANAGER_FAKE; the fake keeps
    its state beside it (`service-state.json` in its parent)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("launchctl", "systemctl"):
        (bin_dir / name).symlink_to(SERVICE_MANAGER_FAKE)
    return bin_dir


@pytest.fixture
def tool_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake powermetrics, macmon and sudo (tests/fixtures/fake_tool.py) first on PATH; returns
    the log of their starts."""
    fake_tool = Path(__file__).parent / "fixtures" / "fake_tool.py"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("powermetrics", "macmon", "sudo"):
        wrapper = bin_dir / tool
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake_tool}" {tool} "$@"\n')
        wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "starts.log"
    monkeypatch.setenv("FAKE_TOOL_LOG", str(log))
    return log


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    """A ZeroMQ context for the test's sockets, destroyed after it."""
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[AgentPool]:
    """Start real `agent serve` processes with `agents.start(name)`; all are killed after."""
    from tests.fleet_support import AgentPool

    pool = AgentPool(tmp_path / "agents")
    yield pool
    pool.kill_all()
