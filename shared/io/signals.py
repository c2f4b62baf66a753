"""SIGTERM taken as Ctrl-C by a command that measures for long (`agent bench`, `coordinator
benchmark`): timeout(1), a CI cancel or a scheduler ends it as a user would, and what finished
is printed and kept; the exit code then says which signal it was (143, as a shell reports a
process SIGTERM ended, where Ctrl-C is 130). And how a message names a signal."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

from shared.exit_codes import EXIT_INTERRUPTED, EXIT_TERMINATED

_terminated: list[bool] = [False]
"""Whether SIGTERM came: a signal is the process's, so its record is too."""


def _interrupt(signum: int, frame: object) -> None:
    if _terminated[0]:
        return  # the run is already ending: a second SIGTERM must not cut the report short
    _terminated[0] = True
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside, the first SIGTERM raises KeyboardInterrupt in the main thread (later ones wait
    for the report); the handler before is put back after."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted_exit_code() -> int:
    """What a run cut short exits with: 143 after SIGTERM, 130 after Ctrl-C."""
    return EXIT_TERMINATED if _terminated[0] else EXIT_INTERRUPTED


def signal_name(signum: int) -> str:
    """How a message names a signal (a process ended by it: its return code negated):
    `SIGKILL`, or `signal 99` for a number the platform does not name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
