"""One transfer of a model from a peer agent (docs/protocol.md §19, The transfer): the manifest
read page by page and checked against the digest asked for, then up to PARALLEL_FILES files at
once, each with one chunk in flight, every chunk's hash checked before it is written and
recorded, every file checked whole before the model is placed. Runs on its task's thread with
its own DEALER (the agent's own keypair, which the source trusts as a peer's)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from agent.staging.partial import PartialTransfer
from shared.io.keys import Keypair
from shared.io.transport import AgentClient, AgentError, HostError
from shared.staging.manifest import (
    FileEntry,
    FileHasher,
    Manifest,
    ManifestError,
    chunk_hash,
    manifest_from_wire,
)
from shared.wire import protocol as p

PARALLEL_FILES = 2
CHUNK_TIMEOUT_S = 30.0
TRIES = 3
"""A chunk is asked at most this often (a timeout, a bad hash) before the transfer fails."""
CONNECT_TIMEOUT_S = 10.0
POLL_S = 0.2


class TransferFailed(Exception):
    """The transfer cannot go on: one line naming the source and what went wrong."""


class Cancelled(Exception):
    """stage.cancel, or the agent stopping."""


@dataclass
class Progress:
    """What the task shows, updated from the transfer's thread."""

    fetched: Callable[[int], None]
    """Told each verified chunk's bytes."""
    file_done: Callable[[], None]
    capped: Callable[[bool], None]


@dataclass
class FileFetch:
    entry: FileEntry
    hasher: FileHasher
    next: int
    request: str | None = None
    sent_at: float = 0.0
    tries: int = 0
    refetched: bool = False


@dataclass
class Pacer:
    """The rate cap while a job runs here: a chunk may be asked for only once the bytes before
    it have had their time at `rate` bytes/s."""

    busy: Callable[[], bool]
    rate: float
    allowed_at: float = field(default=0.0)

    def wait(self, cancelled: threading.Event, progress: Progress) -> None:
        capped = self.busy()
        progress.capped(capped)
        if not capped:
            self.allowed_at = 0.0
            return
        while (left := self.allowed_at - time.monotonic()) > 0:
            if cancelled.wait(min(left, POLL_S)):
                raise Cancelled()

    def took(self, size: int) -> None:
        if self.busy():
            self.allowed_at = max(self.allowed_at, time.monotonic()) + size / self.rate


def connect(ctx: zmq.Context, source: str, key: str | None, keypair: Keypair | None) -> AgentClient:
    """A DEALER to the source's command socket, greeted (CURVE with this agent's own keypair
    when `key`, the source's server key, is given); TransferFailed saying why not."""
    client = AgentClient(ctx, source, key, keypair if key else None, CONNECT_TIMEOUT_S)
    try:
        client.connect()
    except HostError as exc:
        client.close()
        text = str(exc)
        if "refused our key" in text and keypair is not None:
            text = (
                f"refused this agent's key: the source does not trust it; there run: agent keys "
                f"trust '{keypair.public}' --peer THIS_HOST:PORT"
            )
        raise TransferFailed(f"source {source}: {text}") from None
    return client


def read_manifest(client: AgentClient, digest: str, cancelled: threading.Event) -> Manifest:
    """Every page of the source's manifest, checked whole against `digest`."""
    head: dict[str, Any] | None = None
    files: list[dict[str, Any]] = []
    offset: int | None = 0
    while offset is not None:
        if cancelled.is_set():
            raise Cancelled()
        page = ask(client, "stage.manifest", {"digest": digest, "offset": offset})
        if page["offset"] != offset or page["digest"] != digest:
            raise TransferFailed(
                f"source {client.address} answered stage.manifest for offset {page['offset']} "
                f"of {page['digest']}, not {offset} of {digest}"
            )
        this = {key: page[key] for key in ("format", "model", "revision", "chunk_size")}
        if head is not None and this != head:
            raise TransferFailed(f"source {client.address}: its manifest pages disagree")
        head = this
        files += page["files"]
        following = page["next"]
        if following is not None and following != offset + len(page["files"]):
            raise TransferFailed(f"source {client.address}: manifest page {offset} skips files")
        offset = following
    assert head is not None
    try:
        return manifest_from_wire({**head, "files": files}, digest)
    except ManifestError as exc:
        raise TransferFailed(f"source {client.address} sent a bad {exc}") from None


def ask(client: AgentClient, type_: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        return client.request(type_, body, timeout=CHUNK_TIMEOUT_S)
    except AgentError as exc:
        raise TransferFailed(f"source {client.address} refused {type_}: {exc}") from None
    except HostError as exc:
        raise TransferFailed(f"source {client.address}: {exc}") from None


class Transfer:
    """The chunks of `partial`'s manifest not yet verified, from `client`'s agent."""

    def __init__(
        self,
        client: AgentClient,
        partial: PartialTransfer,
        pacer: Pacer,
        progress: Progress,
        cancelled: threading.Event,
    ) -> None:
        self.client = client
        self.partial = partial
        self.manifest = partial.manifest
        self.pacer = pacer
        self.progress = progress
        self.cancelled = cancelled
        self.waiting = [e for e in self.manifest.files]
        self.active: dict[str, FileFetch] = {}
        """By file path."""
        self.by_request: dict[str, FileFetch] = {}

    def run(self) -> None:
        while self.waiting or self.active:
            if self.cancelled.is_set():
                raise Cancelled()
            while self.waiting and len(self.active) < PARALLEL_FILES:
                self._open(self.waiting.pop(0))
            for fetch in list(self.active.values()):
                if fetch.request is None:
                    self._ask(fetch)
                elif time.monotonic() - fetch.sent_at > CHUNK_TIMEOUT_S:
                    self._again(fetch, f"no answer within {CHUNK_TIMEOUT_S:g} s")
            try:
                message = self.client.receive(POLL_S)
            except HostError as exc:
                raise TransferFailed(f"source {self.client.address}: {exc}") from None
            if message is not None:
                self._take(message)

    def _open(self, entry: FileEntry) -> None:
        hasher, first = self.partial.resume(entry.path)
        fetch = FileFetch(entry, hasher, first)
        if first == len(entry.chunks):
            self._close(fetch)
        else:
            self.active[entry.path] = fetch

    def _ask(self, fetch: FileFetch) -> None:
        self.pacer.wait(self.cancelled, self.progress)
        body = {"digest": self.manifest.digest, "path": fetch.entry.path, "index": fetch.next}
        fetch.request = self.client.send("stage.chunk", body).id
        fetch.sent_at = time.monotonic()
        fetch.tries += 1
        self.by_request[fetch.request] = fetch

    def _again(self, fetch: FileFetch, why: str) -> None:
        """Ask the chunk again, or fail once it was asked TRIES times."""
        if fetch.request is not None:
            self.by_request.pop(fetch.request, None)
        fetch.request = None
        if fetch.tries >= TRIES:
            raise TransferFailed(
                f"chunk {fetch.next} of {fetch.entry.path} from {self.client.address} failed "
                f"{TRIES} times ({why})"
            )

    def _take(self, message: p.Message) -> None:
        fetch = self.by_request.pop(message.re or "", None)
        if fetch is None:
            return  # the answer to a request asked again since: its copy is on its way
        fetch.request = None
        if message.type == "error":
            code, text = message.body["code"], message.body["message"]
            if code == p.NOT_YET:
                fetch.tries -= 1  # the source is still fetching it: not a failed try
                return
            raise TransferFailed(f"source {self.client.address} refused a chunk: {code}: {text}")
        body = message.body
        if message.type != "stage.chunk.ok" or (body["path"], body["index"]) != (
            fetch.entry.path,
            fetch.next,
        ):
            raise TransferFailed(
                f"source {self.client.address} answered chunk {fetch.next} of "
                f"{fetch.entry.path} with {message.type} {body.get('path')!r} {body.get('index')}"
            )
        data = body["data"]
        _, length = self.manifest.chunk_span(fetch.entry.path, fetch.next)
        if len(data) != length or chunk_hash(data) != fetch.entry.chunks[fetch.next]:
            self._again(fetch, "its bytes do not match the manifest's hash")
            return
        self.partial.write(fetch.entry.path, fetch.next, data)
        fetch.hasher.update(data)
        self.progress.fetched(length)
        self.pacer.took(length)
        fetch.next += 1
        fetch.tries = 0
        if fetch.next == len(fetch.entry.chunks):
            self._close(fetch)

    def _close(self, fetch: FileFetch) -> None:
        """A file whose every chunk is verified: checked whole, or fetched once more."""
        path = fetch.entry.path
        if fetch.hasher.finish(path).sha256 != fetch.entry.sha256:
            if fetch.refetched:
                raise TransferFailed(
                    f"{path} from {self.client.address} does not match its sha256 though every "
                    "chunk did: the manifest is inconsistent"
                )
            self.partial.forget(path)
            hasher, first = self.partial.resume(path)
            self.active[path] = FileFetch(fetch.entry, hasher, first, refetched=True)
            return
        self.active.pop(path, None)
        self.progress.file_done()
