"""Where the local agent daemon answers: the state file (`agent-serve.json`, address and pid)
that a running `agent serve` writes in its data directory and its local clients read."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from shared.io.files import replace_atomically
from shared.io.paths import data_dir

STATE_FILE = "agent-serve.json"


@dataclass(frozen=True)
class DaemonAddress:
    """Where this machine's daemon listens, as its state file says."""

    pid: int
    endpoint: str
    telemetry: str
    public_key: str | None


def state_path() -> Path:
    return data_dir() / STATE_FILE


def pid_alive(pid: int) -> bool:
    """Whether the process lives (a negative pid: whether any of that process group does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def write_state(address: DaemonAddress) -> None:
    """Publish where the daemon listens (0600, replaced atomically: a stale file from a killed
    daemon is overwritten)."""
    replace_atomically(
        state_path(),
        json.dumps(
            {
                "pid": address.pid,
                "endpoint": address.endpoint,
                "telemetry": address.telemetry,
                "public_key": address.public_key,
            }
        ),
    )


def remove_state(pid: int) -> None:
    """Remove the state file if it is still this daemon's."""
    found = read_state()
    if found is not None and found.pid == pid:
        state_path().unlink(missing_ok=True)


def read_state() -> DaemonAddress | None:
    try:
        data = json.loads(state_path().read_text(encoding="utf-8"))
        return DaemonAddress(
            int(data["pid"]), str(data["endpoint"]), str(data["telemetry"]), data["public_key"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def find_daemon() -> DaemonAddress | None:
    """This data directory's running daemon; None when there is none (or only a stale file)."""
    found = read_state()
    return found if found is not None and pid_alive(found.pid) else None
