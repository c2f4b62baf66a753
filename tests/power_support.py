"""A fake powercap tree whose RAPL counter advances at a known rate and wraps, written by a
thread the way the kernel updates it (whole values, atomically replaced, about every
millisecond), for tests that check joules and watts against that rate."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from types import TracebackType


def powercap_zone(root: Path, zone: str, name: str, energy_uj: int, wraps_at: int) -> Path:
    """One zone under ROOT/class/powercap; returns its directory."""
    directory = root / "class" / "powercap" / zone
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "name").write_text(f"{name}\n")
    (directory / "max_energy_range_uj").write_text(f"{wraps_at}\n")
    (directory / "energy_uj").write_text(f"{energy_uj}\n")
    return directory


def write_counter(path: Path, value: int) -> None:
    """Replace the file whole, so a reader sees the old value or the new one, never half."""
    temporary = path.with_name(f".{path.name}.{threading.get_ident()}")
    temporary.write_text(f"{value}\n")
    os.replace(temporary, path)


class RaplCounter:
    """A package zone at ROOT whose energy_uj grows by `watts` per second from `start_uj`,
    wrapping at `wraps_at`, updated every `tick_s` by a thread: `with RaplCounter(...) as c`."""

    def __init__(
        self,
        root: Path,
        watts: float,
        wraps_at: int,
        start_uj: int = 0,
        tick_s: float = 0.001,
    ) -> None:
        self.watts = watts
        self.wraps_at = wraps_at
        self.start_uj = start_uj
        self.tick_s = tick_s
        self.path = powercap_zone(root, "intel-rapl:0", "package-0", start_uj, wraps_at) / (
            "energy_uj"
        )
        self.wraps = 0
        self.wrapped_at: list[float] = []
        """When (time.time()) each wrap was written, to the tick."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-rapl", daemon=True)
        self._opened = time.monotonic()

    def _run(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            # A real-time priority where we may have one (root on Linux): the benchmark under
            # test keeps every core busy, and a starved writer would lag behind its clock.
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        while not self._stop.is_set():
            counted = self.start_uj + int((time.monotonic() - self._opened) * self.watts * 1e6)
            wraps = counted // self.wraps_at
            if wraps > self.wraps:
                self.wrapped_at.append(time.time())
            self.wraps = wraps
            write_counter(self.path, counted % self.wraps_at)
            time.sleep(self.tick_s)

    def __enter__(self) -> RaplCounter:
        self._opened = time.monotonic()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
