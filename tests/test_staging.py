"""Staging a model agent to agent (docs/protocol.md §19) with real agents on loopback: one hashes
a generated model directory, another fetches it chunk by chunk over CURVE, verified, placed where
huggingface_hub finds it offline; a receiver killed mid-transfer resumes re-sending at most one
chunk per file; a flipped byte is found; an untrusted peer, a full disk, a bad store and an
offline download are refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq

from shared.io.keys import Keypair, new_keypair
from shared.io.transport import AgentClient, AgentError
from shared.io.trust import trust
from shared.staging.manifest import chunk_count
from tests.conftest import console_script, subprocess_env
from tests.fleet_support import AgentPool, AgentProcess, cli

pytestmark = pytest.mark.slow
CHUNK = 16 * 1024
ORG = "test-org"


def make_model(folder: Path, size: int, seed: int) -> Path:
    """A model directory in mlx-lm's layout: a config, a tokenizer and weights of `size` bytes
    (not a loadable model: what staging moves is files)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed}))
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "seed": seed}))
    (folder / "model.safetensors").write_bytes(os.urandom(size))
    return folder


@dataclass
class Fleet:
    pool: AgentPool
    root: Path
    keypair: Keypair
    ctx: zmq.Context
    source: AgentProcess
    receiver: AgentProcess

    def start(
        self, name: str, *, peers: tuple[AgentProcess, ...] = (), **options: Any
    ) -> AgentProcess:
        """An agent with its own store that trusts this test's key, and is trusted as a peer
        by each of `peers`."""
        extra = [*options.pop("options", ()), "--models-dir", str(self.pool.root / name / "store")]
        agent = self.pool.start(name, options=extra, **options)
        trust(self.keypair.public, "test", directory=agent.home / "keys" / "trusted")
        for peer in peers:
            trust(
                agent.key or "", name, directory=peer.home / "keys" / "trusted", peer=agent.address
            )
        return agent

    def client(self, agent: AgentProcess) -> AgentClient:
        client = AgentClient(self.ctx, agent.address, agent.key, self.keypair, 10.0)
        client.connect()
        return client

    def ask(self, agent: AgentProcess, type_: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.client(agent) as client:
            return client.request(type_, body, timeout=30)

    def wait(
        self,
        agent: AgentProcess,
        model: str,
        done: Callable[[dict[str, Any]], bool],
        timeout: float = 60,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.client(agent) as client:
            while True:
                tasks = client.request("stage.status", {"model": model})["tasks"]
                if tasks and done(tasks[0]):
                    return tasks[0]
                assert time.monotonic() < deadline, f"stage of {model}: {tasks}"
                assert agent.process.poll() is None, agent.log_text()
                time.sleep(0.05)

    def prepare(self, model: str, folder: Path) -> dict[str, Any]:
        self.ask(
            self.source, "stage.prepare", {"model": model, "path": str(folder), "chunk_size": CHUNK}
        )
        task = self.wait(self.source, model, lambda t: t["state"] != "hashing")
        assert task["state"] == "ready", task
        return task

    def fetch_body(self, model: str, ready: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {
            "model": model,
            "revision": ready["revision"],
            "digest": ready["digest"],
            "size": ready["total"],
            "source": self.source.address,
            "source_key": self.source.key,
        } | extra


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("staging")
    pool = AgentPool(root / "agents")
    ctx = zmq.Context()
    try:
        keypair = Keypair(*new_keypair())
        fleet = Fleet(pool, root, keypair, ctx, None, None)  # type: ignore[arg-type]
        fleet.source = fleet.start("source")
        fleet.receiver = fleet.start("receiver", peers=(fleet.source,))
        yield fleet
    finally:
        pool.kill_all()
        ctx.destroy(linger=0)


@pytest.fixture(scope="module")
def staged(fleet: Fleet) -> dict[str, Any]:
    """test-org/tiny, 3 MB, staged source -> receiver once for the module."""
    model = f"{ORG}/tiny"
    ready = fleet.prepare(model, make_model(fleet.root / "tiny", 3_000_000, 1))
    fleet.ask(fleet.receiver, "stage.fetch", fleet.fetch_body(model, ready))
    task = fleet.wait(fleet.receiver, model, lambda t: t["state"] not in ("fetching",))
    assert task["state"] == "ready", task
    return ready


def store(agent: AgentProcess, model: str = f"{ORG}/tiny") -> Path:
    return agent.home / "store" / ("models--" + model.replace("/", "--"))


def test_a_model_is_staged_verified_and_found_offline(fleet: Fleet, staged: dict[str, Any]) -> None:
    revision = staged["revision"]
    snapshot = store(fleet.receiver) / "snapshots" / revision
    source = fleet.root / "tiny"
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        assert (snapshot / name).read_bytes() == (source / name).read_bytes()
    assert (store(fleet.receiver) / "refs" / "main").read_text() == revision
    chunks = sum(chunk_count(p.stat().st_size, CHUNK) for p in source.iterdir())
    source_task = fleet.wait(fleet.source, f"{ORG}/tiny", lambda t: True)
    assert source_task["served"] == chunks  # each chunk crossed once
    found = subprocess.run(
        [
            str(Path(console_script("agent")).with_name("python")),
            "-c",
            "from huggingface_hub import snapshot_download as s; print(s('test-org/tiny'))",
        ],
        capture_output=True,
        text=True,
        env=subprocess_env(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(fleet.receiver.home / "store")),
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(snapshot)
    listed = cli(
        "agent", "models", "list", "-o", "json", "--models-dir", str(fleet.receiver.home / "store")
    )
    assert listed.returncode == 0, listed.stderr
    (model,) = json.loads(listed.stdout)["models"]
    assert (model["state"], model["digest"], model["refs"]) == (
        "present",
        staged["digest"],
        ["main"],
    )
    again = fleet.ask(fleet.receiver, "stage.fetch", fleet.fetch_body(f"{ORG}/tiny", staged))
    assert again["state"] == "ready"  # held with that digest: nothing moves
