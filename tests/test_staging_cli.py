"""`coordinator stage` against real agents on loopback, its bad input each one line and exit 2:
an id the origin cannot fetch (offline), a host whose store has no room (a small tmpfs), is a
file or is read-only (refused before any byte moves to it, the others staged), and
`coordinator models` naming what each holds."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shared.io.trust import trust
from tests.conftest import console_script, subprocess_env
from tests.fleet_support import AgentPool, AgentProcess
from tests.staging_support import write_model_dir

pytestmark = pytest.mark.timeout(300)
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Fleet:
    root: Path
    home: Path
    agents: dict[str, AgentProcess]
    model: Path

    def hostfile(self, *hosts: str) -> Path:
        path = self.root / f"hosts-{'-'.join(hosts)}.json"
        entries = [
            {"host": "127.0.0.1", "port": self.agents[h].port, "key": self.agents[h].key}
            for h in hosts
        ]
        path.write_text(json.dumps({"hosts": entries}))
        return path

    def coordinator(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [console_script("coordinator"), *args],
            capture_output=True, text=True, timeout=240,
            env=subprocess_env(MLX_FLEET_HOME=str(self.home), COLUMNS="250"),
        )  # fmt: skip


def mount_tmpfs(where: Path, options: str) -> None:
    where.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Agents `ok` (its Hugging Face cache), `small` (a 16 MiB tmpfs store), `file` (a store
    that is a file), `readonly` (a read-only tmpfs) and `dir` (a models directory of its own),
    peers of each other."""
    root = tmp_path_factory.mktemp("stage-cli")
    mounts = [root / "small", root / "readonly"]
    mount_tmpfs(mounts[0], "size=16m")
    mount_tmpfs(mounts[1], "ro,size=1m")
    (root / "a-file").write_text("not a folder")
    stores = {
        "small": mounts[0],
        "file": root / "a-file",
        "readonly": mounts[1],
        "dir": root / "models",
    }
    pool = AgentPool(root / "agents")
    try:
        agents = {}
        for name in ("ok", "small", "file", "readonly", "dir"):
            options = ["--models-dir", str(stores[name])] if name in stores else []
            agents[name] = pool.start(
                name,
                options=options,
                wrapper=["env", f"HF_HOME={root / name / 'hf'}", "HF_HUB_OFFLINE=1"],
            )
        home = root / "coordinator"
        key = subprocess.run(
            [console_script("coordinator"), "keys", "show"], capture_output=True, text=True,
            env=subprocess_env(MLX_FLEET_HOME=str(home)), timeout=60,
        ).stdout.strip()  # fmt: skip
        for name, agent in agents.items():
            trust(key, "test", agent.home / "keys" / "trusted")
            for other, peer in agents.items():
                if other != name:
                    trust(peer.key or "", f"peer-{other}", agent.home / "keys" / "trusted",
                          peer.address)  # fmt: skip
        model = root / "model"
        write_model_dir(model, 2)
        yield Fleet(root, home, agents, model)
    finally:
        pool.kill_all()
        for mount in mounts:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.mark.slow
def test_an_id_the_origin_cannot_fetch_is_one_line(fleet: Fleet) -> None:
    done = fleet.coordinator("stage", "test-org/missing", "--hostfile", str(fleet.hostfile("ok")))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    ok = fleet.agents["ok"].address
    assert line.startswith(f"error: {ok}: model test-org/missing is not in the Hugging Face cache")
    assert "HF_HUB_OFFLINE=1" in line


@pytest.mark.slow
def test_hosts_whose_store_cannot_take_it_are_refused_the_others_staged(fleet: Fleet) -> None:
    hosts = fleet.hostfile("ok", "small", "file", "readonly")
    done = fleet.coordinator("stage", str(fleet.model), "--as", "lab/m", "--hostfile", str(hosts))
    assert done.returncode == 2, done.stderr
    errors = [
        line for line in done.stderr.splitlines() if "no room" in line or "models dir" in line
    ]
    address = {name: agent.address for name, agent in fleet.agents.items()}
    assert sorted(errors) == sorted(
        [
            f"error: {address['small']}: no room for lab/m (3.3 MB + 268.6 MB margin): 16.8 MB "
            f"free on {fleet.root / 'small'}",
            f"error: {address['file']}: the models directory {fleet.root / 'a-file'} is a file",
            f"error: {address['readonly']}: the models directory {fleet.root / 'readonly'} is on "
            "a read-only file system",
        ]
    ), done.stderr
    assert list((fleet.root / "small").iterdir()) == []  # nothing half-written
    listed = fleet.coordinator("models", "--hostfile", str(hosts), "-o", "json")
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)["models"]
    assert entry["name"] == "lab/m"
    assert entry["hosts"] == {
        address["ok"]: "present",
        address["small"]: "missing",
        address["file"]: "missing",
        address["readonly"]: "missing",
    }


@pytest.mark.slow
def test_benchmark_stage_copies_an_id_from_this_machine_s_cache_then_runs(fleet: Fleet) -> None:
    """`--stage`: an id this coordinator's Hugging Face cache holds is staged to the host, then
    the matrix runs on the staged copy (the agent offline, its cache empty before)."""
    repo = "test-org/cached"
    snapshot = fleet.root / "coordinator-hf" / "hub" / f"models--{repo.replace('/', '--')}"
    write_model_dir(snapshot / "snapshots" / COMMIT, 1)
    (snapshot / "refs").mkdir()
    (snapshot / "refs" / "main").write_text(COMMIT)
    done = subprocess.run(
        [console_script("coordinator"), "benchmark", "--model", repo, "--stage", "--hostfile",
         str(fleet.hostfile("ok")), "-p", "8", "-n", "2", "-r", "1", "-w", "0", "-o", "json"],
        capture_output=True, text=True, timeout=240,
        env=subprocess_env(MLX_FLEET_HOME=str(fleet.home), COLUMNS="250", HF_HUB_OFFLINE="1",
                           HF_HOME=str(fleet.root / "coordinator-hf")),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "mlx-fleet stage test-org/cached" in done.stderr  # the stage's table, then the run
    cells = json.loads(done.stdout)["cells"]
    assert cells and all(cell["status"] == "ok" and cell["model"] == repo for cell in cells)
    refused = fleet.coordinator(
        "benchmark", "--model", str(fleet.model), "--stage", "--hostfile", str(fleet.hostfile("ok"))
    )
    assert refused.returncode == 2
    assert refused.stderr.strip().startswith("error: --stage stages Hugging Face ids")


@pytest.mark.slow
def test_an_agent_s_models_directory_is_where_its_jobs_load_from(fleet: Fleet) -> None:
    """`agent serve --models-dir DIR`: the model is staged there, and a matrix naming its id
    runs on that copy (the agent offline, its Hugging Face cache empty)."""
    hosts = str(fleet.hostfile("dir"))
    staged = fleet.coordinator("stage", str(fleet.model), "--as", "lab/in-dir", "--hostfile", hosts)
    assert staged.returncode == 0, staged.stderr
    assert list((fleet.root / "models").glob("models--lab--in-dir/snapshots/*/config.json"))
    done = fleet.coordinator(
        "benchmark", "--model", "lab/in-dir", "--hostfile", hosts, "-p", "8", "-n", "2", "-r",
        "1", "-w", "0", "-o", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    cells = json.loads(done.stdout)["cells"]
    assert cells and all(cell["status"] == "ok" for cell in cells), cells
