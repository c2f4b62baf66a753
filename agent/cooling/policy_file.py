"""policy.json: the thresholds a coordinator set, kept on disk so that a restart enforces what
was pushed. Its own module in cooling/, below both its readers: the daemon, which enforces and
saves it (agent.daemon.policy's SavedPolicy), and `agent doctor`, which shows the policy in
force; so doctor reads it without importing the daemon."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from shared.cooling.policy import check_changes, given_numbers
from shared.io.files import replace_atomically
from shared.io.paths import data_dir

log = logging.getLogger("agent.history")  # the name its log lines have always carried


def policy_path() -> Path:
    return data_dir() / "policy.json"


def load_policy(path: Path | None = None) -> dict[str, float | None] | None:
    """The thresholds a coordinator set (only those: the rest are the source's defaults), else
    None. A file that cannot be used is reported and the defaults enforced: a safe policy beats
    none."""
    path = path or policy_path()
    try:
        given = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(given, dict):
            raise ValueError("not a JSON object")
        check_changes(given)
        return given_numbers(given)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        log.error("cannot use the saved policy %s (%s): enforcing the defaults", path, exc)
        return None


def save_policy(given: Mapping[str, float], path: Path | None = None) -> None:
    """Replace the saved thresholds atomically; raises OSError."""
    replace_atomically(path or policy_path(), json.dumps(dict(given)))
