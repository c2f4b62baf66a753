"""`agent doctor`'s macOS rows that a first Mac needs right: the firewall allows the image that
really listens (a framework Python's `Resources/Python.app`) with a fix that runs when pasted,
FileVault and Login Items say what stops the service, and the benchmark needs only MLX.

The macOS tools are stand-ins on PATH (tests/fixtures/fake_mac_setup.py; `sudo` is
tests/fixtures/fake_tool.py's), each answer citing where its text comes from."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agent.doctor.firewall import (
    FIREWALL,
    app_verdict,
    block_all,
    firewall_check,
    firewall_target,
    fix_commands,
    global_state,
)
from agent.doctor.mac_setup import (
    background_items,
    filevault_check,
    filevault_on,
    login_items_check,
    login_items_verdict,
    pmset_settings,
    service_folders_check,
    sleep_check,
)
from tests.conftest import run_cli
from tests.test_doctor import checks, free_port

FIXTURES = Path(__file__).parent / "fixtures"
DUMPBTM = FIXTURES / "mac-setup" / "sfltool-dumpbtm.txt"
FAKE = FIXTURES / "fake_mac_setup.py"
LABEL = "io.mlx-fleet.agent"


def install_fakes(bin_dir: Path, *tools: str) -> dict[str, Path]:
    bin_dir.mkdir(parents=True, exist_ok=True)
    placed = {}
    for tool in tools:
        wrapper = bin_dir / tool
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" {tool} "$@"\n')
        wrapper.chmod(0o755)
        placed[tool] = wrapper
    return placed


@pytest.fixture
def framework(tmp_path: Path) -> tuple[Path, Path]:
    """A tree shaped like python.org's framework, under a folder with a space, and a venv in
    `my projects/` whose python links to the framework's launcher: (venv python, the app)."""
    version = tmp_path / "Library Frameworks" / "Python.framework" / "Versions" / "3.12"
    launcher = version / "bin" / "python3.12"
    image = version / "Resources" / "Python.app" / "Contents" / "MacOS" / "Python"
    for path in (launcher, image):
        path.parent.mkdir(parents=True)
        path.write_text("")
    venv_python = tmp_path / "my projects" / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(launcher)
    return venv_python, version / "Resources" / "Python.app"


def test_the_firewall_target_is_the_framework_app_the_launcher_execs(
    framework: tuple[Path, Path], tmp_path: Path
) -> None:
    venv_python, app = framework
    image = app / "Contents" / "MacOS" / "Python"
    assert firewall_target(str(image), [], []) == app, "the running image is inside the app"
    assert firewall_target(str(venv_python), [str(venv_python)], []) == app
    prefix = app.parent.parent
    assert firewall_target("/nowhere/python3", [], [str(prefix)]) == app
    plain = tmp_path / "usr" / "bin" / "python3.12"  # a non-framework build listens itself
    plain.parent.mkdir(parents=True)
    plain.write_text("")
    assert firewall_target(str(plain), [str(plain)], ["/usr"]) == plain


def test_the_printed_fix_runs_when_pasted_spaces_included(
    framework: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pasted into a shell, the fix passes the bundle's path as one argument to both calls."""
    _, app = framework
    tools = tmp_path / "fake tools"
    tool = install_fakes(tools, "socketfilterfw")["socketfilterfw"]
    (tools / "sudo").write_text('#!/bin/sh\nexec "$@"\n')  # sudo(8) with a cached password
    (tools / "sudo").chmod(0o755)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_TOOL_LOG", str(log))
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    fix = fix_commands(app, str(tool))
    assert shlex.split(fix) == [
        "sudo", str(tool), "--add", str(app), "&&", "sudo", str(tool), "--unblockapp", str(app)
    ]  # fmt: skip
    done = subprocess.run(["sh", "-c", fix], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    calls = [line.split("\t") for line in log.read_text().splitlines()]
    assert calls == [
        ["socketfilterfw", "--add", str(app)],
        ["socketfilterfw", "--unblockapp", str(app)],
    ]
    assert fix_commands(app).startswith(f"sudo {FIREWALL} --add ")


def test_socketfilterfw_answers_are_read_as_the_tools_that_parse_them_do() -> None:
    assert global_state("Firewall is enabled. (State = 1)\n") == 1
    assert global_state("Firewall is enabled. (State = 2)\n") == 2
    assert global_state("Firewall is disabled. (State = 0)\n") == 0
    managed = "Firewall settings cannot be modified from command line on managed Mac computers."
    assert global_state(managed) is None and block_all(managed) is None
    assert block_all("Firewall has block all state set to enabled.\n") is True
    assert block_all("Firewall has block all state set to disabled.\n") is False
    assert app_verdict("Incoming connection to /x/Python is blocked.") == "blocked"
    assert app_verdict("Incoming connection to /x/Python is not blocked.") == "allowed"
    assert app_verdict("Incoming connection to /x/Python is permitted.") == "allowed"
    assert app_verdict("The application /x is not part of the firewall.") == "unlisted"
    assert app_verdict("???") is None


@pytest.mark.parametrize(
    ("firewall", "app", "ok", "said"),
    [
        ("off", "blocked", True, "Firewall is disabled. (State = 0)"),
        ("on", "permitted", True, "is permitted"),
        ("on", "blocked", False, "is blocked"),
        ("on", "unlisted", False, "not part of the firewall"),
        ("blockall", "permitted", False, "block-all ignores every allow list"),
        ("managed", "permitted", False, "cannot read its state"),
    ],
)
def test_the_firewall_row_names_the_app_and_its_fix(
    framework: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    firewall: str,
    app: str,
    ok: bool,
    said: str,
) -> None:
    _, bundle = framework
    tool = install_fakes(tmp_path / "bin", "socketfilterfw")["socketfilterfw"]
    monkeypatch.setenv("FAKE_FIREWALL", firewall)
    monkeypatch.setenv("FAKE_FIREWALL_APP", app)
    check = firewall_check(str(tool), bundle)
    assert check.ok is ok and not check.required
    assert said in check.detail
    if firewall in ("on", "blockall"):
        assert check.fix is not None and shlex.quote(str(bundle)) in check.fix
    if firewall == "blockall":
        assert check.fix is not None and check.fix.startswith(f"sudo {tool} --setblockall off")


def test_a_missing_socketfilterfw_is_said_not_raised(tmp_path: Path) -> None:
    check = firewall_check(str(tmp_path / "absent"), tmp_path / "Python.app")
    assert not check.ok and "cannot read its state" in check.detail


def test_fdesetup_status_is_parsed_from_its_first_line() -> None:
    assert filevault_on("FileVault is On.\n") is True
    assert filevault_on("FileVault is Off.\n") is False
    assert filevault_on("FileVault is On.\nFileVault master keychain appears to be installed.\n")
    assert filevault_on("Error: Unable to get FileVault status.") is None


@pytest.mark.parametrize(
    ("mode", "at_screen", "ok", "said"),
    [
        ("off", False, True, "Off"),
        ("on", True, True, "someone is logged in at the screen"),
        ("on", False, False, "nobody is logged in at the screen"),
        ("fail", False, False, "cannot tell"),
        ("garbage", False, False, "cannot tell: `fdesetup status` said '%%%'"),
    ],
)
def test_filevault_warns_a_headless_mac_and_explains_authrestart(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    at_screen: bool,
    ok: bool,
    said: str,
) -> None:
    install_fakes(tmp_path / "bin", "fdesetup")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_FDESETUP", mode)
    check = filevault_check(at_screen)
    assert check.ok is ok and not check.required and said in check.detail
    if not ok and mode == "on":
        assert check.fix is not None and "sudo fdesetup authrestart" in check.fix


def test_a_missing_fdesetup_is_said_not_raised(tmp_path: Path) -> None:
    check = filevault_check(False, str(tmp_path / "absent"))
    assert not check.ok and "not found" in check.detail


def test_dumpbtm_records_and_their_dispositions_are_parsed() -> None:
    items = background_items(DUMPBTM.read_text())
    assert [item.name for item in items] == ["Postgres", "Power Manager", "Python"]
    postgres, power, agent = items
    assert postgres.switched_off and postgres.kind == "app (0x2)"
    assert postgres.disposition == {"disabled", "allowed", "visible", "not notified"}
    assert not power.switched_off and power.identifier == "uk.co.dssw.pmnotify"
    assert agent.url.endswith(f"/{LABEL}.plist") and not agent.switched_off
    assert login_items_verdict(DUMPBTM.read_text(), LABEL).ok
    off = DUMPBTM.read_text().replace(
        "[enabled, allowed, visible, notified] (11)\n           Identifier: io.mlx",
        "[disabled, allowed, visible, notified] (10)\n           Identifier: io.mlx",
    )
    check = login_items_verdict(off, LABEL)
    assert not check.ok and "switched off in Login Items" in check.detail
    assert check.fix is not None and "Login Items & Extensions" in check.fix
    assert login_items_verdict(DUMPBTM.read_text(), "other.label").detail.startswith("no Back")


@pytest.mark.parametrize(
    ("as_root", "env", "ok", "said"),
    [
        (True, {}, True, f"{LABEL}: legacy agent (0x10008) [allowed, enabled, notified, visible]"),
        (False, {}, True, f"{LABEL}: legacy agent"),
        (False, {"FAKE_SUDO_DENY": "1"}, False, "not readable without sudo"),
        (True, {"FAKE_SFLTOOL": "fail"}, False, "Operation not permitted"),
        (True, {"FAKE_SFLTOOL": "garbage"}, False, "'this is not a record'"),
    ],
)
def test_login_items_are_read_as_root_or_through_sudo_n_only(
    tmp_path: Path,
    tool_log: Path,
    monkeypatch: pytest.MonkeyPatch,
    as_root: bool,
    env: dict[str, str],
    ok: bool,
    said: str,
) -> None:
    install_fakes(tmp_path / "bin", "sfltool")  # tool_log put fake sudo in the same folder
    monkeypatch.setenv("FAKE_SFLTOOL_FILE", str(DUMPBTM))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    check = login_items_check(as_root)
    assert check.ok is ok and not check.required and said in check.detail, check
    starts = tool_log.read_text().splitlines()
    assert any(line.endswith("sudo -n sfltool dumpbtm") for line in starts) is not as_root


def test_a_missing_sfltool_is_said_not_raised(tmp_path: Path) -> None:
    check = login_items_check(True, str(tmp_path / "absent"))
    assert not check.ok and "not found" in check.detail


@pytest.mark.slow
def test_agent_doctor_passes_without_numpy(tmp_path: Path) -> None:
    """The base install has no numpy (only mlx-lm brings it): every required check passes
    with `import numpy` failing, the benchmark included."""
    blocker = tmp_path / "no-numpy"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\n\nsys.modules['numpy'] = None\n")
    env = {"PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])}
    probe = subprocess.run(
        [sys.executable, "-c", "import numpy"], capture_output=True, text=True, env=os.environ | env
    )
    assert probe.returncode == 1 and "import of numpy halted" in probe.stderr, "blocked"
    result = run_cli(
        "agent", "doctor", "--format", "json", "--bind", f"0.0.0.0:{free_port()}", env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = checks(json.loads(result.stdout))
    assert found["benchmark"]["ok"] and "max relative error" in found["benchmark"]["detail"]
    if sys.platform != "darwin":  # the Mac-only rows say so, and none is required
        for name in ("firewall", "FileVault", "login items"):
            assert not found[name]["ok"] and not found[name]["required"], name
        assert found["FileVault"]["detail"].startswith("not applicable: not a Mac")
        assert found["login items"]["detail"].startswith("not applicable: not a Mac")


@pytest.mark.slow
def test_the_benchmark_fails_when_mlx_multiplies_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference is computed apart from the matmul kernels, so a wrong kernel shows."""
    import mlx.core as mx

    from agent.doctor.checks import bench_check
    from agent.profiling.device_probe import DeviceProbe, matmul_speed

    right = mx.matmul
    monkeypatch.setattr(mx, "matmul", lambda a, b: right(a, b) * 2)
    check = bench_check(DeviceProbe({}, matmul_speed(0.1)))
    assert not check.ok and check.required and check.fix == "MLX computes wrong results"


@pytest.mark.parametrize(
    ("where", "place"),
    [
        ("Documents/mlx-fleet/.venv/bin/python3", "~/Documents"),
        ("Downloads/x/bin/python3", "~/Downloads"),
        ("Library/CloudStorage/Dropbox/venv/bin/python3", "a cloud drive"),
    ],
)
def test_doctor_says_a_service_cannot_read_a_private_folder(
    tmp_path: Path, where: str, place: str
) -> None:
    home = tmp_path / "home"
    check = service_folders_check([("interpreter", home / where)], home)
    assert not check.ok and f"is in {place}" in check.detail and "TCC" in check.detail
    assert check.fix is not None and "move the virtual environment" in check.fix


def test_doctor_passes_folders_a_service_can_read_and_names_a_volume(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fine = service_folders_check([("interpreter", home / "mlx-fleet/.venv/bin/python3")], home)
    assert fine.ok, fine.detail
    volume = service_folders_check([("package", Path("/Volumes/Ext/mlx-fleet/agent"))], home)
    assert not volume.ok and "external or network volume (/Volumes/Ext)" in volume.detail


def test_a_link_into_a_private_folder_is_followed(tmp_path: Path) -> None:
    """A venv's python may link elsewhere: the target is checked too."""
    home = tmp_path / "home"
    target = home / "Documents" / "python3"
    target.parent.mkdir(parents=True)
    target.touch()
    link = tmp_path / "venv" / "python3"
    link.parent.mkdir()
    link.symlink_to(target)
    check = service_folders_check([("interpreter", link)], home)
    assert not check.ok and "~/Documents" in check.detail


@pytest.mark.parametrize(
    ("mode", "fixture", "ok", "said", "fix"),
    [
        ("ok", "pmset-g-sleeps.txt", False, "sleeps after 1 min idle", "sudo pmset -a sleep 0"),
        ("ok", "pmset-g-sleeps.txt", False, "stays off", "sudo pmset -a autorestart 1"),
        ("ok", "pmset-g-awake.txt", True, "never sleeps when idle; restarts after", None),
        ("fail", "pmset-g-awake.txt", False, "said 'pmset: failed to read settings'", None),
    ],
)
def test_doctor_reads_pmset_and_says_what_makes_an_idle_mac_unreachable(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    fixture: str,
    ok: bool,
    said: str,
    fix: str | None,
) -> None:
    """Issue 42: a stock Mac mini sleeps after a minute idle (tuist#13017) and its idle agent
    looks dead; doctor reads `pmset -g` and gives the fix."""
    tool = install_fakes(tmp_path / "bin", "pmset")["pmset"]
    monkeypatch.setenv("FAKE_PMSET", mode)
    monkeypatch.setenv("FAKE_PMSET_FILE", str(FIXTURES / "mac-setup" / fixture))
    check = sleep_check(str(tool))
    assert check.ok is ok and not check.required and said in check.detail, check
    if fix is not None:
        assert check.fix is not None and fix in check.fix


def test_pmset_settings_take_the_first_word_of_each_setting_in_use() -> None:
    text = (FIXTURES / "mac-setup" / "pmset-g-sleeps.txt").read_text()
    settings = pmset_settings(text)
    assert settings["sleep"] == "1" and settings["autorestart"] == "0"
    assert settings["hibernatefile"] == "/var/vm/sleepimage"
    assert pmset_settings("Currently in use:\n sleep (none)\n") == {}
