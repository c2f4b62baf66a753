"""Where a stage's model comes from, resolved once: a directory on this machine, or a Hugging
Face id this machine's cache holds, is served by an agent the coordinator starts for the stage
(its own data directory, every interface on an ephemeral port, trusting only this coordinator
and the stage's hosts as peers); any other id is downloaded by one host (`--from`, else the
first), which then serves it like any host that holds it."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from coordinator.hosts.link import Settings, Target
from coordinator.runs.embedded import EmbeddedAgent, EmbeddedAgentError
from coordinator.runs.staging import Origin, StageRefused
from shared.benchmark.matrix import MODEL_FILE_PATTERNS, hf_model_id
from shared.staging.fleet import chunk_size_for

LOCAL_ORG = "local"
"""The organisation a directory is staged under when --as names none: `local/FOLDER`."""
ORIGIN_HOME = "stage-origin"
ORIGIN_BIND = "0.0.0.0:0"


@dataclass(frozen=True)
class Model:
    """The model as the stage names it: `model` as asked (`ORG/NAME[@REV]`), `name` its
    repository, `path` this machine's copy (None: a host downloads it)."""

    model: str
    name: str
    path: Path | None


def resolve_model(given: str, staged_as: str | None, from_cache: bool = True) -> Model:
    """MODEL as given: a directory here (staged under `staged_as`, else local/FOLDER), or a
    Hugging Face id, from this machine's cache when it holds it and `from_cache` (else a host
    downloads it). StageRefused for anything else, one line."""
    path = Path(given).expanduser()
    if path.is_dir():
        if not from_cache:
            raise StageRefused(["--from names a host to download an id: MODEL is a directory"])
        name = staged_as or f"{LOCAL_ORG}/{_folder_name(path)}"
        model_id = hf_model_id(name)
        if model_id is None or model_id.revision is not None:
            raise StageRefused([f"--as {name!r}: name the copy ORG/NAME"])
        return Model(name, name, path.resolve())
    if path.exists():
        raise StageRefused([f"model {given}: a file, not a model directory"])
    if staged_as is not None:
        raise StageRefused(["--as names a directory's copy: MODEL is no directory here"])
    model_id = hf_model_id(given)
    if model_id is None:
        raise StageRefused(
            [f"model {given}: neither a directory here nor a Hugging Face id ORG/NAME[@REVISION]"]
        )
    cached = cached_snapshot(model_id.repo, model_id.revision) if from_cache else None
    return Model(given, model_id.repo, cached)


def _folder_name(path: Path) -> str:
    """A directory's name as a repository name allows it (letters, digits, `-_.`)."""
    cleaned = re.sub(r"[^\w.-]", "-", path.resolve().name).lstrip("-_.")
    return cleaned or "model"


def cached_snapshot(repo: str, revision: str | None) -> Path | None:
    """This machine's Hugging Face cache's snapshot of `repo` at `revision`, read offline; None
    when it holds none (or huggingface_hub is not installed)."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    except ImportError:
        return None
    try:
        folder = snapshot_download(
            repo, revision=revision, allow_patterns=MODEL_FILE_PATTERNS, local_files_only=True
        )
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        return None
    return Path(folder)


def reaching_address(address: str) -> str:
    """This machine's IP address on the route to `address` (HOST:PORT): where that host
    reaches us. No packet is sent (a UDP socket only picks its route)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    family, _, _, _, where = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(where)
        own = probe.getsockname()[0]
    return f"[{own}]" if ":" in own else own


@contextmanager
def origin_for(
    model: Model, hosts: list[Target], settings: Settings, source_host: str | None
) -> Iterator[Origin]:
    """The stage's Origin: an agent started here for a copy of this machine's (stopped after),
    else the host named by `source_host` (the first host when None), which downloads it."""
    if model.path is None:
        chosen = hosts[0] if source_host is None else _named(hosts, source_host)
        yield Origin(chosen, {"model": model.model, "download": True}, True, lambda _: "")
        return
    if settings.keypair is None:
        raise StageRefused(
            [
                "--insecure: a model on this machine is served by an agent the coordinator "
                "starts, which needs keys; stage it from a host (--from)"
            ]
        )
    peers = {target.server_key: target.address for target in hosts if target.server_key}
    agent = EmbeddedAgent(settings.keypair, "none", bind=ORIGIN_BIND, home=ORIGIN_HOME, peers=peers)
    try:
        agent.start()
    except EmbeddedAgentError as exc:
        raise StageRefused([str(exc).splitlines()[0]]) from None
    try:
        port = agent.address.rsplit(":", 1)[1]
        here = Target("origin", f"127.0.0.1:{port}", agent.server_key)
        total = sum(f.stat().st_size for f in model.path.rglob("*") if f.is_file())
        body = {
            "model": model.model,
            "path": str(model.path),
            "chunk_size": chunk_size_for(total),
        }
        yield Origin(here, body, False, lambda target: f"{reaching_address(target.address)}:{port}")
    finally:
        agent.stop()


def _named(hosts: list[Target], name: str) -> Target:
    for target in hosts:
        if name in (target.name, target.address):
            return target
    raise StageRefused([f"--from {name}: not one of --hosts"])
