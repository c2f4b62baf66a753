"""The folders macOS's privacy controls (TCC) keep from a launchd job: a service whose
interpreter, package or data directory lies there exits "Operation not permitted" while the same
command run by hand in Terminal works (Terminal has the user's consent, the job does not):
skillsmith#1009 (a venv under ~/Documents), cc-reaper#21 (a checkout on an external volume).
`agent install` refuses such an installation with the fix, and `agent doctor` says so.

Pure: paths in, the first protected one (and where it lies) out. Apple's list of protected
locations: Desktop, Documents and Downloads folders, iCloud Drive (~/Library/Mobile Documents),
file-provider clouds (~/Library/CloudStorage: Dropbox, OneDrive, Google Drive), and removable
and network volumes (/Volumes/...; Apple Platform Security, "Controlling app access to files in
macOS").
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

PROTECTED_IN_HOME = {
    "Desktop": "~/Desktop",
    "Documents": "~/Documents",
    "Downloads": "~/Downloads",
    "Library/Mobile Documents": "iCloud Drive",
    "Library/CloudStorage": "a cloud drive (~/Library/CloudStorage)",
}
"""Protected folders under a home, as a message names them."""
SERVICE_FIX = (
    "move the virtual environment (and checkout) elsewhere, e.g. ~/mlx-fleet or /opt/mlx-fleet, "
    "reinstall mlx-fleet there, and run `agent install` from it"
)
DATA_FIX = "give --data-dir a folder outside it (the default is fine)"


def protected_place(path: Path, home: Path) -> str | None:
    """Where `path` lies that a launchd job may not read (`~/Documents`, `iCloud Drive`, `an
    external volume (/Volumes/X)`), or None."""
    for folder, said in PROTECTED_IN_HOME.items():
        if path.is_relative_to(home / folder):
            return said
    parts = path.parts
    if len(parts) > 2 and parts[:2] == ("/", "Volumes"):
        return f"an external or network volume (/Volumes/{parts[2]})"
    return None


def first_protected(paths: Iterable[tuple[str, Path]], home: Path) -> tuple[str, Path, str] | None:
    """(what, path, where) of the first of `paths` (what it is, where it is) that lies in a
    protected place; each is also checked as it resolves (a venv's python links elsewhere)."""
    for what, path in paths:
        for candidate in dict.fromkeys((path, path.resolve())):
            place = protected_place(candidate, home)
            if place is not None:
                return what, candidate, place
    return None


def protected_message(what: str, path: Path, place: str) -> str:
    """The one line `agent install` refuses with, and `agent doctor` says."""
    fix = DATA_FIX if what == "data directory" else SERVICE_FIX
    return (
        f"the service's {what} {path} is in {place}, which macOS's privacy controls (TCC) keep "
        "from launchd jobs: the service would exit 'Operation not permitted' although running "
        f"it by hand works; {fix}"
    )
