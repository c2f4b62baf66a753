"""`coordinator deploy` end to end against real sshd servers the test starts on loopback.

Each "Mac" is an sshd on its own loopback port whose sessions get their own HOME and
MLX_FLEET_HOME (authorized_keys environment=), and a fake systemctl on PATH (no systemd here).
The roll-out really creates a virtual environment, pip-installs the wheel it built, trusts the
coordinator's key, installs the service and records the agent's key.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import subprocess_env

SSHD = "/usr/sbin/sshd"
FAKE_MANAGER = Path(__file__).parent / "fakes" / "service_manager.py"

pytestmark = [
    pytest.mark.skipif(not Path(SSHD).exists(),
                       reason="openssh-server is not installed (apt-get install openssh-server)"),
    pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the test sshd runs as root"),
]


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
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                        str(self.client_key)], check=True)
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
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)],
                       check=True)
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
PidFile {folder / 'sshd.pid'}
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
        self.servers.append(subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)],
                                             stderr=subprocess.DEVNULL))
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


def deploy(coordinator_cli: str, lab: Lab, hosts: str) -> subprocess.CompletedProcess:
    remote_python = str(Path(sys.base_prefix) / "bin" / "python3")
    return subprocess.run(
        [coordinator_cli, "deploy", "--hosts", hosts, "--ssh-config", str(lab.config),
         "--remote-python", remote_python, "--thermal-source", "none", "--format", "json"],
        capture_output=True, text=True, timeout=1200, env=subprocess_env())


def remote_agent(home: Path, *args: str) -> str:
    agent = home / ".mlx-fleet" / "venv" / "bin" / "agent"
    return subprocess.run([str(agent), *args], capture_output=True, text=True, check=True,
                          timeout=120,
                          env=subprocess_env(HOME=str(home),
                                             MLX_FLEET_HOME=str(home / "fleet-home"))).stdout


@pytest.mark.timeout(1500)
def test_roll_out_to_two_hosts_is_idempotent_and_skips_a_dead_one(
        coordinator_cli: str, lab: Lab, fleet_home: Path) -> None:
    homes = {name: lab.add_host(name) for name in ("mac1", "mac2")}
    lab.add_alias("mac3", free_port())  # nothing listens there
    coordinator_key = subprocess.run([coordinator_cli, "keys", "show"], capture_output=True,
                                     text=True, check=True, env=subprocess_env()).stdout.strip()

    for attempt in range(2):  # the second run upgrades in place
        result = deploy(coordinator_cli, lab, "mac1,mac2:6000,mac3")
        assert result.returncode == 1, result.stderr  # mac3 failed, the others did not
        rows = {row["host"]: row for row in json.loads(result.stdout)}
        assert rows["mac3:5555"]["ok"] is False and rows["mac3:5555"]["failed"] == "prepare"
        for host in ("mac1:5555", "mac2:6000"):
            assert rows[host]["ok"], (attempt, rows[host]["error"])
            assert rows[host]["done"][-1] == "record agent key"

    known = json.loads((fleet_home / "keys" / "hosts.json").read_text())
    for name, address, port in (("mac1", "mac1:5555", 5555), ("mac2", "mac2:6000", 6000)):
        home = homes[name]
        assert known[address] == remote_agent(home, "keys", "show").strip()
        trusted = remote_agent(home, "keys", "list")
        assert trusted.count(coordinator_key) == 1
        unit = home / ".config" / "systemd" / "user" / "mlx-fleet-agent.service"
        assert f"serve --bind 0.0.0.0:{port} --thermal-source none" in unit.read_text()
        state = json.loads((lab.root / name / "service-state.json").read_text())
        assert state["loaded"] == ["mlx-fleet-agent.service"]
    assert "mac3" not in json.dumps(known)


def test_dry_run_lists_every_step(coordinator_cli: str) -> None:
    result = subprocess.run([coordinator_cli, "deploy", "--hosts", "mac1", "--dry-run",
                             "--ssh-user", "lab"], capture_output=True, text=True, timeout=60,
                            env=subprocess_env())
    assert result.returncode == 0, result.stderr
    steps = [line.split(":", 1)[0] for line in result.stdout.splitlines()[1:]]
    assert steps == ["prepare", "copy wheel", "virtualenv", "install package",
                     "trust coordinator", "install service", "read agent key"]
    assert "lab@mac1" in result.stdout


def test_hosts_are_required(coordinator_cli: str) -> None:
    result = subprocess.run([coordinator_cli, "deploy"], capture_output=True, text=True,
                            timeout=60, env=subprocess_env())
    assert result.returncode == 2
    assert "--hosts" in result.stderr
