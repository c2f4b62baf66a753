"""Writing a service definition as launchd wants it, and the folders root makes for a service's
user: a plist replaced whole (temporary file, mode, owner, rename), never edited in place."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from agent.service.managers import ServiceRefused

DEFINITION_MODE = 0o644
"""What Homebrew chmods a service file to after copying it (services/cli.rb
install_service_file); launchd refuses a LaunchDaemon plist that is group- or world-writable."""
ROOT_WHEEL = (0, 0)
"""A LaunchDaemon's (and a system unit's) owner: launchd refuses one not owned by root."""


def refuse_odd_definition(path: Path) -> None:
    """A definition path that is there but is no regular file (a folder, a symlink) is not
    ours to replace or remove: refused before anything changes."""
    if path.is_symlink():
        problem = f"{path} is a symlink (to {os.readlink(path)}), not a regular file"
    elif path.exists() and not path.is_file():
        problem = f"{path} is there but is not a regular file"
    else:
        return
    raise ServiceRefused(f"{problem}: nothing was changed (move it away, then run this again)")


def write_definition(path: Path, data: bytes, owner: tuple[int, int] | None) -> None:
    """A temporary file beside `path`, given mode 0644 (and `owner`), renamed over it: a file
    that was there is replaced, never edited keeping its old owner or mode."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            os.fchmod(file.fileno(), DEFINITION_MODE)
            if owner is not None:
                os.fchown(file.fileno(), *owner)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def make_folder(folder: Path, owner: tuple[int, int] | None) -> None:
    """mkdir -p; folders root creates for another user's service are given to that user (root
    creates them, so they are chowned, and nothing is ever written inside them as root)."""
    missing = [path for path in (folder, *folder.parents) if not path.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    if owner is not None and os.geteuid() == 0:
        for path in missing:
            os.chown(path, *owner, follow_symlinks=False)
