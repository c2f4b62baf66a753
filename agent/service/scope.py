"""`agent install --auto`: which service a host gets, and root for it through `sudo -n`.

A LaunchAgent needs its user at the screen (`gui/<uid>`) or lives in `user/<uid>`, which launchd
does not restore after a reboot; a headless Mac wants a LaunchDaemon with `UserName`, what
`sudo brew services` writes (mac-desk-check.md, launchd). `sudo -n` never prompts: over
BatchMode ssh there is nobody to answer.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from agent.service.files import LAUNCHD
from agent.service.launchctl import Session

SUDO_TIMEOUT_S = 30


@dataclass(frozen=True)
class ScopeChoice:
    system: bool
    why: str
    fallback: str = ""
    """What a user service means here, when the system one cannot be had (no sudo)."""


def auto_scope(flavour: str, session: Session, system_installed: bool) -> ScopeChoice:
    """System for root, for a Mac this user is not logged in to at the screen, and where a
    system service is already installed (it keeps working whoever logs in); user otherwise."""
    if flavour != LAUNCHD:
        return ScopeChoice(
            False, "a systemd user service; `loginctl enable-linger` keeps it up without a login"
        )
    uid = session.euid
    stays = (
        f"a LaunchAgent in user/{uid}, which launchd does not bring back after a reboot until "
        "this user logs in (allow passwordless sudo for this agent to get a LaunchDaemon)"
    )
    if session.euid == 0:
        return ScopeChoice(True, "root: a LaunchDaemon in the system domain")
    if system_installed:
        return ScopeChoice(
            True,
            "a system service is installed here: it is replaced, running as this user",
            f"a system service is installed here but `sudo -n` is not allowed: {stays}",
        )
    if not session.at_screen:
        return ScopeChoice(
            True,
            f"uid {uid} is not logged in at the screen: a LaunchDaemon running as this user, "
            "up at boot",
            f"uid {uid} is not logged in at the screen and `sudo -n` is not allowed: {stays}",
        )
    return ScopeChoice(False, f"uid {uid} is logged in at the screen: a LaunchAgent in gui/{uid}")


class SudoRefused(Exception):
    """sudo is missing, or will not run the command without a password."""


def sudo_answer(argv: list[str]) -> subprocess.CompletedProcess[str] | None:
    """`sudo -n -l ARGV`: whether the policy lets this user run ARGV without a password
    (sudo(8): -l with a command prints it when permitted; -n fails instead of prompting)."""
    sudo = shutil.which("sudo")
    if sudo is None:
        return None
    return subprocess.run(
        [sudo, "-n", "-l", *argv], capture_output=True, text=True, timeout=SUDO_TIMEOUT_S
    )


def sudo_allows(argv: list[str]) -> bool:
    answer = sudo_answer(argv)
    return answer is not None and answer.returncode == 0


def escalated(argv: list[str]) -> list[str]:
    """ARGV run as root through `sudo -n`; SudoRefused saying why when it would not run."""
    answer = sudo_answer(argv)
    if answer is None:
        raise SudoRefused("sudo is not installed")
    if answer.returncode != 0:
        said = (answer.stderr or answer.stdout).strip().splitlines()
        raise SudoRefused(f"`sudo -n` refused: {said[-1] if said else 'not allowed'}")
    return [shutil.which("sudo") or "sudo", "-n", *argv]
