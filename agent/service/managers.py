"""Calling the service managers (launchctl, systemctl): one way to run them and to say how
they failed, so every error names the exact command, its exit code and the manager's words."""

from __future__ import annotations

import os
import shlex
import subprocess

MANAGER_TIMEOUT_S = 60
ACT_AS_UID_ENV = "MLX_FLEET_SERVICE_UID"
"""Stands in for getuid()/geteuid() where the service's scope and launchd domain are chosen, as
MLX_FLEET_CONSOLE_DEVICE stands in for /dev/console: a suite run as root simulates a user. It
never grants anything: writing a system service still needs the real euid 0."""


def acting_ids() -> tuple[int, int]:
    """(uid, euid) the scope and domain decisions look at."""
    stand_in = os.environ.get(ACT_AS_UID_ENV)
    if stand_in:
        return int(stand_in), int(stand_in)
    return os.getuid(), os.geteuid()


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
