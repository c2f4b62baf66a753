"""Who a system service runs as, where its data lives, and whether root may run its program.

`sudo brew services` writes `UserName` into the LaunchDaemon when asked to run as a user, and
otherwise chowns what a root service runs to root ("protections to avoid users editing root
services", Homebrew/brew Library/Homebrew/services/cli.rb `take_root_ownership`). We never
chown a user's files: a root service whose interpreter or package a non-root user could edit is
refused, with the fix. The only folders root chowns are those it creates for a service's user.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from agent.service.managers import ServiceRefused

ROOT = "root"
TRUSTED_GROUPS = frozenset({0, 80})
"""Groups whose write access grants nothing new: wheel (0) and macOS's admin (80), whose members
can sudo anyway (Homebrew leaves root services' files group admin)."""


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: Path

    @property
    def is_root(self) -> bool:
        return self.uid == 0


def account(name: str) -> Account:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ServiceRefused(f"--run-as {name}: no such user on this machine") from None
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))


def invoking_account() -> Account:
    """The user behind this command: sudo's caller (SUDO_USER), else whoever runs it."""
    sudo_user = os.environ.get("SUDO_USER")
    if os.geteuid() == 0 and sudo_user and sudo_user != ROOT:
        return account(sudo_user)
    entry = pwd.getpwuid(os.getuid())
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))


def default_data_dir(home: Path, platform: str = sys.platform) -> Path:
    """platformdirs' user data dir for a home other than $HOME's (a service's user)."""
    if platform == "darwin":
        return home / "Library" / "Application Support" / "mlx-fleet"
    return home / ".local" / "share" / "mlx-fleet"


def editable_by_others(paths: Iterable[Path]) -> str | None:
    """Why a non-root user could change what these paths hold (each, and every folder above
    it), or None when only root (and its trusted groups) can."""
    for path in paths:
        for entry in [path, *path.parents]:
            info = entry.stat()
            if info.st_uid != 0:
                return f"{entry} is owned by uid {info.st_uid}, not root"
            if info.st_mode & stat.S_IWOTH:
                return f"{entry} is writable by every user"
            if info.st_mode & stat.S_IWGRP and info.st_gid not in TRUSTED_GROUPS:
                return f"{entry} is writable by group {info.st_gid}"
    return None


def root_program_problem(program: list[str]) -> str | None:
    """Why root must not run `program` (this installation's interpreter and package)."""
    package = Path(__file__).resolve().parents[1]  # agent/, whose code root would run
    return editable_by_others([Path(program[0]).resolve(), package])
