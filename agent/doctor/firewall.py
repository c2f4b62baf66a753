"""`agent doctor`'s firewall row: the macOS application firewall, which judges the image a process
runs (per application, never per port), and a fix that allows that very image.

With a framework Python (python.org's, Homebrew's) `bin/python3.x` is a launcher that execs
`Python.framework/Versions/3.x/Resources/Python.app/Contents/MacOS/Python` (CPython
Mac/Tools/pythonw.c: `get_python_path` finds the framework's dylib and appends
`Resources/Python.app/Contents/MacOS/Python`, then `posix_spawn` with `POSIX_SPAWN_SETEXEC`,
an execv): that process listens, so the allow entry is for the `Python.app` bundle, as
andygmassey/HR018-e-newspaper found on Homebrew Python (deploy/install.sh, discord-posts.md).
The answers socketfilterfw prints are quoted from tools that parse them (mac-desk-check.md).
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from agent.doctor.check import Check

FIREWALL = "/usr/libexec/ApplicationFirewall/socketfilterfw"
TOOL_TIMEOUT_S = 10.0
APP_IMAGE = Path("Resources", "Python.app", "Contents", "MacOS", "Python")
"""Where a framework keeps the real interpreter, below `Python.framework/Versions/3.x`."""
_STATE = re.compile(r"\(State = (\d)\)")


def framework_app(root: Path) -> Path | None:
    """`root/Resources/Python.app` when `root` is a framework version holding the real image."""
    return root / "Resources" / "Python.app" if (root / APP_IMAGE).is_file() else None


def firewall_target(image: str, executables: Sequence[str], prefixes: Sequence[str]) -> Path:
    """What the firewall must allow: the `.app` bundle around the image this process runs, or
    the framework's `Resources/Python.app` found from an executable (a venv's `bin/python` links
    to the framework's `bin/python3.x`, two levels below it) or from a framework prefix
    (`sys.base_prefix` is `Python.framework/Versions/3.x`), else the image itself."""
    real = Path(os.path.realpath(image))
    bundle = next((parent for parent in real.parents if parent.suffix == ".app"), None)
    if bundle is not None:
        return bundle
    roots = [Path(os.path.realpath(path)).parent.parent for path in executables if path]
    for root in (*roots, *(Path(prefix) for prefix in prefixes if prefix)):
        found = framework_app(root)
        if found is not None:
            return found
    return real


def this_target() -> Path:
    """firewall_target for this very process: psutil's image (proc_pidpath on macOS), the
    interpreter it was started as, and the framework prefix."""
    import psutil

    executables = [sys.executable, getattr(sys, "_base_executable", "")]
    return firewall_target(psutil.Process().exe(), executables, [sys.base_prefix])


def fix_commands(target: Path, tool: str = FIREWALL) -> str:
    """The allow commands, quoted so that a path with spaces runs when pasted."""
    quoted, fw = shlex.quote(str(target)), shlex.quote(tool)
    return f"sudo {fw} --add {quoted} && sudo {fw} --unblockapp {quoted}"


def global_state(text: str) -> int | None:
    """`--getglobalstate`: "Firewall is enabled. (State = 1)", "(State = 2)" for block-all on
    older macOS, "Firewall is disabled. (State = 0)"; None for anything else, e.g. "Firewall
    settings cannot be modified from command line on managed Mac computers." (Mondoo's mql,
    its macOS firewall tests)."""
    found = _STATE.search(text)
    if found:
        return int(found.group(1))
    lowered = text.lower()
    if "firewall is enabled" in lowered:
        return 1
    return 0 if "firewall is disabled" in lowered else None


def block_all(text: str) -> bool | None:
    """`--getblockall`: "Firewall has block all state set to enabled." or "... disabled."."""
    lowered = text.lower()
    if "block all state set to enabled" in lowered:
        return True
    return False if "block all state set to disabled" in lowered else None


def app_verdict(text: str) -> str | None:
    """`--getappblocked PATH`: "blocked", "allowed" or "unlisted". "not blocked" contains
    "blocked", so the negative answers are read first (as the tools that parse it do)."""
    lowered = text.lower()
    if "not part of the firewall" in lowered:
        return "unlisted"
    if "not blocked" in lowered or "permitted" in lowered:
        return "allowed"
    return "blocked" if "blocked" in lowered else None


def _ask(tool: str, *args: str) -> str:
    try:
        done = subprocess.run(
            [tool, *args], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{Path(tool).name} {' '.join(args)} failed: {exc}"
    return (done.stdout + done.stderr).strip()


def firewall_check(tool: str | None = None, target: Path | None = None) -> Check:
    """The firewall's state for the image that listens. `tool` and `target`: a stand-in
    socketfilterfw and what it is asked about, instead of this Mac's own."""
    if tool is None and sys.platform != "darwin":
        return Check(
            "firewall",
            False,
            f"the macOS application firewall: not a Mac ({platform.system()}); make sure "
            "this machine's own firewall lets the coordinator reach both ports",
        )
    tool = tool or FIREWALL
    target = target or this_target()
    said = _ask(tool, "--getglobalstate")
    state = global_state(said)
    if state is None:
        return Check("firewall", False, f"cannot read its state: {said or 'no answer'}")
    if state == 0:
        return Check("firewall", True, said)
    blocking_all = state == 2 or block_all(_ask(tool, "--getblockall")) is True
    fix = fix_commands(target, tool)
    if blocking_all:
        return Check(
            "firewall",
            False,
            "enabled, blocking all incoming connections (--getblockall): block-all ignores "
            f"every allow list, {target} included",
            f"sudo {shlex.quote(tool)} --setblockall off, then {fix}",
        )
    app = _ask(tool, "--getappblocked", str(target))
    verdict = app_verdict(app)
    if verdict in ("blocked", "unlisted"):
        return Check("firewall", False, f"enabled: {app}", fix)
    return Check(
        "firewall",
        True,
        f"enabled; {app or 'no answer for ' + str(target)} (it says so for unlisted programs "
        "too: `coordinator doctor` from another machine is the test)",
        fix,
    )
