"""One checked entry to the data dir (shared/io/paths.py, README Data): a data dir that is a
file, read-only (a real read-only mount: root, as here, ignores permission bits), full (a tiny
tmpfs filled up), or of the wrong mode is one line naming it, exit 2, no traceback, in every
command that touches it; a read-only store is still read; what the tools create is private."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.runs.store import RunStore
from tests.conftest import console_script
from tests.fleet_support import subprocess_env

pytestmark = pytest.mark.timeout(300)

SMALL = ["--config-small", "-p", "16", "-n", "0", "-r", "1", "-w", "0"]
BENCH = ["bench", *SMALL]
COMMANDS = [
    ("agent", ["keys", "show"]),
    ("agent", ["keys", "trust", "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"]),
    ("agent", ["run", "--thermal-source", "none", "--", "true"]),
    ("agent", BENCH),
    ("coordinator", ["benchmark", *SMALL]),
    ("coordinator", ["status", "--hosts", "127.0.0.1:9"]),
    ("coordinator", ["keys", "show"]),
]
"""Commands that write the data dir: each refuses an unusable one before any work."""
READERS = [["runs"], ["show", "r-"], ["history"]]
"""`coordinator` commands that only read it: a read-only one is read, not refused."""


def name(value: object) -> str:
    return value if isinstance(value, str) else " ".join(map(str, value))[:30]


def run(program: str, args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [console_script(program), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(MLX_FLEET_HOME=str(home), COLUMNS="200"),
    )


def assert_one_line(done: subprocess.CompletedProcess[str], home: Path, words: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("error: data dir ") and str(home) in lines[0], lines[0]
    assert words in lines[0], lines[0]


def mount(*args: str) -> None:
    made = subprocess.run(["mount", *args], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount here (needs root and CAP_SYS_ADMIN): {made.stderr.strip()}")


@pytest.fixture
def read_only_home(tmp_path: Path) -> Iterator[Path]:
    """A data dir holding a real run store, then bind-mounted read-only over itself."""
    home = tmp_path / "ro-home"
    home.mkdir(mode=0o700)
    with RunStore(home / "coordinator.sqlite") as store:
        store.create_run({"models": ["small"]}, ["mac1"])
    mount("--bind", str(home), str(home))
    try:
        mount("-o", "remount,ro,bind", str(home))
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)


@pytest.fixture
def full_home(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs written until it refuses more."""
    home = tmp_path / "full-home"
    home.mkdir(mode=0o700)
    mount("-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(home))
    try:
        fd = os.open(home / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)


@pytest.mark.parametrize(("program", "args"), COMMANDS, ids=name)
@pytest.mark.slow
def test_a_data_dir_that_is_a_file(tmp_path: Path, program: str, args: list[str]) -> None:
    home = tmp_path / "file"
    home.write_text("x", encoding="utf-8")
    assert_one_line(run(program, args, home), home, "is a file, not a directory")


@pytest.mark.parametrize(("program", "args"), COMMANDS, ids=name)
@pytest.mark.slow
def test_a_read_only_data_dir(read_only_home: Path, program: str, args: list[str]) -> None:
    assert_one_line(run(program, args, read_only_home), read_only_home, "Read-only file system")


@pytest.mark.parametrize(("program", "args"), COMMANDS, ids=name)
@pytest.mark.slow
def test_a_full_data_dir(full_home: Path, program: str, args: list[str]) -> None:
    assert_one_line(run(program, args, full_home), full_home, "No space left on device")


@pytest.mark.slow
def test_a_data_dir_its_owner_cannot_write(tmp_path: Path) -> None:
    home = tmp_path / "locked"
    home.mkdir(mode=0o500)
    for program, args in COMMANDS:
        assert_one_line(run(program, args, home), home, "mode 0500")


@pytest.mark.parametrize("args", READERS, ids=" ".join)
def test_a_read_only_store_is_read(read_only_home: Path, args: list[str]) -> None:
    done = run("coordinator", args, read_only_home)
    assert "Traceback" not in done.stderr and "not a usable" not in done.stderr, done.stderr
    assert "Read-only" not in done.stderr, done.stderr
    if args == ["runs"]:
        assert done.returncode == 0 and "mac1" in done.stdout, done.stderr
    if args[0] == "show":
        assert done.returncode == 0, done.stderr


def test_runs_as_json_from_a_read_only_store(read_only_home: Path) -> None:
    done = run("coordinator", ["runs", "--format", "json"], read_only_home)
    assert done.returncode == 0, done.stderr
    assert [run["hosts"] for run in json.loads(done.stdout)] == [["mac1"]]


def test_doctor_says_why_the_data_dir_fails(
    tmp_path: Path, full_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.doctor.checks import data_checks

    file = tmp_path / "file"
    file.write_text("x", encoding="utf-8")
    for home, words in ((file, "is a file"), (full_home, "No space left on device")):
        monkeypatch.setenv("MLX_FLEET_HOME", str(home))
        check = data_checks()[0]
        assert check.name == "data dir" and not check.ok and words in check.detail, check


def walk_modes(home: Path) -> dict[str, str]:
    """Every folder not 0700 and every file not 0600 under `home`, with its mode."""
    found = {}
    for path in [home, *home.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        wanted = 0o700 if path.is_dir() else 0o600
        if mode != wanted and not path.is_symlink() and not path.is_socket():
            found[str(path.relative_to(home))] = f"{mode:04o}"
    return found


def test_what_agent_bench_creates_is_private(tmp_path: Path) -> None:
    home = tmp_path / "fresh" / "home"
    done = run("agent", [*BENCH, "--format", "json"], home)
    assert done.returncode == 0, done.stderr
    assert list((home / "runs").glob("bench-*.json"))
    assert walk_modes(home) == {}
    assert stat.S_IMODE((tmp_path / "fresh").stat().st_mode) == 0o700  # made on the way


@pytest.mark.slow
def test_what_coordinator_benchmark_creates_is_private(tmp_path: Path) -> None:
    """The embedded agent's home too: its folders, keys, log, journals and job logs."""
    home = tmp_path / "home"
    done = run("coordinator", ["benchmark", *SMALL, "--format", "json"], home)
    assert done.returncode == 0, done.stderr
    assert (home / "embedded-agent" / "agent.log").exists()
    public_keys = {k: v for k, v in walk_modes(home).items() if k.endswith("self.key")}
    assert walk_modes(home) == public_keys  # a public key may be read: only its secret may not
    assert set(public_keys.values()) <= {"0644"}, public_keys  # read, never written, by others
    secrets = list(home.rglob("*.key_secret"))
    assert secrets and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in secrets)


@pytest.mark.slow
def test_agent_doctor_marks_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    home = tmp_path / "file"
    home.write_text("x", encoding="utf-8")
    done = run("agent", ["doctor"], home)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    row = next(line for line in done.stdout.splitlines() if "data dir" in line and "│" in line)
    assert "✗" in row and "is a file, not a directory" in row, done.stdout
