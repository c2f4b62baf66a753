"""Staging a model agent to agent (docs/protocol.md §19) with real agents on loopback: one hashes
a generated model directory, another fetches it chunk by chunk over CURVE, verified, placed where
huggingface_hub finds it offline; a receiver killed mid-transfer resumes re-sending at most one
chunk per file; a flipped byte is found; an untrusted peer, a full disk, a bad store and an
offline download are refused."""

from __future__ import annotations

import contextlib
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
from tests.disk_support import mounted_tmpfs
from tests.fleet_support import AgentPool, AgentProcess, cli

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("staging")]
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


def source_served(fleet: Fleet, model: str) -> int:
    return fleet.wait(fleet.source, model, lambda t: True)["served"]


def test_a_flipped_byte_is_found_and_restaged_only_when_asked(fleet: Fleet) -> None:
    model = f"{ORG}/flip"
    ready = fleet.prepare(model, make_model(fleet.root / "flip", 200_000, 2))
    fleet.ask(fleet.receiver, "stage.fetch", fleet.fetch_body(model, ready))
    assert fleet.wait(fleet.receiver, model, lambda t: t["state"] != "fetching")["state"] == "ready"
    weights = store(fleet.receiver, model) / "snapshots" / ready["revision"] / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.seek(100_000)
        byte = handle.read(1)
        handle.seek(100_000)
        handle.write(bytes([byte[0] ^ 0x01]))
    listed = fleet.ask(fleet.receiver, "models.list", {})["models"]
    (held,) = [m for m in listed if m["model"] == model]
    assert held["state"] == "mismatch"
    assert held["error"].startswith("model.safetensors differs")
    fleet.ask(fleet.receiver, "stage.fetch", fleet.fetch_body(model, ready))
    task = fleet.wait(fleet.receiver, model, lambda t: t["state"] != "fetching")
    assert task["state"] == "failed" and task["error"].startswith(f"mismatch: {model}@")
    assert "model.safetensors differs" in task["error"]
    fleet.ask(fleet.receiver, "stage.fetch", fleet.fetch_body(model, ready, restage=True))
    task = fleet.wait(fleet.receiver, model, lambda t: t["state"] != "fetching")
    assert task["state"] == "ready", task
    assert weights.read_bytes() == (fleet.root / "flip" / "model.safetensors").read_bytes()
    body = {"model": model, "path": str(fleet.root / "flip"), "chunk_size": 2 * CHUNK}
    fleet.ask(fleet.source, "stage.prepare", body)  # the same bytes at another chunk size
    other = fleet.wait(fleet.source, model, lambda t: t["state"] != "hashing")
    assert other["digest"] != ready["digest"] and other["revision"] == ready["revision"]
    fleet.ask(fleet.receiver, "stage.fetch", fleet.fetch_body(model, other))
    task = fleet.wait(fleet.receiver, model, lambda t: t["state"] != "fetching")
    assert (task["state"], task["digest"]) == ("ready", other["digest"])
    assert source_served(fleet, model) == 0  # hashed again there: no byte moved


@contextlib.contextmanager
def busy(fleet: Fleet, agent: AgentProcess) -> Iterator[None]:
    """An `agent run` job on `agent` for the block: it stages under its rate cap meanwhile."""
    job = subprocess.Popen(
        [console_script("agent"), "run", "--", "sleep", "120"],
        env=subprocess_env(MLX_FLEET_HOME=str(agent.home)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not fleet.ask(agent, "info", {})["jobs"]:  # the job is the agent's to know
            assert time.monotonic() < deadline and job.poll() is None, "agent run never ran"
            time.sleep(0.1)
        yield
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def test_a_host_still_fetching_serves_what_it_verified(fleet: Fleet) -> None:
    """The tree's follower (shared/staging/tree.py): the receiver fetches from a seed that is
    itself still fetching, chunk by chunk as the seed verifies them; the source sends one
    copy."""
    model = f"{ORG}/followed"
    folder = make_model(fleet.root / "followed", 1_000_000, 5)
    ready = fleet.prepare(model, folder)
    seed = fleet.start("seed", peers=(fleet.source,), options=["--stage-busy-rate", "0.5"])
    trust(fleet.receiver.key or "", "r", directory=seed.home / "keys" / "trusted", peer="x:1")
    with busy(fleet, seed):
        fleet.ask(seed, "stage.fetch", fleet.fetch_body(model, ready))
        fleet.wait(seed, model, lambda t: t["bytes"] > 0)
        from_seed = {"source": seed.address, "source_key": seed.key}
        fleet.ask(fleet.receiver, "stage.fetch", fleet.fetch_body(model, ready, **from_seed))
        followed = fleet.wait(fleet.receiver, model, lambda t: t["state"] != "fetching")
        seeded = fleet.wait(seed, model, lambda t: t["state"] != "fetching")
    assert (followed["state"], seeded["state"], followed["source"]) == (
        "ready",
        "ready",
        seed.address,
    )
    assert followed["started"] < seeded["finished"]  # it followed: the seed had not finished
    capped_s = 0.9 * ready["total"] / 0.5e6  # a job ran on the seed: 0.5 MB/s at most
    assert seeded["finished"] - seeded["started"] >= capped_s
    snapshot = store(fleet.receiver, model) / "snapshots" / ready["revision"]
    for path in folder.iterdir():
        assert (snapshot / path.name).read_bytes() == path.read_bytes()
    chunks = sum(chunk_count(path.stat().st_size, CHUNK) for path in folder.iterdir())
    assert source_served(fleet, model) == chunks  # one copy left the source
    assert seeded["served"] == chunks  # and the seed passed each chunk on once


def test_a_receiver_killed_mid_transfer_resumes_resending_at_most_a_chunk_per_file(
    fleet: Fleet,
) -> None:
    """The receiver fetches under the rate cap (an `agent run` job runs on it), is cancelled,
    fetches again, is SIGKILLed a quarter of the way, and is started again: the source serves
    every chunk once, plus at most the one in flight of each file at each cut."""
    model = f"{ORG}/resumed"
    folder = make_model(fleet.root / "resumed", 2_000_000, 3)
    ready = fleet.prepare(model, folder)
    receiver = fleet.start("resumer", peers=(fleet.source,), options=["--stage-busy-rate", "0.4"])
    with busy(fleet, receiver):
        fleet.ask(receiver, "stage.fetch", fleet.fetch_body(model, ready))
        fleet.wait(receiver, model, lambda t: t["bytes"] > 0.1 * ready["total"])
        fleet.ask(receiver, "stage.cancel", {"model": model})
        cancelled = fleet.wait(receiver, model, lambda t: t["state"] != "fetching")
        assert cancelled["state"] == "cancelled" and cancelled["bytes"] < ready["total"]
        fleet.ask(receiver, "stage.fetch", fleet.fetch_body(model, ready))  # resumed
        task = fleet.wait(
            receiver, model, lambda t: t["capped"] and t["bytes"] > 0.25 * ready["total"]
        )
        assert task["state"] == "fetching" and task["bytes"] < ready["total"]
        assert task["resumed"] >= cancelled["bytes"]
    receiver.kill()
    listed = cli(
        "agent", "models", "list", "-o", "json", "--models-dir", str(receiver.home / "store")
    )
    (partial,) = json.loads(listed.stdout)["models"]
    assert partial["state"] == "partial" and 0 < partial["bytes"] < partial["size"]
    again = fleet.pool.start(
        "resumer-again", home=receiver.home, options=["--models-dir", str(receiver.home / "store")]
    )
    fleet.ask(again, "stage.fetch", fleet.fetch_body(model, ready))
    task = fleet.wait(again, model, lambda t: t["state"] != "fetching")
    assert task["state"] == "ready", task
    assert task["resumed"] >= partial["bytes"] > 0
    snapshot = store(again, model) / "snapshots" / ready["revision"]
    for path in folder.iterdir():
        assert (snapshot / path.name).read_bytes() == path.read_bytes()
    chunks = sum(chunk_count(path.stat().st_size, CHUNK) for path in folder.iterdir())
    served = source_served(fleet, model)
    assert chunks <= served <= chunks + 2 * len(list(folder.iterdir()))  # a cancel and a kill
    removed = fleet.ask(again, "models.remove", {"model": model})["removed"]
    assert removed == [f"{model}@{ready['revision']}"]
    assert fleet.ask(again, "models.list", {})["models"] == []


def test_an_untrusted_peer_cannot_fetch(fleet: Fleet) -> None:
    model = f"{ORG}/tiny-untrusted"
    ready = fleet.prepare(model, make_model(fleet.root / "untrusted", 10_000, 4))
    stranger = fleet.start("stranger")  # the source does not trust its key
    fleet.ask(stranger, "stage.fetch", fleet.fetch_body(model, ready))
    task = fleet.wait(stranger, model, lambda t: t["state"] != "fetching")
    assert task["state"] == "failed"
    assert "refused this agent's key" in task["error"], task
    assert source_served(fleet, model) == 0
    with pytest.raises(AgentError) as refused:  # nor does it trust the source as a peer
        fleet.ask(stranger, "stage.fetch", fleet.fetch_body(model, ready, source_key=None))
    assert refused.value.code == "untrusted-peer"


def test_a_peer_key_may_read_a_model_but_not_drive_the_agent(fleet: Fleet) -> None:
    """The receiver's own agent key (trusted by the source as a peer) asks the source."""
    import zmq.auth

    public, secret = zmq.auth.load_certificate(fleet.receiver.home / "keys" / "self.key_secret")
    assert secret is not None
    peer = Keypair(public.decode(), secret.decode())
    with AgentClient(fleet.ctx, fleet.source.address, fleet.source.key, peer, 10.0) as client:
        client.connect()
        with pytest.raises(AgentError) as refused:
            client.request("stage.prepare", {"model": f"{ORG}/x", "path": "/"})
        assert refused.value.code == "forbidden"
        with pytest.raises(AgentError) as unknown:
            client.request("stage.manifest", {"digest": "0" * 64})
        assert unknown.value.code == "not-held"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (this test runs as root)."""
    with mounted_tmpfs(tmp_path / "small", "size=1m") as mount:
        yield mount


def test_a_disk_too_small_and_an_offline_download_are_refused_before_anything_moves(
    fleet: Fleet, staged: dict[str, Any], small_disk: Path
) -> None:
    agent = fleet.pool.start(
        "small",
        options=["--models-dir", str(small_disk / "store")],
        wrapper=["env", "HF_HUB_OFFLINE=1"],
    )
    trust(fleet.keypair.public, "test", directory=agent.home / "keys" / "trusted")
    with pytest.raises(AgentError) as refused:
        fleet.ask(agent, "stage.fetch", fleet.fetch_body(f"{ORG}/tiny", staged))
    assert refused.value.code == "no-space"
    assert str(refused.value) == (
        f"no room for {ORG}/tiny (3.0 MB + 268.6 MB margin): 1.0 MB free on {small_disk}/store"
    )
    assert list(small_disk.iterdir()) == []  # nothing written
    with pytest.raises(AgentError) as offline:
        fleet.ask(agent, "stage.prepare", {"model": f"{ORG}/absent", "download": True})
    assert offline.value.code == "bad-model"
    assert "HF_HUB_OFFLINE=1" in str(offline.value)
    # Room for a 1-byte model and the margin, not for the 3 MB the manifest then says: the
    # transfer is refused once the manifest arrives, before any chunk moves.
    remount = ["mount", "-o", "remount,size=257m", str(small_disk)]
    subprocess.run(remount, check=True, capture_output=True)
    trust(agent.key or "", "small", directory=fleet.source.home / "keys" / "trusted", peer="x:1")
    fleet.ask(agent, "stage.fetch", fleet.fetch_body(f"{ORG}/tiny", staged, size=1))
    task = fleet.wait(agent, f"{ORG}/tiny", lambda t: t["state"] != "fetching")
    assert task["state"] == "failed" and task["error"].startswith(f"no room for {ORG}/tiny (3.0 MB")
    assert task["bytes"] == 0


def test_bad_input_is_refused_in_one_line(fleet: Fleet, staged: dict[str, Any]) -> None:
    tiny = fleet.fetch_body(f"{ORG}/tiny", staged)
    cases: list[tuple[str, dict[str, Any], str, str]] = [
        ("stage.prepare", {"model": "no-org"}, "bad-model", "is not a Hugging Face id"),
        ("stage.prepare", {"model": f"{ORG}/x", "path": "/nonexistent"}, "bad-model", "not a dir"),
        ("stage.prepare", {"model": f"{ORG}/absent"}, "bad-model", "not in the Hugging Face cache"),
        ("stage.prepare", {"model": f"{ORG}/x", "chunk_size": 10}, "bad-body", "chunk size"),
        ("stage.fetch", tiny | {"revision": "main"}, "bad-model", "not a 40-hex-digit commit"),
        ("stage.fetch", tiny | {"source": "nohost"}, "bad-body", "is not HOST:PORT"),
        ("stage.fetch", tiny | {"digest": "x"}, "bad-body", "not 64 hex digits"),
        ("stage.cancel", {"model": f"{ORG}/never"}, "not-held", "no staging"),
        ("models.remove", {"model": f"{ORG}/never"}, "not-held", "nothing of"),
        (
            "stage.chunk",
            {"digest": staged["digest"], "path": "x", "index": 0},
            "bad-body",
            "no file",
        ),
        ("stage.chunk", {"digest": "0" * 64, "path": "x", "index": 0}, "not-held", "no model"),
    ]
    for type_, body, code, words in cases:
        with pytest.raises(AgentError) as refused:
            fleet.ask(fleet.source, type_, body)
        assert (refused.value.code, words in str(refused.value)) == (code, True), (type_, body)
        assert "\n" not in str(refused.value)
