"""A fake `agent serve`, written from docs/protocol.md alone (its own pyzmq and msgpack, none of
mlx-fleet's code), to drive a real coordinator through what a real agent does too rarely to
test on demand:

- `flaps`: its ROUTER closes and binds again on the same port, that many times over `flap_s`
  seconds (an agent whose interface drops and comes back, a Mac roaming between access points),
  while its job goes on. The job's stream goes to the ROUTER identity that sent bench.start;
  once that connection is gone the stream is dropped (ROUTER semantics, §5 "Streams go to the
  ROUTER identity that sent bench.start") and only `job.get` (its journal) has the cells.
- `stall_after`: after that many cells the job never progresses again (a wedged job process),
  while `ping.ok` still names it and `info.ok` lists it `running`.
- `drop_cells` / `drop_done`: those cells, or the bench.done, are journaled but never reach
  the stream (a ROUTER past its high-water mark drops what it cannot queue), with no
  reconnection to tell.
- `pause_after` / `pause_s`: after that many cells the job's cooling policy pauses it for
  `pause_s` seconds: `info.ok` `jobs[].state` is `paused` (§10, §12), no cell comes, then the
  job goes on.

It answers hello, ping, info, bench.start (one job at a time), bench.cancel, job.get (every
record from `offset` in one page) and job.list; anything else is `unknown-type`. The matrix it
takes is one model's `n_prompt` and `n_gen` tests (batch 1, depth 0), named as §5 "The matrix"
names cells. Runs in a thread of the test: start(), then stop().
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import msgpack
import zmq

VERSION = 4
Reply = tuple[str, dict[str, Any]]
POLICY = {
    "max_speed_temp": 75.0,
    "pause_temp": 85.0,
    "stop_temp": 95.0,
    "pause_duration": 0.5,
    "hysteresis": 0.0,
}
"""§11: five finite numbers in order (the seed's defaults)."""


def new_id() -> str:
    return os.urandom(8).hex()


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(int(epoch), timezone.utc).isoformat()


def envelope(type_: str, body: dict[str, Any], re: str | None) -> bytes:
    return msgpack.packb({"v": VERSION, "id": new_id(), "type": type_, "re": re, "body": body})


@dataclass
class FakeJob:
    id: str
    request: str
    identity: bytes
    spec: dict[str, Any]
    cells: list[dict[str, Any]]
    """Each cell's coordinates: model, n_prompt, n_gen, test, name."""
    started: float
    records: list[dict[str, Any]] = field(default_factory=list)
    state: str = "running"
    finished: float | None = None
    paused_until: float | None = None
    paused_once: bool = False
    next_cell_at: float = 0.0


class FlappingRouter:
    """The ROUTER socket and its flap: closed, down for `down_s`, bound again on the same port
    (when it flaps, `flaps` times over `flap_s`, is the job's: FlappingAgent); and what is sent
    on it. FlappingAgent.__init__ sets the state."""

    port: int
    down_s: float
    flapped: int
    job: FakeJob | None
    _ctx: zmq.Context
    _sock: zmq.Socket | None

    def _bind(self) -> None:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.linger = 0
        if not self.port:
            self.port = sock.bind_to_random_port("tcp://127.0.0.1")
        else:
            deadline = time.monotonic() + 5
            while True:  # the old listener is closed by ZeroMQ's I/O thread, a moment later
                try:
                    sock.bind(f"tcp://127.0.0.1:{self.port}")
                    break
                except zmq.ZMQError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.005)
        self._sock = sock

    def _flap(self) -> None:
        """Close the ROUTER (every connection and the identities it knew go with it), stay down
        for down_s, bind again on the same port."""
        assert self._sock is not None
        self._sock.close(linger=0)
        self._sock = None
        time.sleep(self.down_s)
        self._bind()
        self.flapped += 1

    def _send(self, identity: bytes, type_: str, body: dict[str, Any], re: str | None) -> None:
        assert self._sock is not None
        # An identity this ROUTER does not know (a connection gone) is dropped without a word.
        self._sock.send_multipart([identity, envelope(type_, body, re)])

    def _stream(self, type_: str, body: dict[str, Any]) -> None:
        assert self.job is not None
        self._send(self.job.identity, type_, {"job": self.job.id, **body}, self.job.request)


class FlappingRequests(FlappingRouter):
    """The requests it answers (hello, ping, info, bench.start, bench.cancel, job.get, job.list),
    each from the job as it stands: info.ok lists a job paused by `pause_after` as `paused`, and
    ping.ok and info.ok still name a job wedged by `stall_after`."""

    cell_s: float
    requests: Counter[str]
    infos_while_paused: int

    def _answer(self, identity: bytes, data: bytes) -> None:
        try:
            message = msgpack.unpackb(data, raw=False)
            type_, body, request_id = message["type"], message["body"], message["id"]
        except (ValueError, KeyError, TypeError, msgpack.UnpackException):
            self._send(identity, "error", {"code": "malformed", "message": "not a message"}, None)
            return
        self.requests[type_] += 1
        handler = getattr(self, "_on_" + type_.replace(".", "_"), None)
        if handler is None:
            reply = ("error", {"code": "unknown-type", "message": f"no type {type_!r}"})
        else:
            reply = handler(identity, request_id, body)
        self._send(identity, *reply, request_id)
        if type_ == "bench.start" and reply[0] == "bench.start.ok":
            assert self.job is not None
            total = len(self.job.cells)
            self._stream("bench.progress", {"done": 0, "total": total, "model": None})
            model = {"model": self.job.cells[0]["model"], "label": "small/f16", "bits": 16}
            self._stream("bench.progress", {"done": 0, "total": total, "model": model})

    def _running(self) -> FakeJob | None:
        return self.job if self.job is not None and self.job.state == "running" else None

    def _on_hello(self, identity: bytes, re: str, body: dict[str, Any]) -> Reply:
        return "hello.ok", {
            "agent": "fake-flapping-agent",
            "protocol": VERSION,
            "hostname": "fake",
            "secure": False,
        }

    def _on_ping(self, identity: bytes, re: str, body: dict[str, Any]) -> Reply:
        job = self._running()
        return "ping.ok", {"job": job.id if job else None, "time": time.time()}

    def _on_info(self, identity: bytes, re: str, body: dict[str, Any]) -> Reply:
        job = self._running()
        listed = []
        if job is not None:
            paused = job.paused_until is not None
            self.infos_while_paused += paused
            listed.append(
                {
                    "job": job.id,
                    "pid": 4242,
                    "command": f"benchmark: {len(job.cells)} cells",
                    "state": "paused" if paused else "running",
                    "kind": "bench",
                }
            )
        return "info.ok", {
            "agent": "fake-flapping-agent",
            "protocol": VERSION,
            "name": "fake",
            "machine": {"hostname": "fake", "chip": None, "memory_gb": None},
            "thermal": {"source": "none", "simulated": False, "reading": None, "error": None},
            "power": {
                "source": "none",
                "simulated": False,
                "rails": [],
                "resolution_s": None,
                "reading": None,
                "error": "no power meter",
            },
            "job": None
            if job is None
            else {
                "id": job.id,
                "done": len(job.records),
                "total": len(job.cells),
                "started": rfc3339(job.started),
            },
            "telemetry_port": self.port + 1 if self.port < 65535 else 1,
            "poll_interval": 1.0,
            "policy": POLICY,
            "policy_origin": "the seed's defaults",
            "jobs": listed,
            "history": "h-fake",
            "storage": {"ok": True, "failing": []},
        }

    def _on_bench_start(self, identity: bytes, re: str, body: dict[str, Any]) -> Reply:
        running = self._running()
        if running is not None:
            return "error", {"code": "busy", "message": f"busy: job {running.id} runs"}
        try:
            cells = cells_of(body["matrix"])
        except (ValueError, KeyError, TypeError) as exc:
            return "error", {"code": "bad-matrix", "message": str(exc)}
        job = FakeJob(f"j-{new_id()[:12]}", re, identity, body["matrix"], cells, time.time())
        job.next_cell_at = time.monotonic() + self.cell_s
        self.job = job
        return "bench.start.ok", {"job": job.id, "cells": [c["name"] for c in cells]}

    def _on_bench_cancel(self, identity: bytes, re: str, body: dict[str, Any]) -> Reply:
        job = self.job
        if job is None or job.id != body.get("job"):
            return "error", {"code": "unknown-job", "message": "no such job"}
        if job.state != "running":
            return "error", {"code": "not-running", "message": f"job is {job.state}"}
        job.state, job.finished = "cancelled", time.time()
        self._stream(
            "bench.done", {"status": "cancelled", "error": None, "cells": len(job.records)}
        )
        return "bench.cancel.ok", {"job": job.id}

    def _on_job_get(self, identity: bytes, re: str, body: dict[str, Any]) -> Reply:
        job = self.job
        if job is None or job.id != body.get("job"):
            return "error", {"code": "unknown-job", "message": "no such job"}
        offset = body.get("offset") or 0
        return "job.get.ok", {
            "job": job.id,
            "state": job.state,
            "error": None,
            "spec": job.spec,
            "models": [{"model": job.cells[0]["model"], "label": "small/f16", "bits": 16}],
            "records": job.records[offset:],
            "offset": offset,
            "next": None,
            "started": rfc3339(job.started),
            "finished": None if job.finished is None else rfc3339(job.finished),
        }

    def _on_job_list(self, identity: bytes, re: str, body: dict[str, Any]) -> Reply:
        jobs = []
        if self.job is not None:
            job = self.job
            jobs.append(
                {
                    "job": job.id,
                    "request": job.request,
                    "state": job.state,
                    "total": len(job.cells),
                    "done": len(job.records),
                    "error": None,
                    "started": rfc3339(job.started),
                    "finished": None if job.finished is None else rfc3339(job.finished),
                }
            )
        return "job.list.ok", {"jobs": jobs}


class FlappingAgent(FlappingRequests):
    """See the module's docstring; `port` is known once start() returns. The job's pace and what
    it does to it (`stall_after`, `pause_after`/`pause_s`, `drop_cells`, `drop_done`, and when
    the flaps begin) are here, with its thread and loop; the flapping socket is FlappingRouter's,
    the answers FlappingRequests'."""

    def __init__(
        self,
        cell_s: float = 0.2,
        flaps: int = 0,
        flap_s: float = 8.0,
        flap_after: int = 2,
        down_s: float = 0.04,
        stall_after: int | None = None,
        pause_after: int | None = None,
        pause_s: float = 0.0,
        drop_cells: frozenset[int] | set[int] = frozenset(),
        drop_done: bool = False,
    ) -> None:
        self.cell_s, self.flaps, self.flap_s, self.flap_after = cell_s, flaps, flap_s, flap_after
        self.down_s = down_s
        self.stall_after, self.pause_after, self.pause_s = stall_after, pause_after, pause_s
        self.drop_cells, self.drop_done = drop_cells, drop_done
        self.port = 0
        self.requests: Counter[str] = Counter()
        """Requests received, by type."""
        self.flapped = 0
        self.ended_at: float | None = None
        """time.monotonic() when the job journaled its last cell."""
        self.job: FakeJob | None = None
        self.infos_while_paused = 0
        self._flap_at: list[float] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._ctx = zmq.Context()
        self._sock: zmq.Socket | None = None
        self._thread = threading.Thread(target=self._run, name="flapping agent", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FlappingAgent:
        self._thread.start()
        assert self._ready.wait(10), "the fake agent did not bind"
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._ctx.destroy(linger=0)

    # --- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        self._bind()
        self._ready.set()
        while not self._stop.is_set():
            now = time.monotonic()
            if self._flap_at and now >= self._flap_at[0]:
                self._flap_at.pop(0)
                self._flap()
            self._advance(now)
            assert self._sock is not None
            if self._sock.poll(10):
                frames = self._sock.recv_multipart()
                if len(frames) == 2:
                    self._answer(frames[0], frames[1])
        if self._sock is not None:
            self._sock.close(linger=0)

    def _advance(self, now: float) -> None:
        """The job's next cell, when it is due and the job neither stalls nor pauses."""
        job = self.job
        if job is None or job.state != "running":
            return
        done = len(job.records)
        if job.paused_until is not None:
            if now < job.paused_until:
                return
            job.paused_until = None
            job.next_cell_at = now + self.cell_s
        if done == self.pause_after and self.pause_s and not job.paused_once:
            job.paused_once = True
            job.paused_until = now + self.pause_s
            return
        if self.stall_after is not None and done >= self.stall_after:
            return
        if now < job.next_cell_at:
            return
        cell = job.cells[done]
        record = measured(cell)
        job.records.append(record)
        job.next_cell_at = now + self.cell_s
        if done not in self.drop_cells:
            self._stream("bench.cell", {"index": done, "record": record})
        if done + 1 == self.flap_after and self.flaps:
            step = self.flap_s / self.flaps
            self._flap_at = [now + step * (k + 1) for k in range(self.flaps)]
        if len(job.records) == len(job.cells):
            job.state, job.finished = "ok", time.time()
            self.ended_at = time.monotonic()
            if not self.drop_done:
                done_body = {"status": "ok", "error": None, "cells": len(job.records)}
                self._stream("bench.done", done_body)


def cells_of(matrix: dict[str, Any]) -> list[dict[str, Any]]:
    """The pp tests then the tg tests of one model at batch 1, depth 0 (§5 "The matrix")."""
    (model,) = matrix["models"]
    tests = [(n, 0) for n in matrix.get("n_prompt", [512]) if n] + [
        (0, n) for n in matrix.get("n_gen", [128]) if n
    ]
    cells = []
    for n_prompt, n_gen in tests:
        test = f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"
        cells.append(
            {
                "model": model,
                "n_prompt": n_prompt,
                "n_gen": n_gen,
                "test": test,
                "name": f"{model}/f16 {test} b1",
            }
        )
    return cells


def measured(cell: dict[str, Any]) -> dict[str, Any]:
    """A measured cell's record (§5 Cell records): one iteration of 10 ms."""
    tokens = cell["n_prompt"] + cell["n_gen"]
    return {
        "model": cell["model"],
        "bits": 16,
        "n_prompt": cell["n_prompt"],
        "n_gen": cell["n_gen"],
        "n_depth": 0,
        "batch_size": 1,
        "mode": "decode" if cell["n_gen"] else "prefill",
        "test": cell["test"],
        "name": cell["name"],
        "status": "ok",
        "error": None,
        "test_time": rfc3339(time.time()),
        "tokens_per_sec": tokens / 0.01,
        "std_tokens_per_sec": None,
        "latency_ms": 10.0,
        "std_latency_ms": None,
        "min_latency_ms": 10.0,
        "median_latency_ms": 10.0,
        "samples_ms": [10.0],
        "samples_tokens_per_sec": [tokens / 0.01],
        "peak_memory_gb": 0.01,
        "active_memory_gb": 0.01,
        "soc_temp_start_c": None,
        "soc_temp_end_c": None,
        "soc_temp_c": None,
        "pressure_start": None,
        "pressure_end": None,
        "pause_s": 0.0,
        "flags": [],
        "thermal_source": None,
    }
