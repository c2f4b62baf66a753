#!/usr/bin/env python3
"""A fake `agent serve` written from docs/protocol.md alone (its own pyzmq + msgpack, nothing
from shared/, coordinator/ or agent/), so it tests what the coordinator does with what the wire
may carry, not what our own agent happens to send. A `mode` chooses what it corrupts; `benign`
corrupts nothing and serves as the well-behaved second host.

What it speaks (protocol.md section numbers):
- §2: a ROUTER command socket and an XPUB telemetry socket, both TCP on loopback, maxmsgsize
  4 MiB and ZMTP heartbeats 2 s / 6 s; `--insecure` style (NULL) by default, or a CURVE server
  with a keypair (`curve=`), accepting every client key (no ZAP handler: a fake trusts anyone,
  the coordinator's own key included).
- §3/§4: [identity, envelope] in, [identity, envelope] out; an envelope is the msgpack map
  {v: 4, id, type, re, body}; a request it cannot read is answered `error` `malformed`.
- §5: hello, ping, info, bench.start (bench.start.ok, then bench.progress, bench.cell per cell,
  bench.done), bench.cancel, job.get, job.list, history.get, policy.get, policy.set, doctor;
  §16: rank.start, rank.get, rank.stop (a rank that never runs: `strings` fails it);
  §19: stage.prepare, stage.fetch, stage.status, stage.cancel, models.list, models.remove
  (Staging: tasks and listings only, no byte moves); §5's serving cells (`serving` in the
  matrix), §14's bandwidth probe (`bandwidth` in doctor's body), §17's bench.check and a
  group's rank records (`rank`, `greedy_tokens`, `probe`: rank 1 a compute straggler), §18's
  calibrate.start and calibrate.get (`strings` only; the other modes refuse them).
- §10: telemetry.sample every `poll_interval` and a telemetry.event now and then, published as
  [topic, envelope] with topic b"sample" / b"event", `re` nil; kept for history.get.

Modes, each with the line of protocol.md it breaks or the real failure it models:
- `strings`: every string field an agent fills (machine device, hw_model, chip, agent version,
  hostname, thermal source, sensor, pressure, every error, cell test/model/name, job command,
  doctor check name/detail/fix, policy_origin, event detail) carries PAYLOAD: OSC 52 (clipboard
  write), OSC 0 (window title), CSI 6n (a terminal answers on stdin), CSI 2J (clears the
  screen), C1 CSI 0x9B, Rich markup ([link=file://...], a bare [/] that raises MarkupError,
  [bold red]), a newline that forges a row, U+202E (bidi override) and U+200B (zero width).
  §4 types these fields `str` and nothing more; §5 says an `error` message is "shown to the
  user verbatim", which is exactly what a hostile or compromised agent exploits (issue 24;
  CVE-2021-25743-style terminal injection through kubectl describe is the real-world model).
- `huge`: one string per message (a failed cell's error, bench.done's error, job.get's error,
  a sample's storage_error, an event's detail, a doctor check's detail) filled so the envelope
  is just under §4's 4,194,271-byte limit: legal on the wire (§4 bounds the message, not its
  strings), fatal to a terminal or a log if printed whole.
- `huge-info`: the same in info.ok's machine.device alone (a coordinator that refuses such an
  info.ok never gets to the job stream, so the stream's strings are `huge`'s).
- `types`: ill-typed fields in the replies (info.ok, doctor.ok, policy.get.ok, job.list.ok,
  job.get.ok), against §5's tables: NaN, inf and 1e308 where a number is due (msgpack carries
  IEEE floats; JSON has no NaN: machine.memory_gb, a reading's celsius, policy thresholds),
  `cpu_levels` an int (§5 gives it no type; our agent sends a map), `state` outside its enum
  (§5 job.get.ok and job.list.ok, info.ok's jobs), a job.list `total` of -1, doctor's `ok` a
  str and a check's `detail` an int (§14: bool, str).
- `telemetry-types`: the same in telemetry alone (info.ok stays valid, so a monitor gets that
  far): a sample `seq` of 2**63 (§10 says 1, 2, 3...; msgpack packs it as uint64, beyond
  SQLite's INTEGER), NaN celsius and energy, inf trend, -inf watts, 1e308 pause seconds,
  `state` "melting" (§10: ok, reduce_batch, pause, stop or nil), and a nil inside
  history.get.ok `samples` (§5: [telemetry.sample bodies]).
- `cell-types`: the same in the job stream only (info stays valid, so the job runs):
  `tokens_per_sec: "fast"` (§5 Cell records: number), NaN / inf / 1e308 in a record, and a
  bench.cell with index -1 (§5: 0-based).
- `cells-range`: bench.cell `index` not checked against the job (§5: 0-based, in run order,
  bench.start.ok names 2 cells): BAD_INDEXES (2, 99, -1, "0", 0.5, true, 2**63, 7) besides
  the real two.
- `cells-dup`: a second bench.cell for index 0 with tokens_per_sec 999999 (§6: "Cells are
  identified by (job, index): a cell received twice is kept once": the first must stay).
- `cells-malformed`: a bench.cell without `record` and a bench.done without `status` and
  `cells` (§5 tables: every field listed is required); the run must still end (§6: follow
  the job with job.get until its state is no longer running).
- `start-dropped`: the first bench.start is lost (a link flap): no reply, no job, and every
  ping answered `job` nil; a bench.start sent again is served (§6: a coordinator that lost the
  bench.start.ok finds its job with job.list).
- `start-unanswered`: the first bench.start starts the job, which runs to its end, but its
  reply and stream are lost: job.list names it by `request`, job.get holds its records.
- `progress-forever`: the job starts and never ends, while a bench.progress (no model, no
  cell) comes every poll interval (§6 No progress: progress is a new cell or a model built).
- `protocol3`: hello.ok.protocol 3 while every envelope's `v` is 4 (§8: "A coordinator learns
  the agent's version from hello.ok.protocol before sending anything else").
- `reply-wrong-type`: every request after hello is answered with a well-formed envelope of the
  wrong type (a hello.ok), `re` set: a refused reply, not a missing one (§1: "a dead or
  refusing peer is told apart from a slow one").
- `reply-invalid`: the right reply type with an empty body (§4 step 8: a field missing).
- `reply-garbage`: a frame that is not msgpack (0xC1 is never used by msgpack; §4 step 2).
- `reply-error`: every request after hello refused with `error` `internal` whose message
  carries PAYLOAD: §5 says an error's message is "for a human; shown to the user verbatim".
- `stage-forgets`: every stage.status answered with no task, as by an agent restarted since
  its stage.fetch.ok (§19: a task is kept "until the agent stops"; launchd restarts it).
- `flood`: from the first request on, for `flood_s` seconds, publishes samples as fast as it
  can (every one valid, numbered on, kept for history.get), answering requests between bursts:
  a runaway agent (a poll interval of 0, a replay loop) or a malicious one. The real failure it
  models: a monitor whose memory or CPU grows with a peer's rate, or that never gets to print.
- `junk`: the same window, but junk on the command socket to every coordinator it has seen:
  garbage frames, unsolicited replies and bench.cells with made-up `re`, three-frame messages,
  a telemetry envelope (§3: one frame per message; §4: `re` names the request answered; §5:
  telemetry is never sent on the command socket).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgpack
import zmq

PROTOCOL = 4
MAX_MESSAGE = 4 * 1024 * 1024
MAX_ENVELOPE = MAX_MESSAGE - 33
"""§4: the largest envelope that arrives (4 MiB less CURVE's 33 bytes)."""
VERSION = "0.1.0"

PAYLOAD = (
    "\x1b]52;c;SGVsbG8=\x07"
    "\x1b]0;pwned\x07"
    "\x1b[6n"
    "\x1b[2J"
    "\x9b6n"
    "[link=file:///etc/passwd]x[/link]"
    "[reverse]MARKUP[/reverse]"
    "[/]"
    "[bold red]"
    "\u202e"
    "\u200b"
    "\nFAKE ROW"
)
"""Every terminal/markup payload of issue 24, in one string that ends by forging a row.
`[reverse]MARKUP[/reverse]` is the markup a pipe shows: parsed, it leaves `MARKUP` bare."""
HUGE = "\x00huge\x00"
"""Placeholder for the field a `huge` message fills to the size limit."""
MODES = (
    "benign",
    "strings",
    "huge",
    "huge-info",
    "types",
    "telemetry-types",
    "cell-types",
    "cells-range",
    "cells-dup",
    "cells-malformed",
    "start-dropped",
    "start-unanswered",
    "progress-forever",
    "protocol3",
    "reply-wrong-type",
    "reply-invalid",
    "reply-garbage",
    "reply-error",
    "stage-forgets",
    "flood",
    "junk",
)
REQUESTS = {
    "hello",
    "ping",
    "info",
    "bench.start",
    "bench.check",
    "bench.cancel",
    "job.get",
    "job.list",
    "history.get",
    "policy.get",
    "policy.set",
    "job.event",
    "doctor",
    "calibrate.start",
    "calibrate.get",
    "rank.start",
    "rank.get",
    "rank.stop",
    "stage.prepare",
    "stage.fetch",
    "stage.status",
    "stage.cancel",
    "models.list",
    "models.remove",
}
BAD_INDEXES: tuple[Any, ...] = (2, 99, -1, "0", 0.5, True, 2**63, 7)
"""`cells-range`'s indexes for a 2-cell job: one past the end, far past, negative, a str, a
float, a bool (msgpack's true, which Python's int check lets through), beyond int64."""
BAD_INDEX_LATENCIES = (22.2, 99.9, 66.6, 33.3, 55.5, 11.1, 88.8, 77.7)
"""Each bad index's record is whole and consistent; its latency (ms) marks it in a table."""
STAGED_REVISION = "0123456789abcdef0123456789abcdef01234567"
STAGED_DIGEST = "ab" * 32
STAGED_SIZE = 5_000_000
"""§19: the model every fake stages (a 40-hex-digit commit, a 64-hex-digit digest, 5 MB)."""
HELD_MODEL = "org/held"
"""The model `strings` holds, mismatched (a benchmark's --model of it is refused, §19)."""
SERVE_REQUESTS = 4
"""Requests of a serving cell's one timed pass (§5 The serving axis: `requests`)."""
POLICY = {
    "max_speed_temp": 75.0,
    "pause_temp": 85.0,
    "stop_temp": 95.0,
    "pause_duration": 0.5,
    "hysteresis": 0.0,
}


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def new_id() -> str:
    """§4: 16 random hex digits."""
    return secrets.token_hex(8)


def plan_cells(matrix: dict[str, Any]) -> list[dict[str, Any]]:
    """The cells of a MatrixSpec in run order, named as §5 The matrix says."""
    cells: list[dict[str, Any]] = []
    prompts = [p for p in matrix.get("n_prompt") or [512] if p > 0]
    gens = [g for g in matrix.get("n_gen") or [128] if g > 0]
    pairs = [tuple(pair) for pair in matrix.get("n_pg") or []]
    if matrix.get("serving"):
        return serving_cells(matrix, prompts, gens)
    for model in matrix.get("models") or ["small"]:
        for bits in matrix.get("bits") or [None]:
            resolved, label = labelled(model, bits)
            for batch in matrix.get("batch_sizes") or [1]:
                for depth in matrix.get("n_depth") or [0]:
                    tests = [("prefill", p, 0, f"pp{p}") for p in prompts]
                    tests += [("decode", 0, g, f"tg{g}") for g in gens]
                    tests += [("prefill+decode", p, g, f"pp{p}+tg{g}") for p, g in pairs]
                    for mode, n_prompt, n_gen, test in tests:
                        at = f"{test} @ d{depth}" if depth else test
                        cells.append(
                            {
                                "model": model,
                                "bits": resolved,
                                "n_prompt": n_prompt,
                                "n_gen": n_gen,
                                "n_depth": depth,
                                "batch_size": batch,
                                "mode": mode,
                                "test": at,
                                "name": f"{label} {at} b{batch}",
                            }
                        )
    return cells


def labelled(model: str, bits: int | None) -> tuple[int | None, str]:
    """§5: a model's bits as the job resolves them, and its label `<name>/<bits>`."""
    resolved = bits if bits is not None else {"small": 16, "full": 4}.get(model)
    if resolved is None:
        return None, model
    return resolved, f"{model}/{'f16' if resolved == 16 else f'q{resolved}'}"


def serving_cells(
    matrix: dict[str, Any], prompts: list[int], gens: list[int]
) -> list[dict[str, Any]]:
    """§5 The serving axis: per model and bits, per length (each prompt with each generation
    length), per load point, closed loops first, named `<label> serve c<N>` (`r<R>` for a
    rate), with ` pp<P>+tg<G>` after the load where the lengths vary."""
    serving = matrix["serving"]
    loads = [(int(c), 0.0) for c in serving.get("concurrency") or []]
    loads += [(0, float(r)) for r in serving.get("request_rates") or []]
    lengths = [(p, g) for p in prompts for g in gens]
    cells = []
    for model in matrix.get("models") or ["small"]:
        for bits in matrix.get("bits") or [None]:
            resolved, label = labelled(model, bits)
            for n_prompt, n_gen in lengths:
                for clients, rate in loads:
                    test = f"serve c{clients}" if clients else f"serve r{rate}"
                    if len(lengths) > 1:
                        test += f" pp{n_prompt}+tg{n_gen}"
                    cell = {"model": model, "bits": resolved, "n_prompt": n_prompt}
                    cells.append(
                        cell
                        | {"n_gen": n_gen, "n_depth": 0, "batch_size": 1, "mode": "serve"}
                        | {"test": test, "name": f"{label} {test}"}
                        | {"concurrency": clients, "request_rate": rate}
                    )
    return cells


def serving_record(
    text: Callable[[str], str], cell: dict[str, Any], tokens: int, latency: float
) -> dict[str, Any]:
    """§5 Cell records, `serving`: one timed pass of SERVE_REQUESTS requests, its strings
    (engine, model_impl, tokens_from, prompt_cache) the agent's words."""
    window = latency / 1000
    figures: dict[str, Any] = {
        "requests": SERVE_REQUESTS,
        "completed": SERVE_REQUESTS,
        "failed": 0,
        "good": SERVE_REQUESTS,
        "output_tokens": tokens,
        "slo_ttft_ms": 2000.0,
        "slo_tpot_ms": 100.0,
        "window_s": window,
        "output_tok_s": tokens / window,
        "request_rate": SERVE_REQUESTS / window,
        "goodput": SERVE_REQUESTS / window,
    }
    for name in ("ttft", "itl", "tpot", "e2e"):
        for stat in ("mean", "p50", "p95", "p99"):
            figures[f"{name}_{stat}_ms"] = latency / 4
    for stat in ("mean", "p50", "p95", "p99"):
        figures[f"request_tok_s_{stat}"] = tokens / window / SERVE_REQUESTS
    return {
        "loop": "closed" if cell["concurrency"] else "open",
        "passes": 1,
        "engine": text("mlx-lm BatchGenerator"),
        "model_impl": text("mlx_lm.models.llama"),
        "requests_per_pass": SERVE_REQUESTS,
        "duration_s": None,
        "prompts": "synthetic",
        "tokens_from": text("random"),
        "prompt_cache": text("none"),
        "saturated": None if cell["concurrency"] else False,
        "late_injected": 0,
        "figures": figures,
    }


@dataclass
class Job:
    id: str
    request: str
    identity: bytes
    spec: dict[str, Any]
    cells: list[dict[str, Any]]
    records: list[dict[str, Any]] = field(default_factory=list)
    """What job.get returns: the records this job journaled, in index order."""
    state: str = "running"
    started: str = field(default_factory=now_rfc3339)
    finished: str | None = None
    group: dict[str, Any] | None = None
    """bench.start's `group` (§17): this job is one rank of it."""


class FakeAgentCore:
    """What every part of the hostile agent shares: its state (HostileAgent.__init__ sets it),
    how a field is corrupted in this mode (text(): `strings`; big(): `huge`; number(): `types`
    and `telemetry-types`), sending on the command socket, and the jobs it lists."""

    mode: str
    name: str
    curve: tuple[bytes, bytes] | None
    poll_interval: float
    flood_s: float
    bad_index: tuple[type, Any] | None
    plain_cells: bool
    requests: list[str]
    _dropped: bool
    _progressing: Job | None
    jobs: dict[str, Job]
    ranks: dict[Any, Any]
    """rank.start's job → its rank."""
    stopped: dict[Any, str]
    """rank.stop's job → its why."""
    samples: list[dict[str, Any]]
    events: list[dict[str, Any]]
    flood_sent: int
    router: zmq.Socket
    pub: zmq.Socket
    port: int
    telemetry_port: int
    _flood_began: float | None
    _identities: set[bytes]
    _seq: Iterator[int]
    _event_seq: Iterator[int]

    # --- strings -----------------------------------------------------------------------------

    def text(self, value: str) -> str:
        """A string field as this mode sends it."""
        return value + PAYLOAD if self.mode == "strings" else value

    def cell_text(self, value: str) -> str:
        """A cell's model, test, name or weights digest: plain with `plain_cells`, so the cells
        of two hosts match (a comparison across them) while every other string is hostile."""
        return value if self.plain_cells else self.text(value)

    def big(self, value: str) -> str:
        """A string field that `huge` fills up to the message size limit."""
        return HUGE if self.mode == "huge" else self.text(value)

    def number(self, value: float, bad: float, telemetry: bool = False) -> float:
        """`bad` in `types` (replies) or `telemetry-types` (samples, events, history)."""
        return bad if self.mode == ("telemetry-types" if telemetry else "types") else value

    # --- sending and listing -----------------------------------------------------------------

    def _send(self, identity: bytes, type_: str, body: dict[str, Any], re: str | None) -> None:
        data = envelope(type_, body, re)
        self.router.send_multipart([identity, data])

    def _running(self) -> str | None:
        return next((job.id for job in self.jobs.values() if job.state == "running"), None)

    def _supervised(self, telemetry: bool = False) -> dict[str, Any]:
        melting = self.mode == ("telemetry-types" if telemetry else "types")
        return {
            "job": "run-1",
            "pid": 4242,
            "command": self.text("python -m mlx_lm lora --train"),
            "state": "melting" if melting else "running",
            "kind": "run",
        }


class Replies(FakeAgentCore):
    """Every request dispatched, and the answers about the host itself (hello, ping, info,
    policy.get, doctor): where `types`, `strings` and `huge-info` corrupt info.ok and doctor.ok,
    `protocol3` names another protocol, and the `reply-*` modes answer wrongly on purpose."""

    def _answer(self, identity: bytes, type_: str, body: dict[str, Any], rid: str) -> None:
        if type_ != "hello" and self.mode.startswith("reply-") and type_ != "ping":
            self._bad_reply(identity, type_, rid)
            return
        if type_ == "hello":
            self._send(identity, "hello.ok", self._hello(), rid)
        elif type_ == "ping":
            self._send(identity, "ping.ok", {"job": self._running(), "time": time.time()}, rid)
        elif type_ == "info":
            self._send(identity, "info.ok", self._info(), rid)
        elif type_ == "bench.start":
            self._bench(identity, body, rid)
        elif type_ == "bench.check":  # §17: the cells it would run, each model's weights named
            cells = [self.cell_text(cell["name"]) for cell in plan_cells(body.get("matrix") or {})]
            models = {model: self.cell_text("config:0f") for model in body["matrix"]["models"]}
            self._send(identity, "bench.check.ok", {"cells": cells, "models": models}, rid)
        elif type_ == "bench.cancel":
            self._cancel(identity, body, rid)
        elif type_ == "job.get":
            self._job_get(identity, body, rid)
        elif type_ == "job.list":
            self._send(identity, "job.list.ok", self._job_list(), rid)
        elif type_ == "history.get":
            self._send(identity, "history.get.ok", self._history(body), rid)
        elif type_ == "policy.get":
            self._send(identity, "policy.get.ok", self._policy(), rid)
        elif type_ == "doctor":
            report = self._doctor()
            if body.get("bandwidth"):  # §14: `coordinator doctor --level 2` asks for the probe
                report["bandwidth"] = self._bandwidth()
            self._send(identity, "doctor.ok", {"report": report}, rid)
        elif type_ in ("rank.start", "rank.get", "rank.stop"):
            self._rank(identity, type_, body, rid)
        elif type_.startswith(("stage.", "models.")):
            self._stage(identity, type_, body, rid)
        elif type_ in ("calibrate.start", "calibrate.get") and self.mode == "strings":
            self._calibrate(identity, type_, body, rid)
        else:  # policy.set, job.event: refused, with a message the user is shown verbatim
            message = self.text(f"{type_} is not served by this fake")
            self._send(identity, "error", {"code": "internal", "message": message}, rid)

    def _rank(self, identity: bytes, type_: str, body: dict[str, Any], rid: str) -> None:
        """§16: a rank of `coordinator netbench`. It never runs: `strings` fails it at the first
        rank.get with an error carrying PAYLOAD (§16: `error`, a str, shown to the user), the
        others report it running with no progress until rank.stop."""
        job = body.get("job")
        if type_ == "rank.start":
            self.ranks[job] = body.get("rank")
            self._send(identity, "rank.start.ok", {"job": job, "rank": body.get("rank")}, rid)
            return
        if job not in self.ranks:
            message = f"no rank of job {job!r} here"
            self._send(identity, "error", {"code": "unknown-job", "message": message}, rid)
            return
        if type_ == "rank.stop":
            self.stopped[job] = body.get("why") or "stopped by its coordinator"
        failed = self.mode == "strings"
        state, error = "running", None
        if job in self.stopped:
            state, error = "stopped", self.stopped[job]
        elif failed:
            state, error = "failed", self.text("rank 1 ended with exit 1: ring broke")
        reply = {
            "job": job,
            "rank": self.ranks[job],
            "state": state,
            "elapsed_s": 0.5,
            "error": error,
            "report": None,
            "progress": 0,
            "progress_age_s": 0.5,
        }
        self._send(identity, f"{type_}.ok", reply, rid)

    def _bad_reply(self, identity: bytes, type_: str, rid: str) -> None:
        if self.mode == "reply-garbage":
            self.router.send_multipart([identity, b"\xc1\xc1 not msgpack"])
        elif self.mode == "reply-wrong-type":
            self._send(identity, "hello.ok", self._hello(), rid)
        elif self.mode == "reply-error":
            message = f"{type_} failed{PAYLOAD}"
            self._send(identity, "error", {"code": "internal", "message": message}, rid)
        else:
            self._send(identity, f"{type_}.ok", {}, rid)

    def _hello(self) -> dict[str, Any]:
        return {
            "agent": self.text(VERSION),
            "protocol": 3 if self.mode == "protocol3" else PROTOCOL,
            "hostname": self.text(self.name),
            "secure": self.curve is not None,
        }

    def _machine(self) -> dict[str, Any]:
        return {
            "hostname": self.text(self.name),
            "chip": self.text("Apple M2 Max"),
            "device": HUGE if self.mode == "huge-info" else self.text("Mac14,6 gpu"),
            "backend": self.text("gpu"),
            "memory_gb": self.number(68.7, math.nan),
            "memory_gib": self.number(64.0, math.inf),
            "hw_model": self.text("Mac14,6"),
            "gpu_cores": 38,
            # §5 lists cpu_levels without a type; `8P+4E` style is a map of level: cores.
            "cpu_levels": 2 if self.mode == "types" else {"Performance": 8, "Efficiency": 4},
            "macos_version": self.text("14.5"),
            "rosetta": False,
            "metal_working_set_bytes": self.number(51539607552, 1e308),
            "os": self.text("Darwin"),
            "mlx_version": self.text("0.21.0"),
        }

    def _info(self) -> dict[str, Any]:
        source = self.text("sim")
        running = self._running()
        job = None
        if running is not None:
            current = self.jobs[running]
            job = {
                "id": running,
                "done": len(current.records),
                "total": len(current.cells),
                "started": current.started,
            }
        return {
            "agent": self.text(VERSION),
            "protocol": 3 if self.mode == "protocol3" else PROTOCOL,
            "name": self.text(self.name),
            "machine": self._machine(),
            "thermal": {
                "source": source,
                "simulated": True,
                "reading": {
                    "celsius": self.number(52.5, math.nan),
                    "source": source,
                    "sensor": self.text("TCMz"),
                    "time": time.time(),
                    "sensors": {self.text("TCMz"): self.number(52.5, math.inf)},
                    "pressure": self.text("nominal"),
                    "simulated": True,
                },
                "error": self.text("no error") if self.mode == "strings" else None,
            },
            "power": {
                "source": self.text("sim"),
                "simulated": True,
                "rails": ["cpu", "gpu"],
                "resolution_s": 0,
                "reading": None,
                "error": self.text("no reading yet") if self.mode == "strings" else None,
            },
            "job": job,
            "telemetry_port": self.telemetry_port,
            "poll_interval": self.poll_interval,
            "policy": self._policy()["policy"],
            "policy_origin": self.text("the seed's defaults"),
            "jobs": [self._supervised()],
            "history": f"hist-{self.name}-{self.port}",
            "storage": {
                "ok": self.mode != "strings",
                "failing": (
                    [
                        {
                            "what": "history",
                            "path": self.text("/var/agent-telemetry.sqlite"),
                            "error": self.text("database or disk is full"),
                            "since": time.time() - 60,
                            "failures": 3,
                        }
                    ]
                    if self.mode == "strings"
                    else []
                ),
            },
        }

    def _policy(self) -> dict[str, Any]:
        policy = dict(POLICY)
        if self.mode == "types":
            policy["pause_temp"] = math.nan
            policy["stop_temp"] = math.inf
        return {"policy": policy, "origin": self.text("the seed's defaults")}

    def _calibrate(self, identity: bytes, type_: str, body: dict[str, Any], rid: str) -> None:
        """§18 in `strings`: a calibration that starts, then has failed (no onset found), its
        source, progress sensor, error, origin and policy origin PAYLOAD (the other modes
        refuse both requests, `internal`)."""
        if type_ == "calibrate.start":
            self.calibrating = body.get("minutes")
            reply = {"minutes": self.calibrating, "source": self.text("sim")}
            self._send(identity, "calibrate.start.ok", reply, rid)
            return
        progress = {
            "phase": "sustained",
            "elapsed_s": 30.0,
            "total_s": 60.0,
            "celsius": 71.5,
            "onset_c": None,
            "gpu_hz": None,
            "sensor": self.text("TCMz"),
        }
        reply = {
            "state": "none" if self.calibrating is None else "failed",
            "minutes": self.calibrating,
            "source": None if self.calibrating is None else self.text("sim"),
            "progress": None if self.calibrating is None else progress,
            "error": self.text("no onset found in 1 min: the GPU clock never dropped"),
            "calibration": None,
            "origin": self.text("defaults for sim"),
            "policy": self._policy()["policy"],
            "policy_origin": self.text("the seed's defaults"),
        }
        self._send(identity, "calibrate.get.ok", reply, rid)

    def _bandwidth(self) -> dict[str, Any]:
        """§14 `bandwidth`: a probe's timings, or (`strings`) the {`error`} of one that could
        not run, PAYLOAD in it."""
        if self.mode == "strings":
            return {"error": self.text("MLX failed: out of memory")}
        return {"bytes": 64 * 1024 * 1024, "backend": "gpu", "read_s": [0.001] * 3,
                "copy_s": [0.002] * 3}  # fmt: skip

    def _doctor(self) -> dict[str, Any]:
        checks = []
        for name in ("python", "mlx", "metal", "benchmark", "thermal: sim", "data dir"):
            checks.append(
                {
                    "name": self.text(name),
                    "ok": name != "metal",
                    "detail": self.big(f"{name} looks fine")
                    if name == "python"
                    else self.text(f"{name} looks fine"),
                    "fix": self.text(f"reinstall {name}") if name == "metal" else None,
                    "required": name != "metal",
                }
            )
        if self.mode == "types":
            checks[0]["detail"] = 42
            checks[1]["required"] = None
        return {
            "host": self.text(self.name),
            "ok": "yes" if self.mode == "types" else True,
            "checks": checks,
            "machine": self._machine(),
        }


class RecordFields(FakeAgentCore):
    """What a cell record carries beside its figures: a group rank's fields (§17) and the
    settings (§5), each string as the mode sends it."""

    def _rank_fields(self, group: dict[str, Any]) -> dict[str, Any]:
        """§17 A rank's record: which rank, the greedy tokens, its straggler probe (rank 1
        computes 3x as long: a compute straggler), and (`strings`) a fault it says it injected,
        PAYLOAD (64 characters at most: record_types.Flags)."""
        rank, members = group["rank"], [member["name"] for member in group["members"]]
        compute = 0.03 if rank == 1 else 0.01
        fields = {
            "rank": {"rank": rank, "host": self.cell_text(members[rank])[:64], "members": members}
            | {"backend": group["backend"], "sharding": group["sharding"]},
            "greedy_tokens": [1, 2, 3],
            "probe": {"compute_s": [compute] * 3, "wait_s": [0.04 - compute] * 3},
        }
        if self.mode == "strings":
            fields["injected"] = [PAYLOAD[:64]]
        return fields

    def _settings(self) -> dict[str, Any]:
        """§5 Settings: every key, the versions and builds the agent's words (`coordinator
        canary` splits hosts by them)."""
        return {
            "os_name": self.text("macOS"),
            "os_version": self.text("14.5"),
            "os_build": self.text("23F79"),
            "mlx_version": self.text("0.21.0"),
            "mlx_lm_version": None,
            "mlx_fleet_version": self.text(VERSION),
            "model_revision": None,
            "weights_digest": self.cell_text("config:0f"),
            "power_mode": "normal",
            "power_source": "ac",
            "wired_limit_bytes": None,
            "thermal_source": self.text("sim"),
            "policy": POLICY,
            "policy_origin": self.text("the seed's defaults"),
            "sleep_assertion": None,
            "agent": self.text(self.name),
        }


class BenchJobs(RecordFields):
    """A benchmark job: bench.start and its stream, job.get, job.list and bench.cancel. Where
    `cell-types`, `cells-range`, `cells-dup` and `cells-malformed` break the stream, `types`
    the job listings, and `strings`/`huge` fail its last cell."""

    def _bench(self, identity: bytes, body: dict[str, Any], rid: str) -> None:
        matrix = body.get("matrix")
        if not isinstance(matrix, dict) or not matrix.get("models"):
            message = self.text("models must be given")
            self._send(identity, "error", {"code": "bad-matrix", "message": message}, rid)
            return
        if self.mode == "start-dropped" and not self.jobs and not self._dropped:
            self._dropped = True  # a link flap lost the request: no reply, no job
            return
        running = self._running()
        if running is not None:
            message = self.text(f"job {running} is running")
            self._send(identity, "error", {"code": "busy", "message": message}, rid)
            return
        cells = plan_cells(matrix)
        if self.mode.startswith("cells-"):
            cells = cells[:2]
        job = Job(new_id(), rid, identity, matrix, cells, group=body.get("group"))
        self.jobs[job.id] = job
        names = [self.cell_text(cell["name"]) for cell in cells]
        if self.mode == "start-unanswered":  # the job runs, its reply and stream are lost
            job.records = [self._record(job, index) for index in range(len(cells))]
            job.state, job.finished = "ok", now_rfc3339()
            return
        self._send(identity, "bench.start.ok", {"job": job.id, "cells": names}, rid)
        if self.mode == "progress-forever":  # the job never ends; bench.progress never stops
            self._progressing = job
            return
        self._stream(job, "bench.progress", {"done": 0, "total": len(cells), "model": None})
        model = self._model(cells[0]["model"]) if cells else None
        self._stream(job, "bench.progress", {"done": 0, "total": len(cells), "model": model})
        sent = 0
        for index, record in self._cells(job):
            if index is None:  # cells-malformed: a bench.cell without its record
                self._stream(job, "bench.cell", {"index": 0})
            else:
                self._stream(job, "bench.cell", {"index": index, "record": record})
            sent += 1
        job.state, job.finished = "ok", now_rfc3339()
        if self.mode == "cells-malformed":
            self._stream(job, "bench.done", {"error": None})
        else:
            error = self.big("one cell failed") if self.mode in ("strings", "huge") else None
            self._stream(job, "bench.done", {"status": "ok", "error": error, "cells": sent})

    def _progress_again(self, job: Job) -> None:
        """`progress-forever`: the same bench.progress again (no model, no cell), as an agent
        whose job hangs in a loop that still reports would send."""
        self._stream(job, "bench.progress", {"done": 0, "total": len(job.cells), "model": None})

    def _cells(self, job: Job) -> Iterator[tuple[int | None, dict[str, Any]]]:
        """(index, record) for every bench.cell of this mode's stream; journals the good ones."""
        good = [self._record(job, index) for index in range(len(job.cells))]
        job.records = list(good)
        if self.mode == "cell-types":
            yield 0, {**good[0], "tokens_per_sec": "fast"}
            bad = {"tokens_per_sec": math.nan, "latency_ms": math.inf, "peak_memory_gb": 1e308}
            yield from ((1, {**record, **bad}) for record in good[1:2])
            yield -1, good[0]
            job.records = [{**good[0], "tokens_per_sec": "fast"}, *good[1:]]
            return
        if self.mode == "cells-range":
            # Whole, consistent records (latencies 77.7, 88.8, 66.6 ms mark them): only the
            # index is wrong.
            yield 0, good[0]
            for bad, latency in zip(BAD_INDEXES, BAD_INDEX_LATENCIES, strict=True):
                if self.bad_index is None or self.bad_index == (type(bad), bad):
                    yield bad, self._record(job, len(good) - 1, latency=latency)
            yield from enumerate(good[1:], start=1)
            return
        if self.mode == "cells-dup":
            # A whole, consistent record of 999999 tok/s: only its index repeats the first's.
            cell = job.cells[0]
            tokens = (cell["n_prompt"] + cell["n_gen"]) * cell["batch_size"]
            yield 0, good[0]
            yield 0, self._record(job, 0, latency=tokens / 999999 * 1000)
            yield from enumerate(good[1:], start=1)
            return
        if self.mode == "cells-malformed":
            yield None, {}
            yield from enumerate(good)
            return
        yield from enumerate(good)

    def _record(self, job: Job, index: int, latency: float | None = None) -> dict[str, Any]:
        cell = job.cells[index]
        failed = self.mode in ("strings", "huge") and index == len(job.cells) - 1
        serves = cell["mode"] == "serve"
        tokens = SERVE_REQUESTS * cell["n_gen"] if serves else cell["n_prompt"] + cell["n_gen"]
        tokens *= cell["batch_size"]
        latency = 10.0 + index if latency is None else latency
        coordinates = {
            **cell,
            "model": self.cell_text(cell["model"]),
            "test": self.cell_text(cell["test"]),
            "name": self.cell_text(cell["name"]),
            "status": "failed" if failed else "ok",
            "error": self.big("the job process died (killed by SIGSEGV)") if failed else None,
            "soc_temp_start_c": None,
            "soc_temp_end_c": None,
            "soc_temp_c": None,
            "pressure_start": self.text("nominal"),
            "pressure_end": self.text("nominal"),
            "pause_s": 0.0,
            "flags": ["simulated"],
            "thermal_source": self.text("sim"),
        }
        if job.group is not None:  # §17: every record of a rank says which
            coordinates["rank"] = self._rank_fields(job.group)["rank"]
        if failed:
            return coordinates
        rate = tokens / (latency / 1000)
        record = {
            **coordinates,
            "test_time": now_rfc3339(),
            "tokens_per_sec": rate,
            "std_tokens_per_sec": None,
            "latency_ms": latency,
            "std_latency_ms": None,
            "min_latency_ms": latency,
            "median_latency_ms": latency,
            "samples_ms": [latency],
            "samples_tokens_per_sec": [rate],
            "ci95_tokens_per_sec": 0.0,
            "warmup_iterations": 1,
            "rewarm_iterations": 0,
            "slept_s": 0.0,
            "peak_memory_gb": 0.05,
            "active_memory_gb": 0.04,
            "seq_len": cell["n_prompt"] if cell["n_prompt"] else cell["n_depth"],
            "prefill_step_size": job.spec.get("prefill_step_size") or 2048,
            "wired_limit_bytes": None,
            "energy_source": None,
            "energy_simulated": False,
            "energy_rails": [],
            "energy_j": None,
            "energy_net_j": None,
            "energy_window_s": None,
            "power_w": None,
            "idle_power_w": None,
            "tokens_per_joule": None,
            "joules_per_token": None,
            "energy_by_rail_j": None,
            "energy_short_windows": None,
            "energy_note": self.text("no power meter: none"),
            "settings": self._settings(),
        }
        if cell["n_gen"]:
            record["decode_tokens"] = cell["n_gen"]
            record["mean_per_token_ms"] = latency / cell["n_gen"]
        if job.group is not None:
            record |= self._rank_fields(job.group)
        if serves:
            record["serving"] = serving_record(self.text, cell, tokens, latency)
            record["joules_per_output_token_net"] = None
        return record

    def _stream(self, job: Job, type_: str, body: dict[str, Any]) -> None:
        """§5: every job-stream message carries `re` = the bench.start id, to its identity."""
        self._send(job.identity, type_, {"job": job.id, **body}, job.request)

    def _job_get(self, identity: bytes, body: dict[str, Any], rid: str) -> None:
        job = self.jobs.get(body.get("job"))  # type: ignore[arg-type]
        if job is None:
            message = self.text("no such job")
            self._send(identity, "error", {"code": "unknown-job", "message": message}, rid)
            return
        offset = body.get("offset") or 0
        reply = {
            "job": job.id,
            "state": "melting" if self.mode == "types" else job.state,
            "error": self.big("one cell failed") if self.mode in ("strings", "huge") else None,
            "spec": job.spec,
            "models": [self._model(job.cells[0]["model"])] if job.cells else [],
            "records": job.records[offset:],
            "offset": offset,
            "next": None,
            "started": job.started,
            "finished": job.finished,
        }
        self._send(identity, "job.get.ok", reply, rid)

    def _job_list(self) -> dict[str, Any]:
        jobs = []
        for job in reversed(self.jobs.values()):
            jobs.append(
                {
                    "job": job.id,
                    "request": job.request,
                    "state": "melting" if self.mode == "types" else job.state,
                    "total": -1 if self.mode == "types" else len(job.cells),
                    "done": len(job.records),
                    "error": None,
                    "started": job.started,
                    "finished": job.finished,
                }
            )
        return {"jobs": jobs}

    def _cancel(self, identity: bytes, body: dict[str, Any], rid: str) -> None:
        job = self.jobs.get(body.get("job"))  # type: ignore[arg-type]
        if job is None:
            message = self.text("no such job")
            self._send(identity, "error", {"code": "unknown-job", "message": message}, rid)
            return
        if job.state == "running":  # progress-forever's: §5, bench.cancel stops it
            job.state, job.finished = "cancelled", now_rfc3339()
            self._send(identity, "bench.cancel.ok", {"job": job.id}, rid)
            self._stream(job, "bench.done", {"status": "cancelled", "error": None, "cells": 0})
            return
        message = self.text(f"job {job.id} already ended")
        self._send(identity, "error", {"code": "not-running", "message": message}, rid)

    def _model(self, model: str) -> dict[str, Any]:
        # §5 lists "label, param_count, weight_memory_gb, ..."; the coordinator wants `model`.
        return {
            "model": self.text(model),
            "label": self.text(model),
            "param_count": 4_000_000,
            "weight_memory_gb": self.number(0.008, math.nan),
        }


class Staging(FakeAgentCore):
    """§19 as a coordinator sees it (no byte moves: the coordinator only asks and polls, the
    agents move the bytes): stage.prepare holds or downloads the model at once (a `ready`
    source task), stage.fetch is `fetching` until the next stage.status, then `ready`
    (its `source` the one asked, in `strings` with PAYLOAD: another fetch, to a coordinator);
    stage.status, stage.cancel, models.list (every model it made ready) and models.remove.
    `strings` puts PAYLOAD in every str the §19 tables leave free (a task's `source` and
    `error`, another task's `model`, the store, a held model's name, revision, refs and error)
    and fails each model's first fetch (`error`: PAYLOAD); `revision` and `digest` of the
    asked model stay the hex digits §19 gives them, its `model` the name asked (stage.status
    is asked by it). `types` breaks every task: `bytes` -1 (§19: an int of bytes held)."""

    stage_tasks: dict[str, dict[str, Any]]
    """Model name → its latest task (§19: one per model and agent)."""
    _fetches: dict[str, int]
    calibrating: float | None
    """calibrate.start's minutes (None: none started)."""
    """Model name → its fetches polled (`strings` fails the first)."""

    def _stage(self, identity: bytes, type_: str, body: dict[str, Any], rid: str) -> None:
        model = body.get("model")
        name = model.split("@")[0] if isinstance(model, str) else None
        if type_ == "models.list":
            self._send(identity, "models.list.ok", self._models(), rid)
        elif type_ == "stage.status":
            if self.mode == "stage-forgets":  # restarted since: §19 keeps tasks until a stop
                self.stage_tasks.clear()
            tasks = [self._advance(task) for task in self.stage_tasks.values()]
            if self.mode == "strings":  # a task of another model: only the asked one counts
                tasks.append(self._task(self.text("org/other"), "receiver", "failed"))
            self._send(identity, "stage.status.ok", {"tasks": tasks}, rid)
        elif name is None or (type_ != "stage.prepare" and name not in self.stage_tasks):
            if type_ in ("stage.cancel", "models.remove"):
                message = self.text(f"nothing of {model!r} here")
                self._send(identity, "error", {"code": "not-held", "message": message}, rid)
            elif type_ == "stage.fetch" and name is not None:
                self._fetch(identity, name, body, rid)
            else:
                message = self.text(f"model {model!r} is not ORG/NAME[@REV]")
                self._send(identity, "error", {"code": "bad-model", "message": message}, rid)
        elif type_ == "stage.prepare":
            self.stage_tasks[name] = self._task(name, "source", "ready")
            self._send(identity, "stage.prepare.ok", self.stage_tasks[name], rid)
        elif type_ == "stage.fetch":
            self._fetch(identity, name, body, rid)
        elif type_ == "stage.cancel":
            task = self.stage_tasks[name]
            if task["state"] == "fetching":
                task.update(state="cancelled", finished=time.time())
            self._send(identity, "stage.cancel.ok", self._shown_task(task), rid)
        else:  # models.remove
            del self.stage_tasks[name]
            removed = [self.text(f"{name}@{STAGED_REVISION}")]
            self._send(identity, "models.remove.ok", {"removed": removed}, rid)

    def _fetch(self, identity: bytes, name: str, body: dict[str, Any], rid: str) -> None:
        task = self._task(name, "receiver", "fetching", source=body.get("source"))
        self.stage_tasks[name] = task
        self._send(identity, "stage.fetch.ok", self._shown_task(task), rid)

    def _advance(self, task: dict[str, Any]) -> dict[str, Any]:
        """A fetching task polled: failed (the first one polled in `strings`) or ready."""
        if task["state"] == "fetching":
            self._fetches[task["model"]] = self._fetches.get(task["model"], 0) + 1
            if self.mode == "strings" and self._fetches[task["model"]] == 1:
                task.update(state="failed", error=self.text("chunk 7 failed its hash 3 times"))
            else:
                task.update(state="ready", bytes=STAGED_SIZE, files_done=task["files"])
            task["finished"] = time.time()
        return self._shown_task(task)

    def _shown_task(self, task: dict[str, Any]) -> dict[str, Any]:
        shown = dict(task)
        if self.mode == "types":
            shown["bytes"] = -1
        return shown

    def _task(self, name: str, role: str, state: str, source: str | None = None) -> dict[str, Any]:
        """§19 A task, of a model of STAGED_SIZE bytes in 3 files."""
        ready = state == "ready"
        return {
            "model": name,
            "revision": STAGED_REVISION,
            "role": role,
            "state": state,
            "digest": STAGED_DIGEST,
            "bytes": STAGED_SIZE if ready else STAGED_SIZE // 2,
            "total": STAGED_SIZE,
            "resumed": 0 if ready else STAGED_SIZE // 4,
            "rate": 1e6,
            "capped": state == "fetching",
            "source": self.text(source or "10.0.0.9:5555") if role == "receiver" else None,
            "served": 0,
            "files": 3,
            "files_done": 3 if ready else 1,
            "error": self.text("rank 1 has the lock") if state == "failed" else None,
            "started": time.time() - 1,
            "finished": time.time() if ready else None,
        }

    def _models(self) -> dict[str, Any]:
        """models.list.ok: every model made ready here, and in `strings` HELD_MODEL mismatched
        (its `error` and refs PAYLOAD) and a model whose name and revision are PAYLOAD (the
        revision's first 7 characters are what a table shows)."""
        held = [
            {
                "model": name,
                "revision": STAGED_REVISION,
                "refs": ["main"],
                "state": "present",
                "digest": STAGED_DIGEST,
                "size": STAGED_SIZE,
                "bytes": STAGED_SIZE,
                "files": 3,
                "error": None,
            }
            for name, task in self.stage_tasks.items()
            if task["state"] == "ready"
        ]
        if self.mode == "strings":
            mismatched = {
                "model": HELD_MODEL,
                "revision": STAGED_REVISION,
                "refs": [self.text("main")],
                "state": "mismatch",
                "digest": STAGED_DIGEST,
                "size": STAGED_SIZE,
                "bytes": STAGED_SIZE,
                "files": 3,
                "error": self.text("config.json differs (sha256 00ff)"),
            }
            named = {"model": self.text(HELD_MODEL), "revision": PAYLOAD + STAGED_REVISION}
            held += [mismatched, mismatched | named | {"state": "present", "error": None}]
        return {"store": self.text("/Users/lab/.cache/huggingface/hub"), "models": held}


class Telemetry(FakeAgentCore):
    """The telemetry socket and history.get: a sample every poll_interval and an event now and
    then (`telemetry-types` corrupts them, and history.get.ok's samples), and the `flood` and
    `junk` window that starts with the first request."""

    def _sample(self) -> dict[str, Any]:
        seq = next(self._seq)
        if self.mode == "telemetry-types" and seq == 3:
            seq = 2**63
        return {
            "host": self.text(self.name),
            "seq": seq,
            "time": time.time(),
            "celsius": self.number(50.0 + seq % 7, math.nan, telemetry=True),
            "pressure": self.text("nominal"),
            "source": self.text("sim"),
            "sensor": self.text("TCMz"),
            "simulated": True,
            "state": "melting" if self.mode == "telemetry-types" else "ok",
            "trend_c_per_min": self.number(0.5, math.inf, telemetry=True),
            "pause_s_total": self.number(0.0, 1e308, telemetry=True),
            "jobs": [self._supervised(telemetry=True)],
            "storage_error": self.big("history: database or disk is full (/x)")
            if self.mode in ("strings", "huge")
            else None,
            "power_w": self.number(12.5, -math.inf, telemetry=True),
            "energy_j": self.number(100.0 + seq, math.nan, telemetry=True),
            "power": {
                "source": self.text("sim"),
                "simulated": True,
                "watts": {"cpu": 5.0, "gpu": 7.5},
                "joules": {"cpu": 50.0, "gpu": 50.0 + seq},
                "error": None,
            },
        }

    def _event(self, action: str) -> dict[str, Any]:
        return {
            "host": self.text(self.name),
            "seq": next(self._event_seq),
            "time": time.time(),
            "celsius": self.number(88.0, math.nan, telemetry=True),
            "action": action,
            "pid": 4242,
            "job": self.text("run-1"),
            "source": self.text("sim"),
            "simulated": True,
            "detail": self._summary()
            if action == "summary"
            else self.big("python -m mlx_lm lora --train"),
            "policy": None,
        }

    def _summary(self) -> str:
        """§10 `summary`: the job's account as JSON (docs/monitoring.md, Job summary), its
        texts corrupted in `strings`."""
        account = {"wall_s": 60.0, "paused_s": 1.5, "pauses": 1, "max_celsius": 88.0}
        texts = {"max_source": "sim", "max_sensor": "TCMz", "energy_note": "sim"}
        return json.dumps(account | {key: self.text(value) for key, value in texts.items()})

    def _publish_sample(self) -> None:
        sample = self._sample()
        self.samples.append(sample)
        del self.samples[:-3600]
        self.pub.send_multipart([b"sample", envelope("telemetry.sample", sample, None)])
        if len(self.samples) % 10 in (1, 2):  # a pause and a job's summary come early
            event = self._event(("pause", "summary", "resume")[len(self.events) % 3])
            self.events.append(event)
            del self.events[:-10000]
            self.pub.send_multipart([b"event", envelope("telemetry.event", event, None)])

    def _history(self, body: dict[str, Any]) -> dict[str, Any]:
        samples_after = body.get("samples_after") or 0
        events_after = body.get("events_after") or 0
        page = min(body.get("limit") or 1000, 200)
        samples = [s for s in self.samples if s["seq"] > samples_after]
        events = [e for e in self.events if e["seq"] > events_after]
        truncated = len(samples) > page or len(events) > page
        listed: list[dict[str, Any] | None] = list(samples[:page])
        if self.mode == "telemetry-types":
            listed = [None, *listed]
        return {
            "history": f"hist-{self.name}-{self.port}",
            "samples": listed,
            "events": events[:page],
            "truncated": truncated,
        }

    def _flooding(self) -> bool:
        if self.mode not in ("flood", "junk") or self._flood_began is None:
            return False
        return time.monotonic() - self._flood_began < self.flood_s

    def _flood_burst(self) -> None:
        """`flood`: a few hundred samples (kept, as an agent keeps its latest 3600); `junk`:
        a few dozen junk messages to every coordinator seen. The loop repeats it."""
        if self.mode == "flood":
            for _ in range(200):
                sample = self._sample()
                frames = [b"sample", envelope("telemetry.sample", sample, None)]
                with contextlib.suppress(zmq.Again):
                    self.pub.send_multipart(frames, zmq.NOBLOCK)
                self.samples.append(sample)
                self.flood_sent += 1
            del self.samples[:-3600]
            return
        junk = [
            [b"\xc1 junk"],
            [envelope("ping.ok", {"job": None, "time": time.time()}, new_id())],
            [envelope("bench.cell", {"job": "nojob", "index": 0, "record": {}}, new_id())],
            [b"one", b"two", b"three"],
            [envelope("telemetry.sample", self.samples[-1] if self.samples else {}, None)],
        ]
        for identity in self._identities:
            for frames in junk * 10:
                with contextlib.suppress(zmq.ZMQError):
                    self.router.send_multipart([identity, *frames], zmq.NOBLOCK)
                self.flood_sent += 1


class HostileAgent(Replies, BenchJobs, Staging, Telemetry):
    """One fake agent on a thread of its own (start()/stop(), or a `with` block). Everything it
    was asked is in `requests`, so a test can tell what the coordinator did after a bad reply.

    Its sockets, loop and the reading of requests are here; what it answers comes from Replies
    (the host, the `reply-*` modes), BenchJobs (the job stream, the `cells-*` modes) and
    Telemetry (samples, events, `flood`, `junk`), and the corruption of each field in
    `strings`, `huge` and `types` from FakeAgentCore."""

    def __init__(
        self,
        mode: str = "benign",
        *,
        name: str = "fake",
        curve: tuple[bytes, bytes] | None = None,
        poll_interval: float = 0.25,
        flood_s: float = 10.0,
        bad_index: Any = None,
        plain_cells: bool = False,
    ) -> None:
        """`bad_index`: `cells-range` sends that one of BAD_INDEXES alone (None: all);
        `plain_cells`: the cells' model, test and name are sent plain (cell_text)."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
        self.mode = mode
        self.name = name
        self.curve = curve
        self.poll_interval = poll_interval
        self.flood_s = flood_s
        self.bad_index = None if bad_index is None else (type(bad_index), bad_index)
        self.plain_cells = plain_cells
        self._dropped = False
        self._progressing = None
        self.requests: list[str] = []
        self.jobs: dict[str, Job] = {}
        self.ranks: dict[Any, Any] = {}
        self.stage_tasks = {}
        self.calibrating = None
        self._fetches = {}
        self.stopped: dict[Any, str] = {}
        self.samples: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.flood_sent = 0
        self._flood_began: float | None = None
        self._identities: set[bytes] = set()
        self._seq = itertools.count(1)
        self._event_seq = itertools.count(1)
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self.router = self._socket(zmq.ROUTER)
        self.pub = self._socket(zmq.XPUB)
        self.port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.telemetry_port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self._thread = threading.Thread(target=self._serve, name=f"hostile-{mode}", daemon=True)

    # --- life cycle --------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def public_key(self) -> str | None:
        return self.curve[0].decode("ascii") if self.curve else None

    def start(self) -> HostileAgent:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._ctx.destroy(linger=0)

    def __enter__(self) -> HostileAgent:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
        sock.setsockopt(zmq.HEARTBEAT_IVL, 2000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 6000)
        sock.setsockopt(zmq.LINGER, 0)
        if self.curve is not None:
            sock.curve_server = True
            sock.curve_publickey, sock.curve_secretkey = self.curve
        return sock

    # --- the loop ----------------------------------------------------------------------------

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.pub, zmq.POLLIN)
        next_sample = time.monotonic()
        while not self._stop.is_set():
            flooding = self._flooding()
            for sock, _ in poller.poll(0 if flooding else 20):
                if sock is self.pub:
                    self.pub.recv_multipart()  # a (un)subscription: nothing to do
                    continue
                self._receive()
            if flooding:
                self._flood_burst()
            if time.monotonic() >= next_sample:
                next_sample = time.monotonic() + self.poll_interval
                self._publish_sample()
                if self._progressing is not None and self._progressing.state == "running":
                    self._progress_again(self._progressing)

    def _receive(self) -> None:
        frames = self.router.recv_multipart()
        identity, rest = frames[0], frames[1:]
        self._identities.add(identity)
        if len(rest) != 1:
            self._send(identity, "error", {"code": "malformed", "message": "one frame"}, None)
            return
        try:
            envelope = msgpack.unpackb(rest[0], raw=False, strict_map_key=False)
        except Exception:
            self._send(identity, "error", {"code": "malformed", "message": "not msgpack"}, None)
            return
        if not isinstance(envelope, dict) or not isinstance(envelope.get("id"), str):
            self._send(identity, "error", {"code": "malformed", "message": "no id"}, None)
            return
        request_id, type_ = envelope["id"], envelope.get("type")
        if envelope.get("v") != PROTOCOL or isinstance(envelope.get("v"), bool):
            message = f"this agent speaks protocol {PROTOCOL}"
            self._send(identity, "error", {"code": "bad-version", "message": message}, request_id)
            return
        body = envelope.get("body")
        if type_ not in REQUESTS:
            message = self.text(f"unknown type {type_!r}")
            self._send(identity, "error", {"code": "unknown-type", "message": message}, request_id)
            return
        if not isinstance(body, dict):
            self._send(identity, "error", {"code": "bad-body", "message": "body"}, request_id)
            return
        self.requests.append(type_)
        if self._flood_began is None:
            self._flood_began = time.monotonic()
        self._answer(identity, type_, body, request_id)


def envelope(type_: str, body: dict[str, Any], re: str | None) -> bytes:
    """§4's map, encoded; a `huge` placeholder is filled to just under MAX_ENVELOPE."""
    message = {"v": PROTOCOL, "id": new_id(), "type": type_, "re": re, "body": body}
    data = msgpack.packb(message, use_bin_type=True)
    if HUGE.encode() not in data:
        return data
    # One placeholder grows to fill the envelope (str32: 5 header bytes); any other shrinks.
    room = MAX_ENVELOPE - (len(data) - len(HUGE) * data.count(HUGE.encode())) - 64
    fill = (PAYLOAD + "A" * room)[:room]
    filled = fill_first(message, fill)
    return msgpack.packb(filled, use_bin_type=True)


def fill_first(value: Any, fill: str) -> Any:
    """`value` with its first HUGE placeholder replaced by `fill`, and any other by ""."""
    state = {"done": False}

    def walk(item: Any) -> Any:
        if item == HUGE:
            if state["done"]:
                return ""
            state["done"] = True
            return fill
        if isinstance(item, dict):
            return {key: walk(val) for key, val in item.items()}
        if isinstance(item, list):
            return [walk(val) for val in item]
        return item

    return walk(value)


def curve_keypair(folder: Path) -> tuple[bytes, bytes]:
    """A CURVE keypair made and read back with zmq.auth (certificates in `folder`)."""
    import zmq.auth

    folder.mkdir(parents=True, exist_ok=True)
    _, secret_file = zmq.auth.create_certificates(str(folder), "hostile-agent")
    public, secret = zmq.auth.load_certificate(secret_file)
    assert secret is not None
    return public, secret


def main() -> None:
    """Run one fake agent until SIGTERM/SIGINT, after a ready line like `agent serve`'s."""
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--mode", choices=MODES, default="benign")
    args.add_argument("--name", default="fake")
    args.add_argument("--curve-dir", type=Path, help="be a CURVE server, keys made here")
    args.add_argument("--poll-interval", type=float, default=0.25)
    args.add_argument("--flood-s", type=float, default=10.0, help="how long `flood` floods")
    opts = args.parse_args()
    curve = curve_keypair(opts.curve_dir) if opts.curve_dir else None
    agent = HostileAgent(
        opts.mode,
        name=opts.name,
        curve=curve,
        poll_interval=opts.poll_interval,
        flood_s=opts.flood_s,
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    agent.start()
    key = f"curve-key={agent.public_key}" if agent.public_key else "INSECURE"
    print(
        f"hostile agent ({opts.mode}): listening on tcp://{agent.address} {key} "
        f"telemetry=tcp://127.0.0.1:{agent.telemetry_port}",
        flush=True,
    )
    while not done.wait(0.5):
        pass
    agent.stop()
    print(f"hostile agent: {len(agent.requests)} requests, {agent.flood_sent} flood messages")
    sys.exit(0)


if __name__ == "__main__":
    main()
