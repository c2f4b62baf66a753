"""Calling the service managers (launchctl, systemctl): one way to run them and to say how
they failed, so every error names the exact command, its exit code and the manager's words."""

from __future__ import annotations

import shlex
import subprocess

MANAGER_TIMEOUT_S = 60


class ServiceError(Exception):
    """A service operation that failed; the message says why."""

    exit_code = 1


class ServiceRefused(ServiceError):
    """A request refused before anything changed (no root, nothing to purge): a usage error."""

    exit_code = 2


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=MANAGER_TIMEOUT_S)
    except FileNotFoundError:
        raise ServiceError(f"{command[0]} not found: is this a {command[0]} system?") from None
    except subprocess.TimeoutExpired:
        raise ServiceError(
            f"{shlex.join(command)} did not answer in {MANAGER_TIMEOUT_S} s"
        ) from None


def failure(command: list[str], result: subprocess.CompletedProcess[str]) -> str:
    """The manager's own words for a failed call, with the command and its exit code."""
    said = " ".join((result.stderr or result.stdout).split())
    return f"{shlex.join(command)} failed (exit code {result.returncode}): {said or 'no message'}"


def check(command: list[str]) -> str:
    """Run a manager command that must succeed; returns it as a line for the report."""
    result = run(command)
    if result.returncode != 0:
        raise ServiceError(failure(command, result))
    return shlex.join(command)
