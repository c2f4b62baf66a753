"""Agents at the protocol level, for benches that need more agents than memory allows real ones
(a real agent's benchmark job is an MLX process): each speaks the current protocol exactly
(shared.wire.protocol builds and checks every message) on its own CURVE ROUTER, answers hello, info,
ping and bench.start, and replays a benchmark's cells as a real agent streams them: one
bench.progress naming the model, then each bench.cell `pace_s` apart, then bench.done.

Many agents share one process and one thread, so a hundred take a handful of processes. Started
with start_replay_agents(), which returns each agent's address and public key. Not a bench
script itself.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import zmq
from support import no_power_source

from shared.benchmark.matrix import Cell, MatrixSpec, expand
from shared.benchmark.results import cell_record
from shared.cooling.policy import ThermalPolicy
from shared.wire import protocol as p


@dataclass(frozen=True)
class Recorded:
    """What a replayed job sends: the model's info and one cell's metrics (every cell of the
    requested matrix gets them), as a real run of the same matrix measured them."""

    model: dict[str, Any]
    metrics: dict[str, Any]
    tokens: int
    """How many tokens the measured cell's iteration handled."""
    pace_s: float = 0.02

    def for_cell(self, cell: Cell) -> dict[str, Any]:
        """The metrics of `cell` at the measured rate: its latencies scaled by its tokens, so a
        record stays consistent (no mean faster than its fastest iteration) on any matrix."""
        scale = (cell.n_prompt + cell.n_gen) * cell.batch_size / self.tokens
        metrics = dict(self.metrics)
        for key in ("latency_ms", "std_latency_ms", "min_latency_ms", "median_latency_ms"):
            if metrics.get(key) is not None:
                metrics[key] *= scale
        if "samples_ms" in metrics:
            metrics["samples_ms"] = [sample * scale for sample in metrics["samples_ms"]]
        return metrics


def measured_here(pace_s: float = 0.02) -> Recorded:
    """The model info and a cell's metrics from a real run here of one small cell (pp8 on the
    built-in small model), replayed `pace_s` apart."""
    from agent.profiling.runner import run_matrix

    models: list[dict[str, Any]] = []
    spec = MatrixSpec(n_prompt=(8,), n_gen=(0,), models=("small",), warmup=0, iterations=1)
    (record,) = run_matrix(spec, on_model=models.append)
    keys = ("test_time", "tokens_per_sec", "std_tokens_per_sec", "latency_ms", "std_latency_ms")
    keys += ("min_latency_ms", "median_latency_ms", "samples_ms", "peak_memory_gb")
    metrics = {key: record[key] for key in keys if key in record}
    return Recorded(models[0], metrics, tokens=8, pace_s=pace_s)


@dataclass
class _Job:
    identity: bytes
    request: str
    job: str
    records: list[dict[str, Any]]
    due: float
    sent: int = -1
    """-1: bench.progress not sent yet; then the cells sent."""


@dataclass
class _Agent:
    name: str
    router: zmq.Socket
    jobs: list[_Job] = field(default_factory=list)


def _info(name: str) -> dict[str, Any]:
    return {
        "agent": f"replay {name}",
        "protocol": p.PROTOCOL_VERSION,
        "name": name,
        "machine": {"hostname": name, "device": "replay (protocol-level agent)"},
        "thermal": {"source": "none", "simulated": False, "reading": None, "error": None},
        "power": no_power_source("a replay agent has no power source"),
        "job": None,
        "telemetry_port": 1,  # no PUB here: `coordinator benchmark` never subscribes
        "poll_interval": 1.0,
        "policy": ThermalPolicy().to_dict(),
        "jobs": [],
        "history": f"replay-{name}",
        "storage": {"ok": True, "failing": []},
    }


def _answer(agent: _Agent, recorded: Recorded, identity: bytes, data: bytes) -> None:
    request = p.decode(data)
    if request.type == "hello":
        body = {"agent": "replay", "protocol": p.PROTOCOL_VERSION, "hostname": agent.name}
        reply = p.make("hello.ok", body | {"secure": True}, request.id)
    elif request.type == "info":
        reply = p.make("info.ok", _info(agent.name), request.id)
    elif request.type == "ping":
        reply = p.make("ping.ok", {"job": None, "time": time.time()}, request.id)
    elif request.type == "bench.start":
        cells = expand(MatrixSpec.from_dict(request.body["matrix"]))
        job = f"replay-{p.new_id()}"
        records = [cell_record(cell, recorded.for_cell(cell)) for cell in cells]
        agent.jobs.append(_Job(identity, request.id, job, records, time.monotonic()))
        reply = p.make("bench.start.ok", {"job": job, "cells": [c.name for c in cells]}, request.id)
    else:
        reply = p.error(
            p.UNKNOWN_TYPE, f"a replay agent does not answer {request.type}", request.id
        )
    agent.router.send_multipart([identity, p.encode(reply)])


def _stream(agent: _Agent, recorded: Recorded, now: float) -> None:
    """Send what each job has due: its model first, then one cell per pace."""
    for job in list(agent.jobs):
        if now < job.due:
            continue
        if job.sent < 0:
            body = {"job": job.job, "done": 0, "total": len(job.records), "model": recorded.model}
            message = p.make("bench.progress", body, job.request)
        elif job.sent < len(job.records):
            body = {"job": job.job, "index": job.sent, "record": job.records[job.sent]}
            message = p.make("bench.cell", body, job.request)
        else:
            body = {"job": job.job, "status": p.JOB_OK, "error": None, "cells": job.sent}
            message = p.make("bench.done", body, job.request)
            agent.jobs.remove(job)
        agent.router.send_multipart([job.identity, p.encode(message)])
        job.sent += 1
        job.due = now + recorded.pace_s


def _serve(ready: mp.Queue[Any], count: int, recorded: Recorded) -> None:
    ctx = zmq.Context()
    public, secret = zmq.curve_keypair()
    agents, poller = {}, zmq.Poller()
    for _ in range(count):
        router = ctx.socket(zmq.ROUTER)
        router.curve_server = True
        router.curve_publickey, router.curve_secretkey = public, secret
        port = router.bind_to_random_port("tcp://127.0.0.1")
        agents[router] = _Agent(f"replay{port}", router)
        poller.register(router, zmq.POLLIN)
        ready.put((f"127.0.0.1:{port}", public.decode("ascii")))
    while True:
        busy = any(agent.jobs for agent in agents.values())
        for router, _ in poller.poll(recorded.pace_s * 1000 / 4 if busy else 1000):
            while router.poll(0):
                _answer(agents[router], recorded, *router.recv_multipart())
        now = time.monotonic()
        for agent in agents.values():
            _stream(agent, recorded, now)


@contextmanager
def replay_agents(
    count: int, recorded: Recorded, per_process: int = 25
) -> Iterator[list[tuple[str, str]]]:
    """`count` replay agents in processes of `per_process`: their (HOST:PORT, public key),
    ended when the block exits."""
    context = mp.get_context("spawn")
    ready: mp.Queue[Any] = context.Queue()
    processes = []
    for first in range(0, count, per_process):
        size = min(per_process, count - first)
        process = context.Process(target=_serve, args=(ready, size, recorded), daemon=True)
        process.start()
        processes.append(process)
    try:
        yield [ready.get(timeout=120) for _ in range(count)]
    finally:
        for process in processes:
            process.terminate()
            process.join(10)
