"""One benchmark job in its own process: `python -m agent.daemon.benchmark.child --fd N`, started by
`agent serve`.

Why a child: a crash or an out-of-memory kill takes the job down, not the daemon; MLX's peak
memory starts clean for every job; and the daemon stays free to answer ping and info.

The daemon writes to the child's stdin one msgpack map {"matrix": MatrixSpec dict, "thermal":
{"source": name, "simulated": bool, "poll_interval": s}, "power": {"source": the daemon's power
source as it resolved it (or "none"), "baseline_s": the idle baseline, "why": the daemon's reason
when it has none}, "sustain": a SustainPlan map or nil, "first": the index of the first cell to run
(a new process after a crash runs the cells left), "group": bench.start's `group` or nil (the job is
then one rank of it: agent.profiling.rank_group), "check_tokens": the greedy tokens each model
decodes as its correctness check}, then one {"reading": map or nil, "policy": ThermalPolicy map} per
poll it takes, and {"policy": map} when a coordinator pushes a new one, for as long as the job runs.
The child never opens a sensor ("one sensor reader serves every job"): each poll goes to its
ThermalGuard's monitor, whose cooling gate (the one rule, shared.cooling.policy.CoolingGate, as
`agent run` applies it) decides; its cells name the daemon's source. A power meter is a measuring
instrument, read around each timed iteration: the child opens the daemon's power source itself
(agent.power.registry.meter_or_reason), and a source it cannot open leaves its cells' energy N/A
with the reason. The child writes a msgpack stream to file descriptor N: {"kind": "model", "info":
...} per built model, {"kind": "begin", "index": i} as cell i starts (so a crash is pinned on its
cell), {"kind": "cell", "record": ...} per finished cell, {"kind": "event", "action", "celsius",
"time", "detail"} per action of its gate (the daemon publishes them: its view of the job is the
job's own), {"kind": "cooling", "wait": CoolWait map} as a cell waits to start cool and every few
seconds of the wait (shared.cooling.cool_start), {"kind": "phase", "phase": map} as a model starts
building or the idle baseline starts (agent.profiling.runner.PhaseSink), {"kind": "pause", "pause":
PauseView map} as a cooling pause starts, every PAUSE_REPORT_S of it and as it ends
(shared.benchmark.status), and last {"kind": "done", "status": "ok" | "cancelled" | "failed",
"error": text or nil}. SIGTERM cancels: the cell being measured is dropped (a sustained cell
is kept, failed `interrupted`, with the windows it finished) and "done" says "cancelled".
The child dies with the daemon: SIGKILL from the kernel on Linux (PR_SET_PDEATHSIG), and on
any system as soon as its stdin reaches its end.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import faulthandler
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from agent.awake.assertion import hold_awake
from agent.cooling.scheduler import ThermalGuard
from agent.power.registry import meter_or_reason
from agent.profiling.rank_group import join
from agent.profiling.runner import error_text, run_matrix
from agent.sensors.base import SourceInfo
from agent.thermal import ThermalMonitor, ThermalReading
from agent.thermal.base import reading_from_wire
from agent.thermal.fed import FedSource
from shared.benchmark import faults, gpu_errors
from shared.benchmark.matrix import MatrixSpec
from shared.benchmark.status import PauseView
from shared.benchmark.sustain import SustainPlan
from shared.cooling.policy import Action, ThermalPolicy
from shared.distributed.group import BenchGroup
from shared.wire.protocol import JOB_CANCELLED, JOB_FAILED, JOB_OK

PR_SET_PDEATHSIG = 1
"""From <linux/prctl.h>."""
EXIT_ORPHANED = 1
"""Our exit code when the daemon died under us (nobody reads it)."""
PAUSE_REPORT_S = 5.0
"""How often a pause under way is reported: each report is progress to a coordinator."""


class JobCancelled(KeyboardInterrupt):
    """Raised in the job's main thread by SIGTERM. A KeyboardInterrupt (a BaseException), so
    the runner's per-cell `except Exception` lets it end the whole job, and a sustained cell
    is yielded first with the windows it finished, as on Ctrl-C (agent.profiling.runner)."""


def _cancel(signum: int, frame: object) -> None:
    raise JobCancelled()


_writing = threading.Lock()
"""Cells come from the main thread and gate events from the readings' thread: one item at a
time."""


def write(out: BinaryIO, item: dict[str, Any]) -> None:
    """One whole item: SIGTERM is held off meanwhile so it never cuts an item in half."""
    data = msgpack.packb(item, default=str)
    with _writing:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            out.write(data)
            out.flush()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def items(fd: int) -> Iterator[dict[str, Any]]:
    """The daemon's msgpack maps as they arrive on `fd`, until it closes its end."""
    unpacker = msgpack.Unpacker(raw=False)
    while data := os.read(fd, 65536):
        unpacker.feed(data)
        yield from unpacker


def follow(updates: Iterator[dict[str, Any]], source: FedSource, guard: ThermalGuard) -> None:
    """Hand each of the daemon's polls and policies to the guard until the daemon closes our
    stdin, which it does only after we ended: before that, it means the daemon died, and
    nobody is left to take our cells, so we go at once (no orphan)."""
    for update in updates:
        guard.scheduler.policy = ThermalPolicy.from_dict(update["policy"])
        if "reading" in update:
            reading = reading_from_wire(update["reading"])
            source.feed(reading)
            guard.monitor.record(reading)
        if isinstance(update.get("clock"), dict):
            guard.record_clock(update["clock"])
    source.end("the agent stopped sending readings")
    os._exit(EXIT_ORPHANED)


def die_with(parent: int) -> None:
    """Linux: the kernel SIGKILLs us the moment `parent` (the daemon) dies (PR_SET_PDEATHSIG,
    prctl(2)); then exit if it is already gone. Elsewhere (macOS has no such call) stdin's end
    of file does it (follow)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(EXIT_ORPHANED)


def begin(out: BinaryIO, index: int) -> None:
    """Cell `index` starts: say so; then, when MLX_FLEET_INJECT injects a gpu-error into it,
    die as Metal's uncaught exception kills MLX: its line on stderr, then SIGABRT."""
    write(out, {"kind": "begin", "index": index})
    try:
        injected = faults.for_cell(faults.from_environ(), index + 1)
    except ValueError:
        return
    if "gpu-error" in injected:
        print(gpu_errors.LINES[injected["gpu-error"] or "Timeout"], file=sys.stderr, flush=True)
        os.abort()


class PauseReports:
    """A cooling pause as the job lives it, written as it starts, every PAUSE_REPORT_S while it
    lasts (so a coordinator sees a paused job progress, not hang) and as it ends."""

    def __init__(self, out: BinaryIO, source: str) -> None:
        self.out, self.source = out, source
        self._lock = threading.Lock()
        self._started: float | None = None
        self._reading: ThermalReading | None = None
        self._tick = threading.Event()
        threading.Thread(target=self._ticks, name="pause-reports", daemon=True).start()

    def heard(self, action: Action, reading: ThermalReading | None) -> None:
        with self._lock:
            if action is Action.PAUSE and self._started is None:
                self._started, self._reading = time.monotonic(), reading
                self._write(done=False)
            elif action in (Action.RESUME, Action.STOP) and self._started is not None:
                self._write(done=True)
                self._started = None

    def _ticks(self) -> None:
        while True:
            self._tick.wait(PAUSE_REPORT_S)
            with self._lock:
                if self._started is not None:
                    self._write(done=False)

    def _write(self, done: bool) -> None:
        assert self._started is not None
        reading = self._reading
        pause = PauseView(
            reading.celsius if reading else None,
            reading.pressure if reading else None,
            self.source,
            reading.sensor if reading else None,
            time.monotonic() - self._started,
            done,
        )
        write(self.out, {"kind": "pause", "pause": pause.to_dict()})


def run(request: dict[str, Any], updates: Iterator[dict[str, Any]], out: BinaryIO) -> None:
    """Run the matrix under the daemon's readings, streaming every model and cell; always ends
    with one "done"."""
    status, error = JOB_OK, None
    group = BenchGroup.from_wire(request["group"]) if request.get("group") else None
    thermal = request["thermal"]
    source = FedSource(SourceInfo(thermal["source"], thermal["simulated"]))
    pauses = PauseReports(out, thermal["source"])

    def report(action: Action, reading: ThermalReading | None, reason: str | None) -> None:
        pauses.heard(action, reading)
        when = reading.time if reading else time.time()
        celsius = reading.celsius if reading else None
        event = {"action": action.value, "celsius": celsius, "time": when, "detail": reason}
        write(out, {"kind": "event", **event})

    monitor = ThermalMonitor(thermal["poll_interval"], source=source)
    guard = ThermalGuard(
        monitor,
        on_action=report,
        on_cool_wait=lambda wait: write(out, {"kind": "cooling", "wait": wait.to_dict()}),
    )
    power = request["power"]
    meter = meter_or_reason(
        power["source"], power["baseline_s"], thermal["poll_interval"], power["why"]
    )
    threading.Thread(
        target=follow, args=(updates, source, guard), name="agent-readings", daemon=True
    ).start()
    try:
        spec = MatrixSpec.from_dict(request["matrix"])
        sustain = request.get("sustain")
        rank_group = None
        if group is not None:
            # Joining waits for every peer, holding the GIL (MLX 0.32's ring setup): a cancel's
            # SIGTERM cannot land meanwhile, and the agent kills the job after its grace.
            with tempfile.TemporaryDirectory(prefix="mlx-fleet-rank-") as folder:
                rank_group = join(group, Path(folder))
        records = run_matrix(
            spec,
            guard=guard,
            on_model=lambda info: write(out, {"kind": "model", "info": info}),
            first=request.get("first", 0),
            on_begin=lambda index: begin(out, index),
            energy=meter,
            sustain=SustainPlan.from_dict(sustain) if sustain else None,
            on_phase=lambda phase: write(out, {"kind": "phase", "phase": phase}),
            rank_group=rank_group,
            check_tokens=request.get("check_tokens") or 0,
        )
        with hold_awake(f"benchmark job (pid {os.getpid()})"):  # records is lazy: cells run here
            for record in records:
                write(out, {"kind": "cell", "record": record})
    except JobCancelled:
        status, error = JOB_CANCELLED, "cancelled"
    except Exception as exc:  # a failed job is reported, never a silent exit
        status, error = JOB_FAILED, error_text(exc)
    finally:
        guard.monitor.close()
        meter.close()
    write(out, {"kind": "done", "status": status, "error": error})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m agent.daemon.benchmark.child", description=__doc__
    )
    parser.add_argument("--fd", type=int, required=True, help="where to write the stream")
    parser.add_argument("--parent", type=int, help="the daemon's pid: we die with it")
    args = parser.parse_args(argv)
    if args.parent is not None:
        die_with(args.parent)
    faulthandler.enable()  # a crash leaves its Python stacks in the log the daemon quotes
    signal.signal(signal.SIGTERM, _cancel)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the daemon's terminal is its call
    stream = items(sys.stdin.fileno())
    request = next(stream)
    # A broken pipe means the daemon is gone: nobody is left to tell.
    with contextlib.suppress(BrokenPipeError), os.fdopen(args.fd, "wb") as out:
        run(request, stream, out)


if __name__ == "__main__":
    main()
