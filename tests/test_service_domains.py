"""Issue 27's sessions, each ending with the agent loaded exactly once, in the right domain,
its plist 0644 (root:wheel for a LaunchDaemon): over ssh with nobody at the screen, a
reinstall, under sudo, from a session with neither $SSH_* nor a GUI, and an uninstall racing
the job's exit. launchctl is tests/fakes/service_manager.py, which fails as the real one was
seen to (its docstring cites each answer)."""

from __future__ import annotations

import os
import plistlib
import stat
from pathlib import Path

import pytest

from agent.service.launchctl import Session, bootstrap_domains
from tests.test_service import (
    USER_UID,
    agent,
    calls,
    fake_state,
    launchctl,
    over_ssh_nobody_at_the_screen,
)

LABEL = "io.mlx-fleet.agent"
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="sudo is simulated as root")


# `home` and `fake_managers` (launchctl and systemctl, faked, on PATH): tests/conftest.py.


def agent_plist(home: Path) -> Path:
    return home / "Library/LaunchAgents" / f"{LABEL}.plist"


def bootstraps(fake_managers: Path) -> list[str]:
    return [c[2] for c in calls(fake_managers) if c[:2] == ["launchctl", "bootstrap"]]


def assert_loaded_once(fake_managers: Path, domain: str, plist: Path, owner: int | None) -> dict:
    """Exactly one copy, in `domain`, from a 0644 plist (owned by `owner` when given)."""
    assert fake_state(fake_managers)["loaded"] == [f"{domain}/{LABEL}"]
    info = plist.lstat()
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o644
    if owner is not None:
        assert (info.st_uid, info.st_gid) == (owner, owner)
    assert not [p for p in plist.parent.iterdir() if p.name.startswith(f".{plist.name}.")]
    return plistlib.loads(plist.read_bytes())


@pytest.mark.slow
def test_over_ssh_with_no_console_user(
    agent_cli: str, home: Path, fake_managers: Path, tmp_path: Path
) -> None:
    """Homebrew's domain_target picks user/ (ssh without /dev/console); Background only."""
    headless = over_ssh_nobody_at_the_screen(tmp_path)
    result = agent(agent_cli, home, "install", "--launchd", path_dir=fake_managers, **headless)
    assert result.returncode == 0, result.stderr
    assert bootstraps(fake_managers) == [f"user/{USER_UID}"]
    plist = assert_loaded_once(fake_managers, f"user/{USER_UID}", agent_plist(home), None)
    assert plist["LimitLoadToSessionType"] == ["Background"]
    assert plist["KeepAlive"] == {"SuccessfulExit": False}


@pytest.mark.slow
def test_a_reinstall_replaces_a_plist_of_another_mode_and_owner(
    agent_cli: str, home: Path, fake_managers: Path
) -> None:
    first = agent(agent_cli, home, "install", "--launchd", path_dir=fake_managers)
    assert first.returncode == 0, first.stderr
    path = agent_plist(home)
    path.chmod(0o666)
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
    before = path.stat().st_ino
    again = agent(agent_cli, home, "install", "--launchd", path_dir=fake_managers)
    assert again.returncode == 0, again.stderr
    assert path.stat().st_ino != before  # renamed over, not edited in place
    owner = 0 if os.geteuid() == 0 else None  # written by whoever runs the suite
    plist = assert_loaded_once(fake_managers, f"gui/{USER_UID}", path, owner)
    assert "Aqua" in plist["LimitLoadToSessionType"]


@ROOT_ONLY
@pytest.mark.slow
def test_under_sudo_a_launch_daemon_running_as_the_caller(
    agent_cli: str, home: Path, fake_managers: Path, tmp_path: Path, fleet_home: Path
) -> None:
    """`sudo agent install`: the system domain, /Library/LaunchDaemons root:wheel 0644,
    UserName the caller; the data folders root makes are the caller's."""
    daemons = tmp_path / "LaunchDaemons"
    sudo = {
        "SUDO_USER": "nobody",
        "SUDO_UID": "65534",
        "MLX_FLEET_SERVICE_UID": "",
        "MLX_FLEET_LAUNCH_DAEMONS": str(daemons),
    }
    result = agent(agent_cli, home, "install", "--launchd", path_dir=fake_managers, **sudo)
    assert result.returncode == 0, result.stderr
    assert bootstraps(fake_managers) == ["system"]
    plist = assert_loaded_once(fake_managers, "system", daemons / f"{LABEL}.plist", 0)
    assert plist["UserName"] == "nobody"
    for made in (fleet_home, fleet_home / "logs"):
        assert (made.stat().st_uid, made.stat().st_gid) == (65534, 65534)
    assert not (home / "Library").exists()
    again = agent(agent_cli, home, "install", "--launchd", path_dir=fake_managers, **sudo)
    assert again.returncode == 0, again.stderr
    assert_loaded_once(fake_managers, "system", daemons / f"{LABEL}.plist", 0)

    refused = agent(
        agent_cli, home, "install", "--launchd", "--user", path_dir=fake_managers, **sudo
    )
    assert refused.returncode == 2
    line = " ".join(refused.stderr.split())
    assert line.startswith("error: --user as root") and "drop sudo" in line
    assert "--system" in line and not (home / "Library").exists()


def no_ssh_no_gui(tmp_path: Path) -> dict[str, str]:
    """cron, tmux or mosh: no $SSH_*, and /dev/console someone else's."""
    headless = over_ssh_nobody_at_the_screen(tmp_path)
    del headless["SSH_CONNECTION"]
    return headless


@pytest.mark.parametrize("probe", ["112", "125"])
@pytest.mark.slow
def test_no_ssh_and_no_gui_probes_gui_and_goes_to_user(
    agent_cli: str, home: Path, fake_managers: Path, tmp_path: Path, probe: str
) -> None:
    """`launchctl print gui/<uid>` fails (duh17/oppi#38): never a gui/ bootstrap."""
    env = {**no_ssh_no_gui(tmp_path), "FAKE_GUI_PROBE_CODE": probe}
    result = agent(agent_cli, home, "install", "--launchd", path_dir=fake_managers, **env)
    assert result.returncode == 0, result.stderr
    assert ["launchctl", "print", f"gui/{USER_UID}"] in calls(fake_managers)
    assert bootstraps(fake_managers) == [f"user/{USER_UID}"]
    plist = assert_loaded_once(fake_managers, f"user/{USER_UID}", agent_plist(home), None)
    assert plist["LimitLoadToSessionType"] == ["Background"]


@pytest.mark.parametrize(
    "unusable",
    [
        {"FAKE_GUI_UNUSABLE": "5"},  # psimaker/vaultsync#89
        {"FAKE_GUI_UNUSABLE": "112"},
        {"FAKE_GUI_UNUSABLE": "125"},  # duh17/oppi#38
        {"FAKE_GUI_ENABLE_CODE": "125"},
        {"FAKE_GUI_ENABLE_CODE": "5"},
    ],
)
@pytest.mark.slow
def test_a_gui_domain_this_session_cannot_use_falls_back_to_user(
    agent_cli: str, home: Path, fake_managers: Path, tmp_path: Path, unusable: dict[str, str]
) -> None:
    """The probe says gui/ exists, enable or bootstrap says otherwise: user/, rewritten for it."""
    result = agent(agent_cli, home, "install", "--launchd", path_dir=fake_managers, **unusable)
    assert result.returncode == 0, result.stderr
    assert f"wrote {agent_plist(home)} (for user/{USER_UID})" in result.stderr
    plist = assert_loaded_once(fake_managers, f"user/{USER_UID}", agent_plist(home), None)
    assert plist["LimitLoadToSessionType"] == ["Background"]


@pytest.mark.slow
def test_a_reinstall_at_the_screen_waits_out_a_lingering_gui_label(
    agent_cli: str, home: Path, fake_managers: Path
) -> None:
    """A gui/ 5 right after our own bootout is the label lingering, not a missing GUI."""
    linger = {"FAKE_LINGER_HIDDEN": "1", "FAKE_LINGER_CODE": "5", "FAKE_LINGER_S": "1"}
    for _ in range(2):
        result = agent(agent_cli, home, "install", "--launchd", path_dir=fake_managers, **linger)
        assert result.returncode == 0, result.stderr
    assert bootstraps(fake_managers).count(f"user/{USER_UID}") == 0
    assert_loaded_once(fake_managers, f"gui/{USER_UID}", agent_plist(home), None)


@pytest.mark.parametrize("code", ["113", "125"])
@pytest.mark.slow
def test_an_uninstall_racing_the_jobs_exit_is_done(
    agent_cli: str, home: Path, fake_managers: Path, code: str
) -> None:
    """bootout answering 113 or 125 (Homebrew stops waiting on 3 and 125): gone."""
    assert agent(agent_cli, home, "install", "--launchd", path_dir=fake_managers).returncode == 0
    removed = agent(
        agent_cli, home, "uninstall", "--launchd", path_dir=fake_managers, FAKE_BOOTOUT_RACE=code
    )
    assert removed.returncode == 0, removed.stderr
    assert fake_state(fake_managers)["loaded"] == [] and not agent_plist(home).exists()
    assert launchctl(fake_managers, "print", f"gui/{USER_UID}/{LABEL}").returncode == 113


@pytest.mark.parametrize("command", ["install", "uninstall"])
@pytest.mark.parametrize("odd", ["folder", "symlink"])
def test_a_plist_path_that_is_no_regular_file_is_left_alone(
    agent_cli: str, home: Path, fake_managers: Path, tmp_path: Path, command: str, odd: str
) -> None:
    path = agent_plist(home)
    path.parent.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere.plist"
    elsewhere.write_text("someone else's")
    if odd == "folder":
        path.mkdir()
    else:
        path.symlink_to(elsewhere)
    result = agent(agent_cli, home, command, "--launchd", path_dir=fake_managers)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a regular file" in lines[0], lines
    assert "nothing was changed" in lines[0]
    assert path.is_dir() if odd == "folder" else path.is_symlink()
    assert elsewhere.read_text() == "someone else's"
    assert bootstraps(fake_managers) == [] and fake_state_or_empty(fake_managers) == []


def fake_state_or_empty(fake_managers: Path) -> list[str]:
    state = fake_managers.parent / "service-state.json"
    return fake_state(fake_managers)["loaded"] if state.exists() else []


def test_the_domain_is_homebrews_with_gui_only_where_it_exists() -> None:
    at_desk = Session(uid=501, euid=501, console_uid=501, ssh=False, sudo=False)
    over_ssh = Session(uid=501, euid=501, console_uid=0, ssh=True, sudo=False)
    no_ssh_no_gui = Session(uid=501, euid=501, console_uid=0, ssh=False, sudo=False)
    assert bootstrap_domains(False, at_desk, gui_exists=True) == ["gui/501", "user/501"]
    assert bootstrap_domains(False, at_desk, gui_exists=False) == ["user/501"]
    assert bootstrap_domains(False, over_ssh, gui_exists=True) == ["user/501"]
    assert bootstrap_domains(False, no_ssh_no_gui, gui_exists=False) == ["user/501"]
    assert bootstrap_domains(True, at_desk, gui_exists=True) == ["system"]
