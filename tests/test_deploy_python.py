"""`coordinator deploy` finds each Mac's Python when --remote-python is not given.

The Mac is a folder (tests/fixtures/fake-mac): a fake `ssh` runs the remote command in the
session a non-interactive ssh login gets (PATH=/usr/bin:/bin:/usr/sbin:/sbin) with the Mac's
paths under that folder, and fake interpreters answer as Homebrew's, python.org's, an Intel one
under Rosetta or Apple's stub do, each logging that it ran. The choice itself is pure and is
tested on the probe's lines."""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from coordinator.hosts.deploy import (
    PYTHON_CANDIDATES,
    PYTHON_QUESTION,
    PYTHON_SOURCES,
    FoundPython,
    choose_python,
    no_python_message,
    parse_probe,
    probe_command,
    skipped_pythons,
    sources_not_found,
)
from shared.io.keys import own_keypair
from tests.conftest import console_script, subprocess_env
from tests.test_deploy import dry_run_steps as steps_of

FAKE_MAC = Path(__file__).parent / "fixtures" / "fake-mac"
HOMEBREW_312 = "/opt/homebrew/bin/python3.12"
NATIVE_312 = "3.12 arm64 Darwin"
"""Homebrew's python@3.12 on Apple Silicon, in its arm64 prefix (Homebrew/brew#9177)."""
ROSETTA_312 = "3.12 x86_64 Darwin"
"""An Intel Homebrew's python3 in /usr/local (its Intel prefix, Homebrew/brew#9177) on Apple
Silicon: Rosetta runs it, and uname (so platform.machine()) reports x86_64 to a translated
process (Homebrew/install#319; bpo-42704 as archspec/archspec#134 quotes it)."""
APPLE_39 = "3.9 arm64 Darwin"
"""The Command Line Tools' python3 (Python 3.9, the one Apple ships: issue 27)."""
FRAMEWORK = "/Library/Frameworks/Python.framework/Versions/{}/bin/python3"


class FakeMac:
    """A Mac's file system in a folder, reached through the fake ssh."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root.parent / "coordinator-bin"
        self.bin.mkdir(parents=True)
        (self.bin / "ssh").symlink_to(FAKE_MAC / "ssh")
        self.install("/usr/bin/python3", FAKE_MAC / "python3-stub")
        self.install("/usr/bin/xcode-select", FAKE_MAC / "xcode-select")
        (root / "bin").mkdir()
        for tool in ("mkdir", "cat"):  # in every Mac's /bin; the steps before `virtualenv` use them
            (root / "bin" / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")

    def install(self, path: str, source: Path, answer: str | None = None) -> None:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        text = source.read_text()
        target.write_text(text.replace("@ANSWER@", answer) if answer else text)
        target.chmod(0o755)

    def python(self, path: str, answer: str) -> None:
        self.install(path, FAKE_MAC / "python", answer)

    def command_line_tools(self) -> None:
        self.python("/Library/Developer/CommandLineTools/usr/bin/python3", APPLE_39)

    def invoked(self) -> list[str]:
        """The interpreters that ran, as Mac paths."""
        log = self.root / "invoked.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [line.replace(str(self.root), "") for line in lines]

    def found(self) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        """A real run (a dry run asks no host: issue 42) with a stand-in wheel: its output and
        the host's row. The fake interpreter makes no venv, so a host whose Python was found
        stops at `install package`, one with none at `find python`."""
        wheel = self.root.parent / "mlx_fleet-9-py3-none-any.whl"
        wheel.write_bytes(b"PK")
        result = self.deploy("--wheel", str(wheel), "--format", "json", dry_run=False)
        [row] = json.loads(result.stdout)
        return result, row

    def deploy(self, *args: str, dry_run: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                console_script("coordinator"),
                "deploy",
                "--hosts",
                "mac1",
                *(["--dry-run"] * dry_run),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=subprocess_env(
                PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}", FAKE_MAC_ROOT=str(self.root)
            ),
        )


@pytest.fixture
def mac(tmp_path: Path, fleet_home: Path) -> FakeMac:
    """A fake Mac, deployed to by a coordinator that has its key already (a first dry run
    also makes it, with one more line: tests/test_deploy.py)."""
    own_keypair()
    return FakeMac(tmp_path / "mac")


@pytest.mark.slow
def test_homebrew_312_is_chosen_and_the_command_line_tools_stub_never_runs(
    mac: FakeMac,
) -> None:
    """The issue's case: only Apple's python3 (no Command Line Tools) and Homebrew's 3.12."""
    mac.python(HOMEBREW_312, NATIVE_312)
    result, row = mac.found()
    assert row["python"] == HOMEBREW_312, result.stderr
    assert f"mac1:5555: find python: {HOMEBREW_312} (3.12, arm64) ok" in result.stderr
    assert mac.invoked() == [HOMEBREW_312, HOMEBREW_312]  # asked, then made the venv
    # The first command the run ran is the probe a dry run shows; no later one asks python3.
    logged = (mac.root / "ssh.log").read_text().splitlines()
    probe, *later = [json.loads(line) for line in logged]
    assert probe == probe_command()
    assert not any(re.search(r"(^|[ '/])python3 ", command) for command in later)
    (mac.root / "ssh.log").unlink()
    dry = mac.deploy()
    assert dry.returncode == 0, dry.stderr
    login = "ssh -o BatchMode=yes -o ConnectTimeout=10 mac1 "
    assert steps_of(dry.stdout)["find python"] == login + shlex.quote(probe).splitlines()[0]
    assert not (mac.root / "ssh.log").exists()  # a dry run touches no host


@pytest.mark.slow
def test_no_usable_python_stops_the_host_with_one_line_naming_what_to_install(
    mac: FakeMac,
) -> None:
    """A Rosetta (Intel) /usr/local python3 and a python.org 3.9: neither will do."""
    mac.python("/usr/local/bin/python3", ROSETTA_312)
    mac.python(FRAMEWORK.format("3.9"), "3.9 arm64 Darwin")
    result, row = mac.found()
    assert result.returncode == 1  # a host failed (README, Exit codes)
    assert (row["failed"], row["done"], row["python"]) == ("find python", [], None)
    assert row["error"] == (
        "no usable Python on this host (>= 3.10, native arm64 on a Mac; found: "
        f"{FRAMEWORK.format('3.9')} (3.9, arm64); /usr/local/bin/python3 (3.12, x86_64); "
        "/usr/bin/python3 (not run: no Command Line Tools)): install one: `brew install "
        "python@3.12` or python.org's macOS installer, or pass --remote-python"
    )
    assert "/usr/bin/python3" not in mac.invoked()


@pytest.mark.slow
def test_search_order_homebrew_first_then_python_org_newest_first(mac: FakeMac) -> None:
    for version in ("3.9", "3.11", "3.13"):
        mac.python(FRAMEWORK.format(version), f"{version} arm64 Darwin")
    mac.python("/usr/local/bin/python3", NATIVE_312)
    assert mac.found()[1]["python"] == FRAMEWORK.format("3.13")
    mac.python("/opt/homebrew/bin/python3.10", "3.10 arm64 Darwin")
    assert mac.found()[1]["python"] == "/opt/homebrew/bin/python3.10"


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        ("/opt/local/bin/python3.12", "/opt/local/bin/python3.12"),
        ("$HOME/.pyenv/versions/3.12.4/bin/python3", "/.pyenv/versions/3.12.4/bin/python3"),
        (
            "$HOME/.local/share/uv/python/cpython-3.12.8-macos-aarch64-none/bin/python3",
            "/.local/share/uv/python/cpython-3.12.8-macos-aarch64-none/bin/python3",
        ),
        ("$HOME/miniforge3/bin/python3", "/miniforge3/bin/python3"),
        ("/opt/miniconda3/bin/python3", "/opt/miniconda3/bin/python3"),
    ],
    ids=["macports", "pyenv", "uv", "miniforge", "miniconda"],
)
@pytest.mark.slow
def test_macports_pyenv_uv_and_conda_pythons_are_found(mac: FakeMac, path: str, shown: str) -> None:
    """Issue 42: a Mac whose only Python came from MacPorts, pyenv, uv or conda was told it
    had none. ($HOME is the fake Mac's root, so its paths show from `/`.)"""
    mac.python(path.replace("$HOME", ""), NATIVE_312)
    result, row = mac.found()
    assert row["python"] == shown, result.stderr


@pytest.mark.slow
def test_apple_python_runs_only_with_the_command_line_tools_and_is_still_too_old(
    mac: FakeMac,
) -> None:
    mac.command_line_tools()
    result, row = mac.found()
    assert result.returncode == 1 and row["failed"] == "find python"
    assert "; found: /usr/bin/python3 (3.9, arm64)): install one" in row["error"]
    assert mac.invoked() == [
        "/usr/bin/python3",
        "/Library/Developer/CommandLineTools/usr/bin/python3",
    ]


def test_a_host_without_xcode_select_is_no_mac_and_its_usr_bin_python3_is_asked(
    mac: FakeMac,
) -> None:
    """A Linux host (deploy installs a systemd unit there): no stub to avoid, no arm64 rule."""
    (mac.root / "usr" / "bin" / "xcode-select").unlink()
    mac.python("/usr/bin/python3", "3.11 x86_64 Linux")
    result, row = mac.found()
    assert row["python"] == "/usr/bin/python3", result.stderr
    assert "mac1:5555: find python: /usr/bin/python3 (3.11, x86_64) ok" in result.stderr


@pytest.mark.slow
def test_a_real_run_uses_the_python_it_found_or_fails_the_host_at_find_python(
    mac: FakeMac, tmp_path: Path
) -> None:
    """The fake interpreter makes no venv, so the run stops at `install package`: far enough
    to show that `virtualenv` ran the Python found."""
    wheel = tmp_path / "mlx_fleet-9-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    real = ("--wheel", str(wheel), "--format", "json")
    mac.python(HOMEBREW_312, NATIVE_312)
    result = mac.deploy(*real, dry_run=False)
    assert result.returncode == 1
    [row] = json.loads(result.stdout)
    assert row["python"] == HOMEBREW_312
    assert row["done"] == ["find python", "prepare", "copy wheel", "virtualenv"]
    assert row["failed"] == "install package"
    assert f"mac1:5555: find python: {HOMEBREW_312} (3.12, arm64) ok" in result.stderr
    assert mac.invoked() == [HOMEBREW_312, HOMEBREW_312]  # asked, then made the venv
    (mac.root / HOMEBREW_312.lstrip("/")).unlink()
    [row] = json.loads(mac.deploy(*real, dry_run=False).stdout)
    assert (row["failed"], row["done"], row["python"]) == ("find python", [], None)
    assert row["error"].startswith(
        "no usable Python on this host (>= 3.10, native arm64 on a Mac; "
    )
    assert "/usr/bin/python3" not in mac.invoked()


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client")
def test_an_unreachable_host_fails_at_find_python_with_ssh_s_line(
    coordinator_cli: str, tmp_path: Path, fleet_home: Path
) -> None:
    """The real ssh to a port nothing listens on: the host fails at `find python` with ssh's
    line, exit 1; a dry run of it asks nothing and shows its plan (issue 42)."""
    own_keypair()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = tmp_path / "ssh_config"
    config.write_text(f"Host mac1\n  HostName 127.0.0.1\n  Port {port}\n")
    wheel = tmp_path / "mlx_fleet-9-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    deploy = [coordinator_cli, "deploy", "--hosts", "mac1", "--ssh-config", str(config)]
    deploy += ["--wheel", str(wheel), "--format", "json"]
    env = subprocess_env()
    result = subprocess.run(deploy, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 1
    [row] = json.loads(result.stdout)
    assert (row["failed"], row["done"]) == ("find python", [])
    assert f"ssh: connect to host 127.0.0.1 port {port}: Connection refused" in row["error"]
    dry = subprocess.run(
        [*deploy, "--dry-run"], capture_output=True, text=True, timeout=60, env=env
    )
    assert dry.returncode == 0, dry.stderr
    [plan] = json.loads(dry.stdout)
    assert [step["name"] for step in plan["steps"]] == ["find python"] and plan["after"]


def test_an_explicit_remote_python_is_used_and_nothing_is_asked(mac: FakeMac) -> None:
    """--remote-python as today: not probed; the virtualenv step checks it (test_deploy.py)."""
    result = mac.deploy("--remote-python", "/opt/homebrew/bin/python3.11")
    assert result.returncode == 0, result.stderr
    steps = steps_of(result.stdout)
    assert "find python" not in steps
    assert " mac1 '/opt/homebrew/bin/python3.11 -c " in steps["virtualenv"]
    assert not (mac.root / "ssh.log").exists()


def test_the_question_is_answered_by_a_real_interpreter_as_the_fakes_answer() -> None:
    answer = subprocess.run(
        [sys.executable, "-c", PYTHON_QUESTION], capture_output=True, text=True, check=True
    ).stdout
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert answer == f"{version} {platform.machine()} {platform.system()}\n"


def test_parse_probe_keeps_each_path_once_and_skips_what_is_not_a_line() -> None:
    found = parse_probe(
        "4\t/opt/homebrew/bin/python3\t3.12 arm64 Darwin\n"
        "garbage\n"
        "7\t/opt/homebrew/bin/python3\t3.12 arm64 Darwin\n"
        "6\t/usr/local/bin/python3\tfailed\n"
    )
    assert found == [
        FoundPython(4, "/opt/homebrew/bin/python3", "3.12 arm64 Darwin"),
        FoundPython(6, "/usr/local/bin/python3", "failed"),
    ]
    assert found[1].version is None and not found[1].usable()
    assert found[1].describe() == "/usr/local/bin/python3 (did not run)"


@pytest.mark.parametrize(
    ("answers", "chosen"),
    [
        ([(1, "/a", "3.12 arm64 Darwin"), (0, "/b", "3.13 x86_64 Darwin")], "/a"),
        ([(5, "/f/3.11", "3.11 arm64 Darwin"), (5, "/f/3.13", "3.13 arm64 Darwin")], "/f/3.13"),
        ([(3, "/h", "3.10 arm64 Darwin"), (5, "/f/3.13", "3.13 arm64 Darwin")], "/h"),
        ([(0, "/old", "3.9 arm64 Darwin"), (1, "/py2", "2.7 arm64 Darwin")], None),
        (
            [(6, "/rosetta", "3.12 x86_64 Darwin"), (8, "/usr/bin/python3", "3.11 x86_64 Linux")],
            "/usr/bin/python3",
        ),
    ],
)
def test_choose_python_takes_the_first_native_one_in_search_order(
    answers: list[tuple[int, str, str]], chosen: str | None
) -> None:
    python = choose_python([FoundPython(*answer) for answer in answers])
    assert (python.path if python else None) == chosen


def test_no_python_message_with_nothing_found() -> None:
    assert no_python_message([]).startswith(
        "no usable Python on this host (>= 3.10, native arm64 on a Mac; found: none)"
    )


@pytest.mark.slow
def test_the_probe_names_every_python_it_skipped_and_why(mac: FakeMac) -> None:
    """Issue 42: deploy probes conda, uv, pyenv and MacPorts Pythons, or says which it skipped
    and why. Homebrew's 3.12 is chosen; a Rosetta one, an old python.org one, a usable MacPorts
    one after it, and Apple's stub without the Command Line Tools are named, each with why."""
    mac.python(HOMEBREW_312, NATIVE_312)
    mac.python("/usr/local/bin/python3", ROSETTA_312)
    mac.python(FRAMEWORK.format("3.9"), "3.9 arm64 Darwin")
    mac.python("/opt/local/bin/python3.12", NATIVE_312)
    result, row = mac.found()
    assert row["python"] == HOMEBREW_312, result.stderr
    assert row["python_skipped"] == [
        {"path": FRAMEWORK.format("3.9"), "source": "python.org",
         "why": "Python 3.9, older than 3.10"},
        {"path": "/usr/local/bin/python3", "source": "/usr/local (Intel Homebrew or python.org)",
         "why": "x86_64 (Intel, or Rosetta): MLX needs a native arm64 Python"},
        {"path": "/opt/local/bin/python3.12", "source": "MacPorts",
         "why": "usable, but later in the search order"},
        {"path": "/usr/bin/python3", "source": "system (Apple)",
         "why": "not run: Apple's stub without the Command Line Tools opens their installer"},
    ]  # fmt: skip
    assert row["python_not_found"] == ["pyenv", "uv", "conda", "PATH"]
    [line] = [line for line in result.stderr.splitlines() if "find python skipped" in line]
    assert line.startswith(
        f"mac1:5555: find python skipped: {FRAMEWORK.format('3.9')} (python.org: Python 3.9, "
        "older than 3.10); /usr/local/bin/python3 ("
    )
    assert line.endswith("; none found from pyenv, uv, conda, PATH")
    (mac.root / HOMEBREW_312.lstrip("/")).unlink()
    (mac.root / "opt/local/bin/python3.12").unlink()
    result, row = mac.found()  # none usable: the failed host says the same
    assert row["failed"] == "find python" and len(row["python_skipped"]) == 3
    assert row["python_not_found"] == ["Homebrew", "MacPorts", "pyenv", "uv", "conda", "PATH"]
    assert "mac1:5555: find python skipped: " in result.stderr


@pytest.mark.slow
def test_an_explicit_remote_python_probes_nothing_and_skips_nothing(mac: FakeMac) -> None:
    wheel = mac.root.parent / "mlx_fleet-9-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    real = ("--wheel", str(wheel), "--format", "json", "--remote-python", HOMEBREW_312)
    result = mac.deploy(*real, dry_run=False)
    [row] = json.loads(result.stdout)
    assert (row["python_skipped"], row["python_not_found"]) == (None, None)
    assert "skipped" not in result.stderr


def test_every_candidate_has_its_installer() -> None:
    assert len(PYTHON_SOURCES) == len(PYTHON_CANDIDATES) + 2  # then python3 on PATH, Apple's
    conda = [i for i, path in enumerate(PYTHON_CANDIDATES) if "conda" in path or "forge" in path]
    assert {PYTHON_SOURCES[i] for i in conda} == {"conda"}
    pythons = [FoundPython(9, "/uv/python3", "3.12 arm64 Darwin"),
               FoundPython(8, "/pyenv/python3", "failed")]  # fmt: skip
    assert skipped_pythons(pythons, pythons[0]) == [
        {"path": "/pyenv/python3", "source": "pyenv", "why": "did not run"}
    ]
    assert "uv" not in sources_not_found(pythons) and "pyenv" not in sources_not_found(pythons)
