"""`agent doctor`'s rows for the macOS settings that stop a service without an error of ours
(docs/deploy.md, "macOS settings that stop the agent"): FileVault, which holds every service
back after a reboot until someone unlocks the disk at the pre-boot screen, and Background Task
Management's Login Items switch, which turns the service off.

Each is a pure parser of the tool's text and a thin layer that runs the tool: `fdesetup status`
(readable without root, fdesetup(8)) and `sfltool dumpbtm`, which needs root on many versions
and, run without it, may ask for an administrator's password in a dialog on the screen of
whoever is logged in: it is run only as root, or through `sudo -n` (never a prompt).
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from agent.doctor.check import Check
from agent.service.privacy import first_protected, protected_message

TOOL_TIMEOUT_S = 15.0
"""A bound on each tool: a doctor that waits forever on one says nothing of the rest."""
FILEVAULT = "FileVault"
SERVICE_FOLDERS = "service folders"
SLEEP = "sleep"
PROTECTED_SAID = "~/Documents, ~/Desktop, ~/Downloads, iCloud Drive, a cloud drive or /Volumes"
LOGIN_ITEMS = "login items"
_FILEVAULT = re.compile(r"FileVault is (On|Off)\.")


@dataclass(frozen=True)
class Ran:
    """What a tool said: its exit status (None: it could not be started) and its text."""

    status: int | None
    text: str


def run_tool(argv: list[str]) -> Ran:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        return Ran(None, f"{argv[0]} not found")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Ran(None, f"{argv[0]}: {exc}")
    return Ran(done.returncode, (done.stdout + done.stderr).strip())


def not_a_mac(name: str, what: str) -> Check:
    return Check(name, False, f"not applicable: not a Mac ({platform.system()}); {what}")


def filevault_on(text: str) -> bool | None:
    """`fdesetup status`: "FileVault is On." or "FileVault is Off." on its first line (more
    lines may follow: "Encryption in progress: ...", "Deferred enablement appears to be
    active ..."); None for anything else."""
    found = _FILEVAULT.search(text)
    return None if found is None else found.group(1) == "On"


def filevault_verdict(on: bool, at_screen: bool) -> Check:
    """On is a warning for a Mac nobody sits at: after a reboot the disk waits locked at the
    pre-boot screen, and no service (this agent included) starts until someone types a
    password there."""
    if not on:
        return Check(FILEVAULT, True, "Off: services start after a reboot with nobody there")
    locked = (
        "after a reboot nothing starts, this agent included, until someone unlocks the disk at "
        "the pre-boot screen"
    )
    if at_screen:
        return Check(FILEVAULT, True, f"On; someone is logged in at the screen ({locked})")
    return Check(
        FILEVAULT,
        False,
        f"On, and nobody is logged in at the screen: {locked}",
        "for a planned reboot: sudo fdesetup authrestart (unlocks the next boot only); after "
        "an unplanned one, macOS 26+ with Remote Login takes the password over ssh, older "
        "macOS needs someone at the screen (docs/deploy.md)",
    )


def filevault_check(at_screen: bool | None = None, tool: str = "fdesetup") -> Check:
    """FileVault's state (`fdesetup status`). `at_screen`: whether a user owns the console,
    given instead of asking this Mac (then the check runs off a Mac too, against a stand-in
    `tool` on PATH)."""
    if at_screen is None:
        if sys.platform != "darwin":
            return not_a_mac(FILEVAULT, "macOS's FileVault locks the disk until the pre-boot login")
        from agent.service.launchctl import current_session

        at_screen = current_session().console_uid not in (None, 0)
    ran = run_tool([tool, "status"])
    on = filevault_on(ran.text) if ran.status == 0 else None
    if on is None:
        said = ran.text.splitlines()[0] if ran.text else "no answer"
        return Check(FILEVAULT, False, f"cannot tell: `{tool} status` said {said!r}")
    return filevault_verdict(on, at_screen)


def pmset_settings(text: str) -> dict[str, str]:
    """`pmset -g`'s settings in use: {key: its first word}, from its ` key  value` lines after
    "Currently in use:" (`sleep 1 (sleep prevented by sharingd)` -> {"sleep": "1"})."""
    settings: dict[str, str] = {}
    in_use = False
    for line in text.splitlines():
        if line.strip().endswith(":"):
            in_use = line.strip() == "Currently in use:"
            continue
        words = line.split()
        if in_use and len(words) >= 2 and not words[1].startswith("("):
            settings[words[0]] = words[1]
    return settings


def sleep_verdict(settings: dict[str, str]) -> Check:
    """A Mac that sleeps when idle stops answering the coordinator between jobs (it looks
    dead); one that stays off after a power cut is gone until someone presses its button."""
    sleep, restart = settings.get("sleep"), settings.get("autorestart")
    if sleep is None or not sleep.isdigit():
        return Check(SLEEP, False, "cannot tell: `pmset -g` lists no system sleep timer")
    problems, fixes = [], []
    if int(sleep) > 0:
        problems.append(
            f"the Mac sleeps after {sleep} min idle: an idle agent stops answering and the "
            "coordinator sees it down"
        )
        fixes.append("sudo pmset -a sleep 0 (System Settings > Energy: prevent automatic sleeping)")
    if restart == "0":
        problems.append("after a power cut it stays off until someone presses its button")
        fixes.append("sudo pmset -a autorestart 1 (start up automatically after a power failure)")
    if not problems:
        said = "never sleeps when idle" + ("; restarts after a power cut" if restart else "")
        return Check(SLEEP, True, said)
    return Check(SLEEP, False, "; ".join(problems), "; ".join(fixes))


def sleep_check(tool: str | None = None) -> Check:
    """`pmset -g` (readable without root): the system sleep timer and autorestart. `tool`
    given instead of this Mac's pmset: then it runs off a Mac too."""
    if tool is None:
        if sys.platform != "darwin":
            return not_a_mac(SLEEP, "macOS's idle sleep and restart after a power cut")
        tool = "pmset"
    ran = run_tool([tool, "-g"])
    if ran.status != 0:
        said = ran.text.splitlines()[0] if ran.text else "no answer"
        return Check(SLEEP, False, f"cannot tell: `{tool} -g` said {said!r}")
    return sleep_verdict(pmset_settings(ran.text))


def service_folders_check(
    paths: list[tuple[str, Path]] | None = None, home: Path | None = None
) -> Check:
    """Whether the interpreter, the package and the data directory a service would use lie
    outside the folders macOS's privacy controls keep from launchd jobs (agent.service.privacy).
    `paths` and `home` given instead of this Mac's: then it runs off a Mac too."""
    if paths is None:
        if sys.platform != "darwin":
            return not_a_mac(SERVICE_FOLDERS, "macOS keeps ~/Documents and the like from services")
        import agent
        from shared.io.paths import data_dir

        paths = [
            ("interpreter", Path(sys.executable)),
            ("package", Path(agent.__file__).parent),
            ("data directory", data_dir(create=False)),
        ]
    found = first_protected(paths, home or Path.home())
    if found is None:
        return Check(SERVICE_FOLDERS, True, f"none in {PROTECTED_SAID}: a launchd job reads them")
    what, path, place = found
    message = protected_message(what, path, place)
    said, _, fix = message.partition("; ")
    return Check(SERVICE_FOLDERS, False, said, fix)


@dataclass(frozen=True)
class BackgroundItem:
    """One record of `sfltool dumpbtm`."""

    name: str
    kind: str
    disposition: frozenset[str]
    identifier: str
    url: str

    @property
    def switched_off(self) -> bool:
        """Login Items' switch off (`disabled`), or not allowed to run in the background."""
        return bool({"disabled", "disallowed"} & self.disposition)


def background_items(text: str) -> list[BackgroundItem]:
    """Every record of `sfltool dumpbtm`: indented `Key: value` lines, a record per `#N:`
    header, e.g. `Type: legacy agent (0x10008)`, `Disposition: [enabled, allowed, visible,
    notified] (11)`, `Identifier: uk.co.dssw.pmnotify`, `URL: file:///Library/LaunchAgents/
    uk.co.dssw.pmnotify.plist` (DSSW's Power Manager guide; PostgresApp/PostgresApp#701)."""
    records: list[dict[str, str]] = []
    for line in text.splitlines():
        stripped = line.strip()
        if re.fullmatch(r"#\d+:", stripped):
            records.append({})
            continue
        key, colon, value = stripped.partition(": ")
        if records and colon and key not in records[-1]:
            records[-1][key] = value.strip()
    items = []
    for fields in records:
        words = re.match(r"\[([^\]]*)\]", fields.get("Disposition", ""))
        disposition = frozenset(
            word.strip() for word in (words.group(1).split(",") if words else []) if word.strip()
        )
        items.append(
            BackgroundItem(
                fields.get("Name", ""),
                fields.get("Type", ""),
                disposition,
                fields.get("Identifier", ""),
                fields.get("URL", ""),
            )
        )
    return items


def agent_items(items: list[BackgroundItem], label: str) -> list[BackgroundItem]:
    """The records of this agent's launchd job: its label, or its plist's URL."""
    return [
        item for item in items if item.identifier == label or item.url.endswith(f"/{label}.plist")
    ]


def login_items_verdict(text: str, label: str) -> Check:
    mine = agent_items(background_items(text), label)
    if not mine:
        return Check(
            LOGIN_ITEMS,
            True,
            f"no Background Task Management record of {label} (none before macOS 13 or an install)",
        )
    off = [item for item in mine if item.switched_off]
    shown = "; ".join(
        f"{item.kind or 'item'} [{', '.join(sorted(item.disposition))}]" for item in mine
    )
    if not off:
        return Check(LOGIN_ITEMS, True, f"{label}: {shown}")
    return Check(
        LOGIN_ITEMS,
        False,
        f"{label} is switched off in Login Items ({shown}): launchd will not run it, and "
        "`launchctl bootstrap` fails with 5",
        "System Settings > General > Login Items & Extensions: switch on the item for this "
        "agent's Python under Allow in the Background, then agent install again",
    )


def login_items_check(as_root: bool | None = None, tool: str = "sfltool") -> Check:
    """Whether Login Items switched this agent off (`sfltool dumpbtm`), where readable: as root
    directly, else through `sudo -n`, which never prompts. `as_root`: given instead of asking
    this process (then the check runs off a Mac too, against stand-ins on PATH)."""
    from agent.service.launchctl import LABEL

    if as_root is None:
        if sys.platform != "darwin":
            return not_a_mac(LOGIN_ITEMS, "macOS 13+'s Background Task Management")
        as_root = os.geteuid() == 0
    ran = run_tool([tool, "dumpbtm"] if as_root else ["sudo", "-n", tool, "dumpbtm"])
    if ran.status == 0 and ("#1:" in ran.text or "Records for UID" in ran.text):
        return login_items_verdict(ran.text, LABEL)
    if not as_root and ran.status not in (None, 0) and "password" in ran.text.lower():
        return Check(
            LOGIN_ITEMS,
            False,
            "not readable without sudo (`sfltool dumpbtm` needs root; asked through `sudo -n`, "
            "which never prompts)",
            f"sudo sfltool dumpbtm | grep -B4 -A6 {LABEL}: `disabled` in its Disposition means "
            "switched off in System Settings > General > Login Items & Extensions",
        )
    said = ran.text.splitlines()[0] if ran.text else "no answer"
    return Check(LOGIN_ITEMS, False, f"cannot read `{tool} dumpbtm`: {said!r}")
