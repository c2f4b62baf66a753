"""`coordinator monitor` in a real terminal: tmux at 80 columns, then resized narrower and wider,
with a real agent; every capture shows the table whole (no host name, sparkline or row broken
across lines, no line past the width) and once (a resize leaves no old lines behind)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import console_script
from tests.fleet_support import AgentPool
from tests.test_monitor import known_agent

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
]
TITLE = "mlx-fleet thermal monitor"


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[list[str]]:
    """The tmux command line of a server of this test's own (its socket under tmp_path). The
    server runs in the foreground (-D) as this test's child, so that it, and the monitor in its
    pane, die with the test run however it ends (tests/conftest.py); a daemon would outlive it."""
    socket_path = tmp_path / "tmux.sock"
    command = ["tmux", "-S", str(socket_path)]
    server = subprocess.Popen(
        [*command, "-D"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not socket_path.is_socket():  # else the first command would start a daemon server
        assert server.poll() is None, f"tmux -D exited {server.returncode}"
        assert time.monotonic() < deadline, "tmux -D made no socket"
        time.sleep(0.05)
    yield command
    subprocess.run([*command, "kill-server"], capture_output=True, timeout=10)
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout=10)


def screen(tmux: list[str]) -> list[str]:
    captured = subprocess.run(
        [*tmux, "capture-pane", "-p", "-t", "monitor"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    return captured.stdout.rstrip("\n").splitlines()


def shown_whole(lines: list[str], host: str, width: int) -> bool:
    """One title, one header, the host's row on one line with its temperature and sparkline."""
    rows = [line for line in lines if host in line]
    return (
        sum(TITLE in line for line in lines) == 1
        and sum("SoC °C" in line for line in lines) == 1
        and len(rows) == 1
        and "70.0" in rows[0]
        and any(block in rows[0] for block in "▁▂▃▄▅▆▇█")
        and all(len(line) <= width for line in lines)
    )


def wait_for(tmux: list[str], host: str, width: int) -> list[str]:
    deadline = time.monotonic() + 60
    while not shown_whole(lines := screen(tmux), host, width):
        assert time.monotonic() < deadline, "\n".join(lines)
        time.sleep(0.3)
    return lines


@pytest.mark.slow
def test_the_dashboard_reads_at_80_columns_and_repaints_on_resize(
    agents: AgentPool, tmux: list[str], tmp_path: Path
) -> None:
    agent = known_agent(agents, "mac1", 70.0, tmp_path, ("--name", "mac1"))
    monitor = f"{console_script('coordinator')} monitor --hosts {agent.address}"
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "monitor", "-x", "80", "-y", "30", monitor],
        check=True,
        timeout=10,
    )
    first = wait_for(tmux, agent.address, 80)
    assert not any(line.startswith("│") and agent.address not in line for line in first[:6])
    for width in (60, 120, 80):
        subprocess.run(
            [*tmux, "resize-window", "-t", "monitor", "-x", str(width), "-y", "30"],
            check=True,
            timeout=10,
        )
        wait_for(tmux, agent.address, width)
