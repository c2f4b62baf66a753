"""`coordinator deploy` end to end against real sshd servers the test starts on loopback.

Each "Mac" is an sshd on its own loopback port whose sessions get their own HOME and
MLX_FLEET_HOME (authorized_keys environment=), and a fake systemctl on PATH (no systemd here).
The roll-out really creates a virtual environment, pip-installs the wheel it built, trusts the
coordinator's key, installs the service and records the agent's key. The pure parts (the
virtualenv script, dry runs, URL decoding) run without sshd.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from coordinator.hosts.deploy import MIN_REMOTE_PYTHON, RemoteLayout, direct_url_path, venv_command
from tests.conftest import subprocess_env

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

SSHD = "/usr/sbin/sshd"
FAKE_MANAGER = Path(__file__).parent / "fakes" / "service_manager.py"
REMOTE_PYTHON = str(Path(sys.base_prefix) / "bin" / "python3")
GIVEN_PYTHON = ("--remote-python", "/opt/homebrew/bin/python3.12")
"""Dry runs here name the Python, so they ask no host for one (test_deploy_python.py does)."""

NO_LAB = (
    "openssh-server is not installed (apt-get install openssh-server)"
    if not Path(SSHD).exists()
    else "no ssh client"
    if shutil.which("ssh") is None
    else "the test sshd runs as root"
    if os.geteuid() != 0
    else None
)
needs_sshd = pytest.mark.skipif(NO_LAB is not None, reason=str(NO_LAB))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"sshd on port {port} did not come up")


class Lab:
    """sshd 'hosts' on loopback and the ssh config that names them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True)
        self.client_key = root / "client_key"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.client_key)], check=True
        )
        self.config = root / "ssh_config"
        self.config.write_text("")
        self.servers: list[subprocess.Popen] = []
        self.fake_bin = root / "fake-bin"
        self.fake_bin.mkdir()
        (self.fake_bin / "systemctl").symlink_to(FAKE_MANAGER)

    def add_host(self, name: str) -> Path:
        """Start an sshd for `name`; returns that host's HOME."""
        folder = self.root / name
        home = folder / "home"
        home.mkdir(parents=True)
        host_key = folder / "host_key"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True
        )
        pip_cache = Path.home() / ".cache" / "pip"
        environment = {
            "HOME": str(home),
            "MLX_FLEET_HOME": str(home / "fleet-home"),
            "PATH": f"{self.fake_bin}:/usr/local/bin:/usr/bin:/bin",
            "FAKE_SERVICE_STATE": str(folder / "service-state.json"),
            "PIP_CACHE_DIR": str(pip_cache),
        }
        options = ",".join(f'environment="{k}={v}"' for k, v in environment.items())
        public = (self.client_key.with_suffix(".pub")).read_text().strip()
        authorized = folder / "authorized_keys"
        authorized.write_text(f"{options} {public}\n")
        port = free_port()
        config = folder / "sshd_config"
        config.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
AuthorizedKeysFile {authorized}
PidFile {folder / "sshd.pid"}
PermitRootLogin yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitUserEnvironment yes
StrictModes no
UsePAM no
Subsystem sftp internal-sftp
LogLevel ERROR
""")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        self.servers.append(
            subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL)
        )
        wait_for_port(port)
        self.add_alias(name, port)
        return home

    def add_alias(self, name: str, port: int) -> None:
        with self.config.open("a") as config:
            config.write(f"""Host {name}
  HostName 127.0.0.1
  Port {port}
  User root
  IdentityFile {self.client_key}
  UserKnownHostsFile /dev/null
  StrictHostKeyChecking no
  LogLevel ERROR

""")

    def close(self) -> None:
        for server in self.servers:
            server.terminate()
        for server in self.servers:
            server.wait(timeout=10)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path / "lab")
    try:
        yield lab
    finally:
        lab.close()


def deploy(coordinator_cli: str, lab: Lab, *hosts: str) -> subprocess.CompletedProcess:
    """`coordinator deploy` with `hosts` (--hosts H or --hostfile F) into the lab."""
    return subprocess.run(
        [
            coordinator_cli,
            "deploy",
            *hosts,
            "--ssh-config",
            str(lab.config),
            "--remote-python",
            REMOTE_PYTHON,
            "--thermal-source",
            "none",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        env=subprocess_env(),
    )


def remote_agent(home: Path, *args: str) -> str:
    agent = home / ".mlx-fleet" / "venv" / "bin" / "agent"
    return subprocess.run(
        [str(agent), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=subprocess_env(HOME=str(home), MLX_FLEET_HOME=str(home / "fleet-home")),
    ).stdout


@needs_sshd
@pytest.mark.timeout(1500)
@pytest.mark.slow
def test_roll_out_to_two_hosts_is_idempotent_and_skips_a_dead_one(
    coordinator_cli: str, lab: Lab, fleet_home: Path, tmp_path: Path
) -> None:
    """Run twice: by --hosts, then by an mlx.launch hostfile whose ssh alias is what deploy
    logs in with while the agent is recorded at its ip. mac1 starts with a venv some other
    run made (no record of its interpreter): it is made again, then kept."""
    homes = {name: lab.add_host(name) for name in ("mac1", "mac2")}
    lab.add_alias("mac3", free_port())  # nothing listens there
    coordinator_key = subprocess.run(
        [coordinator_cli, "keys", "show"],
        capture_output=True,
        text=True,
        check=True,
        env=subprocess_env(),
    ).stdout.strip()
    venv = homes["mac1"] / ".mlx-fleet" / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / "stale").touch()
    hostfile = tmp_path / "hosts.json"  # mlx.launch's: mac1's ip is 127.0.0.1, not its sshd's
    hostfile.write_text(
        json.dumps(
            [
                {"ssh": "mac1", "ips": ["127.0.0.1"]},
                {"host": "mac2", "port": 6000},
                {"host": "mac3"},
            ]
        )
    )

    made = None
    for hosts, mac1 in (
        (["--hosts", "mac1,mac2:6000,mac3"], "mac1:5555"),
        (["--hostfile", str(hostfile)], "127.0.0.1:5555"),
    ):
        result = deploy(coordinator_cli, lab, *hosts)
        assert result.returncode == 1, result.stderr  # mac3 failed, the others did not
        rows = {row["host"]: row for row in json.loads(result.stdout)}
        assert rows["mac3:5555"]["ok"] is False and rows["mac3:5555"]["failed"] == "prepare"
        for host in (mac1, "mac2:6000"):
            assert rows[host]["ok"], (hosts, rows[host]["error"])
            assert rows[host]["done"][-2:] == ["record agent key", "trust peers"]
            assert rows[host]["service"].startswith("user (a systemd user service")
        assert not (venv / "stale").exists()
        assert (venv / "mlx-fleet-python").read_text() == (
            f"{REMOTE_PYTHON} {sys.version_info[0]}.{sys.version_info[1]}"
        )
        made = made or (venv / "pyvenv.cfg").stat().st_mtime_ns
        assert (venv / "pyvenv.cfg").stat().st_mtime_ns == made  # the second run kept it

    known = json.loads((fleet_home / "keys" / "hosts.json").read_text())
    for name, address, port in (
        ("mac1", "mac1:5555", 5555),
        ("mac1", "127.0.0.1:5555", 5555),
        ("mac2", "mac2:6000", 6000),
    ):
        home = homes[name]
        assert known[address] == remote_agent(home, "keys", "show").strip()
        trusted = remote_agent(home, "keys", "list")
        assert trusted.count(coordinator_key) == 1
        unit = home / ".config" / "systemd" / "user" / "mlx-fleet-agent.service"
        assert f"serve --bind 0.0.0.0:{port} --thermal-source none" in unit.read_text()
        state = json.loads((lab.root / name / "service-state.json").read_text())
        assert state["loaded"] == ["mlx-fleet-agent.service"]
    assert "mac3" not in json.dumps(known)
    # Each agent trusts the other as the peer at its address (ranks of a gang find it there).
    mac1_key, mac2_key = known["127.0.0.1:5555"], known["mac2:6000"]
    assert f"{mac2_key}\tmac2:6000" in remote_agent(homes["mac1"], "keys", "list")
    assert f"{mac1_key}\t127.0.0.1:5555" in remote_agent(homes["mac2"], "keys", "list")


def test_a_dry_run_touches_no_host(coordinator_cli: str, fleet_home: Path) -> None:
    """Issue 42: a dry run asked each host for its Pythons, and failed on a name that does not
    resolve. Now it prints each host's `find python` question and says the steps after it run
    with what it finds; the real run asks (through a real sshd and login shell, above)."""
    result = coordinator(coordinator_cli, "deploy", "--hosts", "nosuch.invalid", "--dry-run")
    assert result.returncode == 0, result.stderr
    steps = dry_run_steps(result.stdout)
    assert list(steps) == ["build wheel", "find python"] or list(steps) == ["find python"]
    assert steps["find python"].startswith("ssh -o BatchMode=yes -o ConnectTimeout=10 ")
    assert "# the steps after `find python` run with the Python it finds" in result.stdout
    assert "nosuch.invalid" not in result.stderr  # nothing tried to reach it


def coordinator(coordinator_cli: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [coordinator_cli, *args], capture_output=True, text=True, timeout=60, env=subprocess_env()
    )


def dry_run_steps(stdout: str) -> dict[str, str]:
    """Each host step's command by name: the script's `# name` line, then its `ssh` line (the
    virtualenv step's script spans lines)."""
    return dict(re.findall(r"^# ([a-z ]+)\n(ssh .*)$", stdout, re.MULTILINE))


def dry_run_with_a_wheel(
    coordinator_cli: str, wheel: Path
) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    wheel.parent.mkdir(parents=True, exist_ok=True)
    wheel.write_bytes(b"PK")  # a dry run ships nothing, but the file must be there
    result = coordinator(
        coordinator_cli,
        "deploy",
        "--hosts",
        "mac1",
        "--dry-run",
        "--ssh-user",
        "lab",
        "--wheel",
        str(wheel),
        *GIVEN_PYTHON,
    )
    assert result.returncode == 0, result.stderr
    return result, dry_run_steps(result.stdout)


def test_dry_run_lists_every_step(coordinator_cli: str, tmp_path: Path) -> None:
    wheel = tmp_path / "dist dir" / "mlx_fleet-9-py3-none-any.whl"
    result, steps = dry_run_with_a_wheel(coordinator_cli, wheel)
    assert list(steps) == [
        "prepare",
        "copy wheel",
        "virtualenv",
        "install package",
        "trust coordinator",
        "install service",
        "read agent key",
    ]
    assert all(" lab@mac1 " in command for command in steps.values())
    # Pasted into a shell, the copy line must feed the wheel, not create an empty file.
    assert steps["copy wheel"].endswith(f" < '{wheel}'")
    assert "sudo" not in result.stdout


@pytest.mark.slow
def test_a_dry_run_trusts_the_real_key_a_first_run_would_make(
    coordinator_cli: str, fleet_home: Path, tmp_path: Path
) -> None:
    """No placeholder: the line can be pasted. A coordinator without a key makes the one the
    real run would (and says so); nothing else is written."""
    wheel = tmp_path / "dist dir" / "mlx_fleet-9-py3-none-any.whl"
    result, steps = dry_run_with_a_wheel(coordinator_cli, wheel)
    key = coordinator(coordinator_cli, "keys", "show").stdout.strip()
    assert len(key) == 40 and "<coordinator" not in result.stdout
    assert f"keys trust '\"'\"'{key}'\"'\"' " in steps["trust coordinator"]
    assert "made this coordinator's key" in result.stderr
    assert sorted(p.name for p in (fleet_home / "keys").iterdir()) == [
        "self.key",
        "self.key_secret",
    ]
    again, _ = dry_run_with_a_wheel(coordinator_cli, wheel)
    assert again.stdout == result.stdout and "made this" not in again.stderr


@pytest.mark.slow
def test_dry_run_trusts_the_coordinator_key_once_one_exists(
    coordinator_cli: str, fleet_home: Path
) -> None:
    key = coordinator(coordinator_cli, "keys", "show").stdout.strip()
    again = coordinator(coordinator_cli, "deploy", "--hosts", "mac1", "--dry-run", *GIVEN_PYTHON)
    assert key in dry_run_steps(again.stdout)["trust coordinator"]


@pytest.mark.slow
def test_system_dry_run_runs_every_step_as_the_login_user(coordinator_cli: str) -> None:
    """The system service runs as the login user (UserName), so trust and keys stay in that
    user's data directory; only `agent install` itself gets root, through `sudo -n`."""
    result = coordinator(
        coordinator_cli, "deploy", "--hosts", "mac1", "--dry-run", "--system", *GIVEN_PYTHON
    )
    assert result.returncode == 0, result.stderr
    steps = dry_run_steps(result.stdout)
    assert "install --system --sudo --bind 0.0.0.0:5555" in steps["install service"]
    assert all("sudo -n" not in command for command in steps.values())
    default = dry_run_steps(
        coordinator(coordinator_cli, "deploy", "--hosts", "mac1", "--dry-run", *GIVEN_PYTHON).stdout
    )
    assert "install --auto --bind 0.0.0.0:5555" in default["install service"]


def test_dry_run_logs_in_with_the_mlx_launch_ssh_alias(
    coordinator_cli: str, tmp_path: Path
) -> None:
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([{"ssh": "studio-a", "ips": ["10.0.0.2"]}]))
    result = coordinator(
        coordinator_cli,
        "deploy",
        "--hostfile",
        str(hostfile),
        "--dry-run",
        "--ssh-user",
        "lab",
        *GIVEN_PYTHON,
    )
    assert result.returncode == 0, result.stderr
    assert "# 10.0.0.2:5555" in result.stdout.splitlines()
    assert all(" lab@studio-a " in command for command in dry_run_steps(result.stdout).values())
    assert "10.0.0.2 " not in result.stdout


def test_an_unknown_thermal_source_is_refused_before_any_host(
    coordinator_cli: str, fleet_home: Path
) -> None:
    result = coordinator(coordinator_cli, "deploy", "--hosts", "mac1", "--thermal-source", "bogus")
    assert result.returncode == 2, result.stderr
    assert "unknown thermal source 'bogus'; known: auto, none," in " ".join(result.stderr.split())
    assert not fleet_home.exists()


def test_virtualenv_step_names_a_remote_python_that_is_too_old(tmp_path: Path) -> None:
    """The step as the host's shell runs it, with the bar above this interpreter."""
    layout = RemoteLayout(str(tmp_path / "remote"), REMOTE_PYTHON)
    result = subprocess.run(
        ["sh", "-c", venv_command(layout, minimum="3.99")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    version = ".".join(map(str, sys.version_info[:3]))
    assert result.stderr.strip().splitlines()[-1] == (
        f"{REMOTE_PYTHON} is Python {version}: mlx-fleet needs Python >= 3.99; pass "
        "--remote-python a newer one (on macOS e.g. /opt/homebrew/bin/python3.12)"
    )
    assert not (tmp_path / "remote").exists()


MAC_TOOLS = Path(__file__).parent / "fakes" / "mac_tools.py"


@pytest.mark.parametrize(
    ("mac", "changed", "refusal"),
    [
        (
            "m4",
            "kern.osproductversion=13.6.7",
            "macOS 13.6.7 is too old for MLX (it needs macOS >= 14): update macOS on this host",
        ),
        (
            "m4",
            "sysctl.proc_translated=1",
            f"{REMOTE_PYTHON} runs under Rosetta (x86_64): MLX needs a native arm64 Python; "
            "pass --remote-python an arm64 one (e.g. /opt/homebrew/bin/python3.12)",
        ),
        ("m2-max", "hw.optional.arm64=0", "an Intel Mac: MLX needs Apple Silicon (arm64)"),
    ],
)
@pytest.mark.slow
def test_virtualenv_step_refuses_a_mac_mlx_cannot_run_on(
    tmp_path: Path, mac: str, changed: str, refusal: str
) -> None:
    """One line naming the fix, before anything is made; the Mac's answers are captures."""
    tools = tmp_path / "mac-bin"
    tools.mkdir()
    for tool in ("sw_vers", "sysctl"):
        (tools / tool).symlink_to(MAC_TOOLS)
    layout = RemoteLayout(str(tmp_path / "remote"), REMOTE_PYTHON)
    env = subprocess_env(
        PATH=f"{tools}{os.pathsep}{os.environ['PATH']}", FAKE_MAC=mac, FAKE_SYSCTL=changed
    )
    result = subprocess.run(
        ["sh", "-c", venv_command(layout)], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(refusal)
    assert not (tmp_path / "remote").exists()
    fine = subprocess.run(
        ["sh", "-c", venv_command(layout)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "FAKE_SYSCTL": ""},
    )
    assert fine.returncode == 0, fine.stderr
    assert (tmp_path / "remote" / "venv" / "mlx-fleet-python").exists()


def test_min_remote_python_is_the_packages() -> None:
    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert pyproject["project"]["requires-python"] == f">={MIN_REMOTE_PYTHON}"


def test_direct_url_path_decodes_the_url(tmp_path: Path) -> None:
    checkout = tmp_path / "my projects" / "mlx-fleet"
    direct = json.dumps({"url": checkout.as_uri(), "dir_info": {"editable": True}})
    assert "%20" in direct and direct_url_path(direct) == checkout
    assert direct_url_path(json.dumps({"url": "https://example.invalid/x.whl"})) is None


def test_hosts_are_required(coordinator_cli: str) -> None:
    result = coordinator(coordinator_cli, "deploy")
    assert result.returncode == 2
    assert "--hosts" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--wheel", "/no/such/mlx_fleet-9-py3-none-any.whl"], "no such file"),
        (["--wheel", "/etc/hostname"], "is not a wheel (*.whl)"),
        (["--remote-python", ""], "--remote-python is empty"),
        (["--remote-dir", " "], "--remote-dir is empty"),
        (["--identity", "/no/such/key"], "--identity /no/such/key: no such file"),
        (["--ssh-config", "/no/such/config"], "--ssh-config /no/such/config: no such file"),
        (["--ssh-config", "/"], "--ssh-config / is not a file"),
    ],
)
@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.slow
def test_a_bad_wheel_or_python_is_one_line_even_in_a_dry_run(
    coordinator_cli: str, args: list[str], message: str, dry_run: bool
) -> None:
    result = coordinator(
        coordinator_cli, "deploy", "--hosts", "mac1", *args, *(["--dry-run"] * dry_run)
    )
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


@pytest.mark.slow
def test_a_dry_run_without_a_wheel_is_a_script_to_paste(coordinator_cli: str) -> None:
    """The wheel it would build, by its real name and how to build it: no `<version>`."""
    result = coordinator(coordinator_cli, "deploy", "--hosts", "mac1", "--dry-run", *GIVEN_PYTHON)
    assert result.returncode == 0, result.stderr
    assert "<version>" not in result.stdout
    lines = result.stdout.splitlines()
    assert lines[0] == "# build wheel" and " -m pip wheel -q --no-deps -w " in lines[1]
    wheel = f"mlx_fleet-{metadata.version('mlx-fleet')}-py3-none-any.whl"
    built = Path(shlex.split(lines[1])[-2]) / wheel
    assert dry_run_steps(result.stdout)["copy wheel"].endswith(f" < {shlex.quote(str(built))}")
    commands = [line for line in lines if not line.startswith("#")]
    assert commands[0] == lines[1] and all(line.startswith("ssh ") for line in commands[1:3])


@pytest.mark.slow
def test_a_dry_run_honours_format_json(coordinator_cli: str) -> None:
    result = coordinator(
        coordinator_cli,
        "deploy",
        "--hosts",
        "mac1,mac2",
        "--dry-run",
        "--format",
        "json",
        *GIVEN_PYTHON,
    )
    assert result.returncode == 0, result.stderr
    plans = json.loads(result.stdout)
    assert [plan["host"] for plan in plans] == ["mac1:5555", "mac2:5555"]
    assert [step["name"] for step in plans[0]["steps"]][:2] == ["prepare", "copy wheel"]
    assert all(step["command"].startswith("ssh ") for step in plans[1]["steps"])
