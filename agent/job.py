"""One benchmark job in its own process: `python -m agent.job --fd N`, started by `agent serve`.

Why a child: a crash or an out-of-memory kill takes the job down, not the daemon; MLX's peak
memory starts clean for every job; and the daemon stays free to answer ping and info.

The daemon writes one msgpack map {"matrix": MatrixSpec dict, "thermal_source": name or nil} to
the child's stdin. The child writes a msgpack stream to file descriptor N:
{"kind": "model", "info": ...} per built model, {"kind": "cell", "record": ...} per finished cell,
and last {"kind": "done", "status": "ok" | "cancelled" | "failed", "error": text or nil}.
SIGTERM cancels: the cell being measured is dropped and "done" says "cancelled".
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from typing import Any, BinaryIO

import msgpack

from agent.cooling import ThermalGuard
from agent.profiling.runner import error_text, run_matrix
from agent.thermal import ThermalMonitor
from shared.matrix import MatrixSpec
from shared.protocol import JOB_CANCELLED, JOB_FAILED, JOB_OK


class JobCancelled(BaseException):
    """Raised in the job's main thread by SIGTERM. A BaseException, like KeyboardInterrupt, so
    the runner's per-cell `except Exception` lets it end the whole job."""


def _cancel(signum: int, frame: object) -> None:
    raise JobCancelled()


def write(out: BinaryIO, item: dict[str, Any]) -> None:
    """One whole item: SIGTERM is held off meanwhile so it never cuts an item in half."""
    data = msgpack.packb(item, default=str)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        out.write(data)
        out.flush()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def run(request: dict[str, Any], out: BinaryIO) -> None:
    """Run the matrix, streaming every model and cell; always ends with one "done"."""

    status, error = JOB_OK, None
    monitor = None
    try:
        spec = MatrixSpec.from_dict(request["matrix"])
        guard = None
        if request.get("thermal_source"):
            monitor = ThermalMonitor(source=request["thermal_source"])
            guard = ThermalGuard(monitor)
        records = run_matrix(spec, guard=guard,
                             on_model=lambda info: write(out, {"kind": "model", "info": info}))
        for record in records:
            write(out, {"kind": "cell", "record": record})
    except JobCancelled:
        status, error = JOB_CANCELLED, "cancelled"
    except Exception as exc:  # a failed job is reported, never a silent exit
        status, error = JOB_FAILED, error_text(exc)
    finally:
        if monitor is not None:
            monitor.close()
    write(out, {"kind": "done", "status": status, "error": error})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agent.job", description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="where to write the stream")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _cancel)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the daemon's terminal is its call
    request = msgpack.unpackb(sys.stdin.buffer.read(), raw=False)
    # A broken pipe means the daemon is gone: nobody is left to tell.
    with contextlib.suppress(BrokenPipeError), os.fdopen(args.fd, "wb") as out:
        run(request, out)


if __name__ == "__main__":
    main()
