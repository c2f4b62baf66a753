"""One check of `agent doctor`: its name, passed or failed, what was found and the fix. Its own
module, below every module that makes checks (checks.py, firewall.py, mac_setup.py,
load_checks.py), so that those import it without importing each other.

A check is `required` when the agent cannot run without it: the exit code is 0 when every
required check passed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str | None = None
    required: bool = False
