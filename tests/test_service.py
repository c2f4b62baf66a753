"""`agent install / uninstall / service-status` for launchd and systemd.

Generated files are checked on every OS; the launchctl/systemctl process handling runs against
a small fake service manager on PATH; real systemd is used where it runs.
"""

from __future__ import annotations

import configparser
import json
import os
import plistlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agent.service.files import parse_launchctl_print, parse_systemctl_show
from agent.service.launchctl import Session
from agent.service.run_as import editable_by_others
from agent.service.scope import auto_scope
from tests.conftest import SERVICE_MANAGER_FAKE, piped, subprocess_env

FAKE = SERVICE_MANAGER_FAKE
FIXTURES = Path(__file__).parent / "fixtures"
# `home` and `fake_managers` (the fake on PATH) are tests/conftest.py's, shared with
# tests/test_service_domains.py.


SESSION_VARIABLES = ("SSH_TTY", "SSH_CONNECTION", "SUDO_USER", "SUDO_UID")
USER_UID = os.getuid() or 501
"""The user these tests act as: this one, or (a suite run as root) 501 through
MLX_FLEET_SERVICE_UID, since as root `agent install` means a system service."""
AS_USER = {"MLX_FLEET_SERVICE_UID": str(USER_UID)} if os.getuid() == 0 else {}
LAUNCHD_LINGER = {"FAKE_LINGER_S": "3"}
"""The fake launchctl's label lingers after bootout as launchd's does (~3 s): for the tests
about lingering; the others run with the fake's default, no linger."""


def agent(
    agent_cli: str, home: Path, *args: str, path_dir: Path | None = None, **env: str
) -> subprocess.CompletedProcess:
    """`agent ARGS` as a user logged in at the screen, unless `env` says otherwise (its
    /dev/console: a file it owns; no ssh, no sudo). An empty value drops the variable."""
    console = home.parent / "console"
    console.touch()
    if os.geteuid() == 0:
        os.chown(console, USER_UID, USER_UID)
    extra = {"HOME": str(home), "MLX_FLEET_CONSOLE_DEVICE": str(console), **AS_USER, **env}
    if path_dir is not None:
        extra["PATH"] = f"{path_dir}{os.pathsep}{os.environ['PATH']}"
        extra["FAKE_SERVICE_STATE"] = str(path_dir.parent / "service-state.json")
    environment = subprocess_env(**extra)
    for name in SESSION_VARIABLES:
        if name not in env:
            environment.pop(name, None)
    for name in [name for name, value in environment.items() if value == ""]:
        del environment[name]
    return subprocess.run(
        [agent_cli, *args], capture_output=True, text=True, timeout=120, env=environment
    )


def over_ssh_nobody_at_the_screen(tmp_path: Path) -> dict[str, str]:
    """The session `coordinator deploy` has on a headless Mac: ssh, and /dev/console owned by
    someone else (root, at the login window)."""
    console = tmp_path / "login-window-console"
    console.touch()
    if os.geteuid() == 0:
        os.chown(console, 65534, 65534)
    else:
        console = Path("/")  # owned by root, not by us
    return {
        "SSH_CONNECTION": "10.0.0.1 50000 10.0.0.2 22",
        "MLX_FLEET_CONSOLE_DEVICE": str(console),
        "FAKE_NO_GUI": "1",
    }


def launchctl(fake_managers: Path, *args: str) -> subprocess.CompletedProcess:
    """The fake launchctl itself, as another program (or the user) would call it."""
    return subprocess.run(
        [str(fake_managers / "launchctl"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(FAKE_SERVICE_STATE=str(fake_managers.parent / "service-state.json")),
    )


def fake_state(fake_managers: Path) -> dict:
    return json.loads((fake_managers.parent / "service-state.json").read_text())


def calls(path_dir: Path) -> list[list[str]]:
    log = path_dir.parent / "service-state.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def launchd_dry_run(agent_cli: str, home: Path) -> subprocess.CompletedProcess:
    result = agent(
        agent_cli,
        home,
        "install",
        "--launchd",
        "--user",
        "--dry-run",
        "--bind",
        "0.0.0.0:5555",
        "--thermal-source",
        "macmon",
    )
    assert result.returncode == 0, result.stderr
    return result


def test_launchd_dry_run_prints_a_plist(agent_cli: str, home: Path, fleet_home: Path) -> None:
    result = launchd_dry_run(agent_cli, home)
    plist = plistlib.loads(result.stdout.encode())
    assert plist["Label"] == "io.mlx-fleet.agent"
    program = plist["ProgramArguments"]
    assert Path(program[0]).is_absolute() and Path(program[0]).exists()
    assert program[1:] == [
        "-m",
        "agent",
        "serve",
        "--bind",
        "0.0.0.0:5555",
        "--thermal-source",
        "macmon",
        "--log-file",
        str(fleet_home / "logs" / "agent.log"),
    ]
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["ThrottleInterval"] > 0 and plist["ProcessType"]
    assert plist["StandardOutPath"].startswith(str(fleet_home))
    assert plist["StandardErrorPath"].startswith(str(fleet_home))
    assert plist["EnvironmentVariables"]["MLX_FLEET_HOME"] == str(fleet_home)


def test_launchd_dry_run_only_says_what_it_would_do(agent_cli: str, home: Path) -> None:
    result = launchd_dry_run(agent_cli, home)
    assert "launchctl bootstrap gui/" in result.stderr
    assert f"{home}/Library/LaunchAgents/io.mlx-fleet.agent.plist" in result.stderr
    assert not (home / "Library").exists()


@pytest.mark.slow
def test_log_file_passes_through_to_serve(agent_cli: str, home: Path, tmp_path: Path) -> None:
    """launchd never rotates its output files, so serve's rotated --log-file is its default;
    systemd's journal rotates, so a unit logs there unless asked."""
    wanted = tmp_path / "var" / "agent.log"
    plist = agent(agent_cli, home, "install", "--launchd", "--dry-run", "--log-file", str(wanted))
    assert plistlib.loads(plist.stdout.encode())["ProgramArguments"][-2:] == [
        "--log-file",
        str(wanted),
    ]
    unit = agent(agent_cli, home, "install", "--systemd", "--dry-run", "--log-file", str(wanted))
    assert read_unit(unit.stdout)["Service"]["ExecStart"].endswith(f" --log-file {wanted}")
    journal = agent(agent_cli, home, "install", "--systemd", "--dry-run").stdout
    assert "--log-file" not in read_unit(journal)["Service"]["ExecStart"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--bind", "nonsense", "--dry-run"], "bad --bind 'nonsense': expected HOST:PORT"),
        (["--bind", "0.0.0.0:99999"], "bad --bind"),
        (
            ["--thermal-source", "bogus", "--dry-run"],
            "unknown thermal source 'bogus'; known: auto, none, smc, iohid, macmon, "
            "powermetrics, linux, sim, sim:plant[:PRESET][,k=v...], replay:PATH, capture:FILE",
        ),
        (["--thermal-source", "sim:tau=1"], "sim: bad parameter 'tau=1'"),
    ],
)
def test_install_refuses_what_serve_would_refuse(
    agent_cli: str, home: Path, fake_managers: Path, options: list[str], message: str
) -> None:
    result = agent(agent_cli, home, "install", "--systemd", *options, path_dir=fake_managers)
    assert result.returncode == 2, result.stderr
    assert message in " ".join(result.stderr.split())
    assert not (home / ".config").exists() and calls(fake_managers) == []


@pytest.mark.slow
def test_install_refuses_a_source_that_cannot_open_here(
    agent_cli: str, home: Path, fake_managers: Path
) -> None:
    """Checked with the service's own interpreter and PATH; a dry run only checks the name."""
    assert shutil.which("macmon") is None
    result = agent(
        agent_cli,
        home,
        "install",
        "--systemd",
        "--thermal-source",
        "macmon",
        path_dir=fake_managers,
    )
    assert result.returncode == 2, result.stderr
    assert (
        "thermal source 'macmon' cannot open on this machine: macmon not found on PATH"
        in " ".join(result.stderr.split())
    )
    assert not (home / ".config").exists() and calls(fake_managers) == []
    installed = agent(
        agent_cli, home, "install", "--systemd", "--thermal-source", "sim", path_dir=fake_managers
    )
    assert installed.returncode == 0, installed.stderr


def read_unit(text: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string(text)
    return unit


def test_systemd_dry_run_prints_a_valid_unit(agent_cli: str, home: Path) -> None:
    result = agent(agent_cli, home, "install", "--systemd", "--user", "--dry-run")
    assert result.returncode == 0, result.stderr
    unit = read_unit(result.stdout)
    exec_start = shlex.split(unit["Service"]["ExecStart"])
    assert Path(exec_start[0]).is_absolute() and Path(exec_start[0]).exists()
    assert exec_start[1:4] == ["-m", "agent", "serve"]
    assert unit["Service"]["Restart"] == "on-failure"
    assert unit["Install"]["WantedBy"] == "default.target"
    assert "systemctl --user enable --now mlx-fleet-agent.service" in result.stderr
    assert not (home / ".config").exists()
    verify = shutil.which("systemd-analyze")
    if verify:  # as docs/deploy.md shows it: the file must be named like the unit
        unit_file = home / "mlx-fleet-agent.service"
        unit_file.write_text(result.stdout)
        check = subprocess.run(
            [verify, "verify", str(unit_file)], capture_output=True, text=True, timeout=60
        )
        assert check.returncode == 0, check.stderr


def test_system_scope_points_at_system_folders(agent_cli: str, home: Path) -> None:
    launchd = agent(agent_cli, home, "install", "--launchd", "--system", "--dry-run")
    assert "/Library/LaunchDaemons/io.mlx-fleet.agent.plist" in launchd.stderr
    assert "launchctl bootstrap system " in launchd.stderr
    systemd = agent(agent_cli, home, "install", "--systemd", "--system", "--dry-run")
    assert "/etc/systemd/system/mlx-fleet-agent.service" in systemd.stderr
    assert read_unit(systemd.stdout)["Install"]["WantedBy"] == "multi-user.target"


def install_launchd(agent_cli: str, home: Path, fake_managers: Path) -> Path:
    """`agent install --launchd` through the fake launchctl; returns the plist it wrote."""
    plist = home / "Library/LaunchAgents/io.mlx-fleet.agent.plist"
    result = agent(agent_cli, home, "install", "--launchd", path_dir=fake_managers)
    assert result.returncode == 0, result.stderr
    assert plistlib.loads(plist.read_bytes())["Label"] == "io.mlx-fleet.agent"
    return plist


def launchd_status(agent_cli: str, home: Path, fake_managers: Path) -> dict:
    status = agent(
        agent_cli, home, "service-status", "--launchd", "--format", "json", path_dir=fake_managers
    )
    return json.loads(status.stdout)


@pytest.mark.slow
def test_launchd_install_replaces_an_earlier_install(
    agent_cli: str, home: Path, fake_managers: Path
) -> None:
    uid = USER_UID
    install_launchd(agent_cli, home, fake_managers)
    plist = install_launchd(agent_cli, home, fake_managers)
    bootstraps = [c for c in calls(fake_managers) if c[:2] == ["launchctl", "bootstrap"]]
    assert bootstraps == [["launchctl", "bootstrap", f"gui/{uid}", str(plist)]] * 2
    state = json.loads((fake_managers.parent / "service-state.json").read_text())
    assert state["loaded"] == [f"gui/{uid}/io.mlx-fleet.agent"]


@pytest.mark.slow
def test_launchd_status_reports_the_installed_agent(
    agent_cli: str, home: Path, fake_managers: Path, fleet_home: Path
) -> None:
    install_launchd(agent_cli, home, fake_managers)
    report = launchd_status(agent_cli, home, fake_managers)
    assert report["installed"] and report["running"] and report["pid"] == 4242
    assert report["last_exit"] == "0"
    assert report["logs"][0].startswith(str(fleet_home))


@pytest.mark.slow
def test_launchd_uninstall_removes_the_service_but_keeps_the_data(
    agent_cli: str, home: Path, fake_managers: Path, fleet_home: Path
) -> None:
    plist = install_launchd(agent_cli, home, fake_managers)
    removed = agent(agent_cli, home, "uninstall", "--launchd", path_dir=fake_managers)
    assert removed.returncode == 0, removed.stderr
    assert not plist.exists() and fleet_home.exists()
    after = launchd_status(agent_cli, home, fake_managers)
    assert not after["installed"] and not after["running"]


@pytest.mark.slow
def test_launchd_falls_back_to_the_user_domain_without_a_gui(
    agent_cli: str, home: Path, fake_managers: Path
) -> None:
    result = agent(agent_cli, home, "install", "--launchd", path_dir=fake_managers, FAKE_NO_GUI="1")
    assert result.returncode == 0, result.stderr
    assert f"launchctl bootstrap user/{USER_UID}" in result.stderr


@pytest.mark.slow
def test_systemd_install_status_uninstall_purge(
    agent_cli: str, home: Path, fake_managers: Path, fleet_home: Path
) -> None:
    unit = home / ".config/systemd/user/mlx-fleet-agent.service"
    result = agent(agent_cli, home, "install", "--systemd", path_dir=fake_managers)
    assert result.returncode == 0, result.stderr
    assert "ExecStart=" in unit.read_text()
    assert ["systemctl", "--user", "enable", "--now", "mlx-fleet-agent.service"] in calls(
        fake_managers
    )
    report = json.loads(
        agent(
            agent_cli,
            home,
            "service-status",
            "--systemd",
            "--format",
            "json",
            path_dir=fake_managers,
        ).stdout
    )
    assert report["running"] and report["pid"] == 4343
    assert report["logs"] == ["journalctl --user -u mlx-fleet-agent.service"]
    removed = agent(agent_cli, home, "uninstall", "--systemd", "--purge", path_dir=fake_managers)
    assert removed.returncode == 0, removed.stderr
    assert not unit.exists() and not fleet_home.exists()


@pytest.mark.slow
def test_purge_removes_the_installed_services_data_not_this_shells(
    agent_cli: str, home: Path, fake_managers: Path, tmp_path: Path
) -> None:
    service_home, shell_home = tmp_path / "service-home", tmp_path / "shell-home"
    shell_home.mkdir()
    for flavour in ("--launchd", "--systemd"):
        installed = agent(
            agent_cli,
            home,
            "install",
            flavour,
            path_dir=fake_managers,
            MLX_FLEET_HOME=str(service_home),
        )
        assert installed.returncode == 0, installed.stderr
        assert service_home.is_dir()
        removed = agent(
            agent_cli,
            home,
            "uninstall",
            flavour,
            "--purge",
            path_dir=fake_managers,
            MLX_FLEET_HOME=str(shell_home),
        )
        assert removed.returncode == 0, removed.stderr
        assert f"removed data directory {service_home}" in removed.stderr
        assert not service_home.exists() and shell_home.is_dir()


@pytest.mark.slow
def test_purge_without_an_installed_service_refuses_to_guess(
    agent_cli: str, home: Path, fake_managers: Path, fleet_home: Path
) -> None:
    fleet_home.mkdir()
    result = agent(agent_cli, home, "uninstall", "--systemd", "--purge", path_dir=fake_managers)
    assert result.returncode == 2, result.stderr
    assert "is not there: nothing was changed" in " ".join(result.stderr.split())
    assert fleet_home.is_dir() and calls(fake_managers) == []

    plist = home / "Library/LaunchAgents/io.mlx-fleet.agent.plist"
    plist.parent.mkdir(parents=True)
    plist.write_text("not a plist")  # unreadable: purge refuses, a plain uninstall removes it
    refused = agent(agent_cli, home, "uninstall", "--launchd", "--purge", path_dir=fake_managers)
    assert refused.returncode == 2, refused.stderr
    assert "names none: nothing was changed" in " ".join(refused.stderr.split())
    removed = agent(agent_cli, home, "uninstall", "--launchd", path_dir=fake_managers)
    assert removed.returncode == 0, removed.stderr
    assert not plist.exists() and fleet_home.is_dir()


@pytest.mark.parametrize(
    ("flavour", "failing", "definition"),
    [
        ("--launchd", "bootstrap", "Library/LaunchAgents/io.mlx-fleet.agent.plist"),
        ("--systemd", "enable", ".config/systemd/user/mlx-fleet-agent.service"),
    ],
)
@pytest.mark.slow
def test_a_refused_install_rolls_the_definition_back(
    agent_cli: str, home: Path, fake_managers: Path, flavour: str, failing: str, definition: str
) -> None:
    path = home / definition
    first = agent(agent_cli, home, "install", flavour, path_dir=fake_managers, FAKE_FAIL=failing)
    assert first.returncode == 1, first.stderr
    said = " ".join(first.stderr.split())
    assert ("Operation not permitted" if flavour == "--launchd" else "No medium found") in said
    assert f"(removed {path})" in said and not path.exists()
    report = json.loads(
        agent(
            agent_cli, home, "service-status", flavour, "--format", "json", path_dir=fake_managers
        ).stdout
    )
    assert report["installed"] is False and report["running"] is False

    assert agent(agent_cli, home, "install", flavour, path_dir=fake_managers).returncode == 0
    previous = path.read_bytes()
    again = agent(
        agent_cli,
        home,
        "install",
        flavour,
        "--bind",
        "127.0.0.1:6000",
        path_dir=fake_managers,
        FAKE_FAIL=failing,
    )
    assert again.returncode == 1, again.stderr
    assert f"(restored the previous {path})" in " ".join(again.stderr.split())
    assert path.read_bytes() == previous


@pytest.mark.parametrize(("flavour", "stop"), [("--launchd", "bootout"), ("--systemd", "disable")])
@pytest.mark.slow
def test_uninstall_reports_a_service_it_could_not_stop(
    agent_cli: str, home: Path, fake_managers: Path, flavour: str, stop: str
) -> None:
    assert agent(agent_cli, home, "install", flavour, path_dir=fake_managers).returncode == 0
    result = agent(agent_cli, home, "uninstall", flavour, path_dir=fake_managers, FAKE_FAIL=stop)
    assert result.returncode == 1, result.stderr
    said = " ".join(result.stderr.split())
    assert f" {stop} " in said and "failed" in said
    assert said.endswith("(nothing was removed: the service may still run)")
    report = json.loads(
        agent(
            agent_cli, home, "service-status", flavour, "--format", "json", path_dir=fake_managers
        ).stdout
    )
    assert report["installed"] and report["running"] is True  # left as it was, visibly
    assert agent(agent_cli, home, "uninstall", flavour, path_dir=fake_managers).returncode == 0


@pytest.mark.parametrize(("flavour", "query"), [("--launchd", "print"), ("--systemd", "show")])
@pytest.mark.slow
def test_status_says_unknown_when_the_manager_cannot_be_asked(
    agent_cli: str, home: Path, fake_managers: Path, flavour: str, query: str
) -> None:
    def report(**env: str) -> dict:
        result = agent(
            agent_cli,
            home,
            "service-status",
            flavour,
            "--format",
            "json",
            path_dir=fake_managers,
            **env,
        )
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    not_loaded = report()
    assert not_loaded["loaded"] is False and not_loaded["running"] is False
    assert "reason" not in not_loaded
    unknown = report(FAKE_FAIL=query)
    assert unknown["loaded"] == unknown["running"] == "unknown" and unknown["pid"] is None
    assert f" {query} " in unknown["reason"] and "failed" in unknown["reason"]
    table = agent(
        agent_cli, home, "service-status", flavour, path_dir=fake_managers, FAKE_FAIL=query
    )
    assert "unknown" in table.stdout


WARM_THEN_DROP_ROOT = """
import os, sys
from agent.cli import main
def run(*args):
    sys.argv = ['agent', *args]
    try:
        main()
    except SystemExit as exit:
        return exit.code
run('install', '--system', '--systemd', '--dry-run')  # imports everything while still root
os.seteuid(65534)
sys.exit(run('install', '--system', '--systemd'))
"""


def test_system_scope_needs_root(home: Path) -> None:
    """A non-root --system exits 2 saying why (the effective uid dropped to `nobody`)."""
    if os.geteuid() != 0:
        result = subprocess.run(
            [sys.executable, "-m", "agent", "install", "--system"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    else:
        result = subprocess.run(
            [sys.executable, "-c", WARM_THEN_DROP_ROOT],
            capture_output=True,
            text=True,
            timeout=60,
            env=subprocess_env(HOME=str(home)),
        )
    assert result.returncode == 2, result.stderr
    assert "needs root" in result.stderr.splitlines()[-1]


@pytest.mark.skipif(
    not Path("/run/systemd/system").is_dir(),
    reason="systemd is not running on this machine (no /run/systemd/system)",
)
def test_real_systemd_user_install_and_uninstall(agent_cli: str) -> None:
    installed = subprocess.run(
        [agent_cli, "install", "--systemd", "--user"], capture_output=True, text=True, timeout=120
    )
    try:
        assert installed.returncode == 0, installed.stderr
        status = json.loads(
            subprocess.run(
                [agent_cli, "service-status", "--systemd", "--format", "json"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
        )
        assert status["installed"]
    finally:
        removed = subprocess.run(
            [agent_cli, "uninstall", "--systemd", "--user"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert removed.returncode == 0, removed.stderr


def test_parsers_read_the_managers_output() -> None:
    text = (
        FAKE.read_text()
        .split('LAUNCHCTL_PRINT = """')[1]
        .split('"""')[0]
        .format(target="gui/501/io.mlx-fleet.agent", path="/p.plist")
        .replace("{{", "{")
        .replace("}}", "}")
    )
    fields = parse_launchctl_print(text.replace("\\t", "\t"))
    assert fields == {
        "path": "/p.plist",
        "state": "running",
        "program": "/usr/bin/python3",
        "pid": "4242",
        "last_exit": "0",
    }
    assert parse_systemctl_show("ActiveState=active\nMainPID=12\n") == {
        "ActiveState": "active",
        "MainPID": "12",
    }


def test_deploy_templates_are_what_install_writes() -> None:
    """deploy/'s reviewed templates never drift from the generator."""
    from agent.service.control import template_files

    deploy = Path(__file__).parent.parent / "deploy"
    for name, text in template_files().items():
        assert (deploy / name).read_text() == text, (
            f"deploy/{name} is stale: run python -m agent.service.control deploy"
        )
        if name.endswith(".plist"):
            assert plistlib.loads(text.encode())["Label"] == "io.mlx-fleet.agent"


@pytest.mark.slow
def test_serve_behaves_as_a_service(agent_cli: str, tmp_path: Path) -> None:
    """Foreground, timestamped log file, a second instance refused (or, of the same data
    directory, exiting 0 with one line), exit 0 on SIGTERM."""
    log_file = tmp_path / "logs" / "agent.log"
    first = piped(
        [
            agent_cli,
            "serve",
            "--bind",
            "127.0.0.1:0",
            "--thermal-source",
            "none",
            "--log-file",
            str(log_file),
        ],
    )
    try:
        assert first.stdout is not None
        ready = first.stdout.readline()
        assert ready.startswith("agent serve: listening on tcp://127.0.0.1:"), ready
        port = ready.split("tcp://127.0.0.1:")[1].split()[0]
        second = [agent_cli, "serve", "--bind", f"127.0.0.1:{port}", "--thermal-source", "none"]
        elsewhere = subprocess.run(
            second,
            capture_output=True,
            text=True,
            timeout=60,
            env=subprocess_env(MLX_FLEET_HOME=str(tmp_path / "another-data-dir")),
        )
        assert elsewhere.returncode == 2
        assert f"cannot bind tcp://127.0.0.1:{port}: Address already in use" in elsewhere.stderr
        # A second copy of this data directory's agent (launchd loaded it twice) gives way:
        # exit 0, which KeepAlive {SuccessfulExit: false} does not restart.
        again = subprocess.run(
            second, capture_output=True, text=True, timeout=60, env=subprocess_env()
        )
        assert again.returncode == 0, again.stderr
        said = again.stderr.strip().splitlines()
        assert (
            len(said) == 1
            and f"is held by this data directory's agent (pid {first.pid})" in (said[0])
        )
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=15) == 0
    finally:
        if first.poll() is None:
            first.kill()
    lines = log_file.read_text().splitlines()
    stamp = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} agent\.serve INFO: "
    assert lines and re.match(stamp, lines[-1]), lines


# --- launchd as Homebrew drives it, against a launchctl that fails as the real one does ------


@pytest.mark.slow
def test_install_over_ssh_with_nobody_at_the_screen_succeeds(
    agent_cli: str, home: Path, fake_managers: Path, tmp_path: Path
) -> None:
    """Homebrew's domain_target: ssh without /dev/console goes straight to user/<uid>, and the
    plist's LimitLoadToSessionType lets it load there (no gui/ attempt that would exit 125)."""
    uid = USER_UID
    headless = over_ssh_nobody_at_the_screen(tmp_path)
    result = agent(agent_cli, home, "install", "--launchd", path_dir=fake_managers, **headless)
    assert result.returncode == 0, result.stderr
    bootstraps = [c for c in calls(fake_managers) if c[:2] == ["launchctl", "bootstrap"]]
    assert [c[2] for c in bootstraps] == [f"user/{uid}"]
    assert fake_state(fake_managers)["loaded"] == [f"user/{uid}/io.mlx-fleet.agent"]
    plist = plistlib.loads((home / "Library/LaunchAgents/io.mlx-fleet.agent.plist").read_bytes())
    assert plist["LimitLoadToSessionType"] == ["Background"]  # no second copy in gui/


def test_the_fake_refuses_a_plist_without_session_types_in_the_user_domain(
    fake_managers: Path, tmp_path: Path
) -> None:
    """Why the key is written: without it a job is Aqua-only (duh17/oppi#31)."""
    old = tmp_path / "old.plist"
    old.write_bytes(plistlib.dumps({"Label": "io.mlx-fleet.agent", "ProgramArguments": ["x"]}))
    refused = launchctl(fake_managers, "bootstrap", f"user/{USER_UID}", str(old))
    assert refused.returncode == 5
    assert "Service cannot load in requested session" in refused.stderr


@pytest.mark.slow
def test_enable_comes_before_bootstrap_so_a_disabled_label_loads(
    agent_cli: str, home: Path, fake_managers: Path
) -> None:
    uid = USER_UID
    assert launchctl(fake_managers, "disable", f"gui/{uid}/io.mlx-fleet.agent").returncode == 0
    install_launchd(agent_cli, home, fake_managers)
    verbs = [c[1] for c in calls(fake_managers) if c[0] == "launchctl" and c[1] != "print"]
    assert verbs[verbs.index("enable") + 1] == "bootstrap"
    assert fake_state(fake_managers)["loaded"] == [f"gui/{uid}/io.mlx-fleet.agent"]


@pytest.mark.parametrize(
    "linger",
    [
        {},  # print lists the label until it is freed: the bootout is waited for
        {"FAKE_LINGER_HIDDEN": "1", "FAKE_LINGER_CODE": "37"},  # bootstrap retried on 37
        {"FAKE_LINGER_HIDDEN": "1", "FAKE_LINGER_CODE": "5"},  # ... and on 5
    ],
)
@pytest.mark.slow
def test_installing_twice_in_a_row_ends_loaded(
    agent_cli: str, home: Path, fake_managers: Path, linger: dict[str, str]
) -> None:
    """The upgrade path: the label lingers ~3 s after bootout; bootstrap must not lose it."""
    uid = USER_UID
    linger = {**LAUNCHD_LINGER, **linger}
    for _ in range(2):
        result = agent(agent_cli, home, "install", "--launchd", path_dir=fake_managers, **linger)
        assert result.returncode == 0, result.stderr
    assert fake_state(fake_managers)["loaded"] == [f"gui/{uid}/io.mlx-fleet.agent"]
    report = launchd_status(agent_cli, home, fake_managers)
    assert report["running"] and report["domains"] == [f"gui/{uid}"]


@pytest.mark.slow
def test_uninstall_removes_every_loaded_copy_and_waits_for_them(
    agent_cli: str, home: Path, fake_managers: Path, tmp_path: Path
) -> None:
    """One copy loaded at the desk (gui/), one over ssh (user/): both go, and launchd has
    forgotten both when uninstall returns."""
    uid = USER_UID
    plist = install_launchd(agent_cli, home, fake_managers)
    assert launchctl(fake_managers, "bootstrap", f"user/{uid}", str(plist)).returncode == 0
    removed = agent(
        agent_cli, home, "uninstall", "--launchd", path_dir=fake_managers, **LAUNCHD_LINGER
    )
    assert removed.returncode == 0, removed.stderr
    for domain in (f"gui/{uid}", f"user/{uid}"):
        assert f"launchctl bootout {domain}/io.mlx-fleet.agent" in removed.stderr
        assert launchctl(fake_managers, "print", f"{domain}/io.mlx-fleet.agent").returncode == 113
    assert fake_state(fake_managers)["loaded"] == [] and not plist.exists()


@pytest.mark.slow
def test_a_launchctl_failure_names_the_command_its_code_and_the_rollback(
    agent_cli: str, home: Path, fake_managers: Path
) -> None:
    uid = USER_UID
    plist = install_launchd(agent_cli, home, fake_managers)
    again = agent(
        agent_cli,
        home,
        "install",
        "--launchd",
        "--bind",
        "127.0.0.1:6000",
        path_dir=fake_managers,
        FAKE_FAIL="bootstrap",
    )
    assert again.returncode == 1
    said = " ".join(again.stderr.split())
    assert (
        f"launchctl bootstrap gui/{uid} {plist} failed (exit code 1): "
        "Bootstrap failed: 1: Operation not permitted"
    ) in said
    assert f"(restored the previous {plist}); the previous service, stopped for this" in said


def test_auto_picks_a_launch_daemon_where_nobody_is_at_the_screen() -> None:
    at_desk = Session(uid=501, euid=501, console_uid=501, ssh=True, sudo=False)
    headless = Session(uid=501, euid=501, console_uid=0, ssh=True, sudo=False)
    assert not auto_scope("launchd", at_desk, system_installed=False).system
    choice = auto_scope("launchd", headless, system_installed=False)
    assert choice.system and "not logged in at the screen" in choice.why
    assert "does not bring back after a reboot" in choice.fallback
    assert auto_scope("launchd", at_desk, system_installed=True).system
    assert not auto_scope("systemd", headless, system_installed=False).system


def test_auto_dry_run_says_what_it_chose(
    agent_cli: str, home: Path, fake_managers: Path, tmp_path: Path
) -> None:
    headless = over_ssh_nobody_at_the_screen(tmp_path)
    chosen = agent(agent_cli, home, "install", "--auto", "--launchd", "--dry-run", **headless)
    assert chosen.returncode == 0, chosen.stderr
    assert "service: system (" in chosen.stderr
    assert "/Library/LaunchDaemons/io.mlx-fleet.agent.plist" in chosen.stderr
    linux = agent(agent_cli, home, "install", "--auto", "--systemd", "--dry-run", **headless)
    assert "service: user (a systemd user service" in linux.stderr


@pytest.mark.slow
def test_a_system_service_runs_as_the_user_who_asked(agent_cli: str, home: Path) -> None:
    """`sudo agent install --system`: UserName is sudo's caller, unless --run-as says."""
    plist = agent(
        agent_cli, home, "install", "--system", "--launchd", "--dry-run", SUDO_USER="nobody"
    )
    assert plistlib.loads(plist.stdout.encode())["UserName"] == "nobody"
    unit = agent(
        agent_cli, home, "install", "--system", "--systemd", "--dry-run", "--run-as", "nobody"
    )
    assert read_unit(unit.stdout)["Service"]["User"] == "nobody"
    as_root = agent(
        agent_cli, home, "install", "--system", "--launchd", "--dry-run", "--run-as", "root"
    )
    assert "UserName" not in plistlib.loads(as_root.stdout.encode())
    refused = agent(agent_cli, home, "install", "--user", "--run-as", "nobody", "--dry-run")
    assert refused.returncode == 2 and "--run-as is for --system" in refused.stderr


def test_root_runs_only_what_root_alone_can_change(tmp_path: Path) -> None:
    """A venv its user can edit must not be run by a root service (mac-desk-check.md: Homebrew
    chowns what root services run)."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    python = venv / "python"
    python.touch()
    if os.geteuid() == 0:
        os.chown(venv.parent, 501, 20)
        assert editable_by_others([python]) == f"{venv.parent} is owned by uid 501, not root"
        os.chown(venv.parent, 0, 0)
        venv.parent.chmod(0o777)
        assert editable_by_others([python]) == f"{venv.parent} is writable by every user"
    else:
        assert f"is owned by uid {os.getuid()}, not root" in str(editable_by_others([python]))
    assert editable_by_others([Path("/usr/bin")]) is None


def test_sudo_that_wants_a_password_is_refused_with_the_fix(home: Path) -> None:
    """`agent install --system --sudo` as a user sudo will not serve without a password."""
    folder = Path(tempfile.mkdtemp(prefix="fake-sudo-"))
    folder.chmod(0o755)
    sudo = folder / "sudo"
    sudo.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FIXTURES / "fake_tool.py"}" sudo "$@"\n')
    sudo.chmod(0o755)
    script = WARM_THEN_DROP_ROOT.replace("'--systemd')", "'--systemd', '--sudo')")
    try:
        result = subprocess.run(
            [sys.executable, "-c", script]
            if os.geteuid() == 0
            else [sys.executable, "-m", "agent", "install", "--system", "--systemd", "--sudo"],
            capture_output=True,
            text=True,
            timeout=120,
            env=subprocess_env(
                HOME=str(home), PATH=f"{folder}:{os.environ['PATH']}", FAKE_SUDO_DENY="1"
            ),
        )
    finally:
        shutil.rmtree(folder)
    assert result.returncode == 2, result.stderr
    last = " ".join(result.stderr.split())
    assert "needs root: `sudo -n` refused: sudo: a password is required" in last


@pytest.mark.parametrize(
    ("folder", "said"),
    [
        ("Documents/fleet", "~/Documents"),
        ("Desktop/fleet", "~/Desktop"),
        ("Library/Mobile Documents/com~apple~CloudDocs/fleet", "iCloud Drive"),
    ],
)
def test_a_launchd_service_in_a_private_folder_is_refused_with_the_fix(
    agent_cli: str, home: Path, fleet_home: Path, folder: str, said: str
) -> None:
    """Issue 42: a launchd job cannot read ~/Documents and the like (TCC): the service exited
    'Operation not permitted' while running it by hand worked. One line, the fix, exit 2."""
    data = home / folder
    result = agent(
        agent_cli, home, "install", "--launchd", "--user", "--dry-run", "--data-dir", str(data)
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"data directory {data} is in {said}" in lines[0]
    assert "Operation not permitted" in lines[0] and "--data-dir" in lines[0]


def test_a_systemd_service_has_no_private_folders(
    agent_cli: str, home: Path, fleet_home: Path
) -> None:
    """TCC is macOS's: a systemd service with its data under ~/Documents is installed."""
    data = home / "Documents" / "fleet"
    result = agent(
        agent_cli, home, "install", "--systemd", "--user", "--dry-run", "--data-dir", str(data)
    )
    assert result.returncode == 0, result.stderr
