"""Where mlx-fleet keeps its data: one directory for results, logs and keys, and the one check a
command makes of it before it starts, so a bad one is one line, not a traceback after the work."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import platformdirs

HOME_ENV = "MLX_FLEET_HOME"


class DataDirError(OSError):
    """The data directory cannot be used: the message names it and says why in the system's
    words. An OSError, so that code which survives a failed write (the daemon) survives it."""


def data_dir(create: bool = True) -> Path:
    """`$MLX_FLEET_HOME` when set, else the platform's user data dir; created on first use,
    private to this user (0700): it holds keys, journals and logs. Raises DataDirError."""
    configured = os.environ.get(HOME_ENV)
    if configured:
        path = Path(configured).expanduser()
    else:
        path = Path(platformdirs.user_data_dir("mlx-fleet"))
    if create:
        try:
            make_folders(path)
        except OSError as exc:
            raise data_dir_error(path, exc) from None
    return path


def data_subdir(name: str) -> Path:
    return private_dir(data_dir() / name)


def make_folders(path: Path) -> None:
    """`path` and every folder missing on the way to it, each 0700 (mkdir's `parents` makes
    those with the umask's mode, 0755). Raises OSError, NotADirectoryError for a file."""
    missing = [folder for folder in (path, *path.parents) if not folder.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)  # another process may make it first
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))


def private_dir(path: Path) -> Path:
    """A folder of the tools' own (not the data dir, which a user may have chosen): made as
    make_folders() does, and closed to 0700 when an earlier release left it more open."""
    make_folders(path)
    info = path.stat()
    if info.st_mode & 0o077 and info.st_uid == os.geteuid():
        path.chmod(0o700)
    return path


def data_dir_error(path: Path, exc: OSError) -> DataDirError:
    """One line naming `path` with the system's words for what `exc` says went wrong."""
    if isinstance(exc, NotADirectoryError) and path.exists():
        return not_a_directory(path, path.stat().st_mode)
    where = f" ({exc.filename})" if exc.filename and Path(exc.filename) != path else ""
    return DataDirError(f"data dir {path}: {exc.strerror or exc}{where}")


def not_a_directory(path: Path, mode: int) -> DataDirError:
    kind = "a file" if stat.S_ISREG(mode) else "not a folder"
    return DataDirError(f"data dir {path} is {kind}, not a directory")


def checked_data_dir(write: bool = True) -> Path:
    """The data directory, made if missing (unless only read), after checking what a command
    needs of it before it starts: a directory, this user's, and (`write`) one this user can
    write on a file system that is neither read-only nor full. Raises DataDirError."""
    path = data_dir(create=write)
    if write or path.exists():  # else nothing is stored yet: a reader finds it empty
        check_folder(path, write)
    return path


def check_folder(path: Path, write: bool) -> None:
    """checked_data_dir's checks of an existing `path`, which looking does not change."""
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise not_a_directory(path, info.st_mode)
    needed = 0o700 if write else 0o500
    if info.st_mode & needed != needed:
        raise DataDirError(
            f"data dir {path} has mode {stat.S_IMODE(info.st_mode):04o}: its owner cannot "
            f"{'write' if write else 'read'} it (chmod 700 {path})"
        )
    if info.st_uid != os.geteuid():
        raise DataDirError(
            f"data dir {path} belongs to uid {info.st_uid}, not to this user (uid "
            f"{os.geteuid()}): set {HOME_ENV} to a directory of yours"
        )
    if write:
        problem = unwritable(path)
        if problem is not None:
            raise DataDirError(f"data dir {path}: {os.strerror(problem)}")


def unwritable(path: Path) -> int | None:
    """Why nothing can be written in the folder `path`, as an errno (EROFS, EACCES, ENOSPC), or
    None: asked of the file system, so looking writes nothing."""
    fs = os.statvfs(path)
    if fs.f_flag & os.ST_RDONLY:
        return errno.EROFS
    if not os.access(path, os.W_OK | os.X_OK):
        return errno.EACCES
    free = fs.f_bfree if os.geteuid() == 0 else fs.f_bavail
    return errno.ENOSPC if free == 0 else None
