"""Writing files so that no reader ever sees half of one: the one way every module does it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def _partial(path: Path) -> Path:
    """A private sibling to write first: same folder (so a rename is atomic), unique per process."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_private(path: Path, text: str) -> None:
    """Create `path` whole with mode 0600, or raise FileExistsError: written to a private
    temporary file first and linked into place, so it never exists half written and two
    processes racing to create it never overwrite each other."""
    partial = _partial(path)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.link(partial, path)
    finally:
        partial.unlink()


def replace_atomically(path: Path, text: str, mode: int = 0o600) -> None:
    """Write `text` to `path`, replacing what was there in one step (a rename); the file has
    `mode` from its first byte. Raises OSError."""
    partial = _partial(path)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def make_private(path: Path) -> None:
    """Create `path` empty with mode 0600, or take group and other access off the file that is
    there (one an earlier release made 0644); a file of another user's is left as it is."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        with contextlib.suppress(OSError):
            if path.stat().st_mode & 0o077:
                path.chmod(0o600)
