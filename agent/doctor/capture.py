"""`agent doctor --capture FILE`: every raw input this machine's sources read, poll by poll, in
the capture format (agent.sensors.capture), for a bug report or a test fixture. What cannot be
read here is left out of the polls, and the header lists why."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from agent.sensors.base import SourceUnavailable
from agent.sensors.capture import Poll, header_line, poll_line
from agent.sensors.smc import SMCError
from agent.sensors.sysfs import sysfs_root

Reader = Callable[[], Any]


def _smc(stack: ExitStack) -> Reader:
    from agent.thermal.smc import apple_smc
    from agent.thermal.smc_die import die_keys

    smc = apple_smc()
    stack.callback(smc.close)
    keys = die_keys(smc.keys())

    def read() -> dict[str, list[str]]:
        found = {}
        for key in keys:
            try:
                data_type, raw = smc.read(key)
            except SMCError:
                continue
            found[key] = [data_type, raw.hex()]
        return found

    return read


def _iohid(stack: ExitStack) -> Reader:
    from agent.thermal.iohid import live_hid

    client = live_hid()
    stack.callback(client.close)

    def read() -> dict[str, float]:
        hottest: dict[str, float] = {}
        for name, celsius in client.read():
            hottest[name] = max(celsius, hottest.get(name, celsius))
        return hottest

    return read


def _pressure(stack: ExitStack) -> Reader:
    from agent.thermal.pressure import PressureReader

    reader = PressureReader()
    stack.callback(reader.close)
    return reader.state


def _sysfs(stack: ExitStack) -> Reader:
    from agent.thermal.linux import collect_sysfs

    root = sysfs_root()
    if sys.platform != "linux" and root == Path("/sys"):
        raise SourceUnavailable(f"no /sys on {sys.platform}")
    if not collect_sysfs(root):
        raise SourceUnavailable(f"no thermal zone or hwmon file under {root}")
    return lambda: collect_sysfs(root)


OPENERS: dict[str, Callable[[ExitStack], Reader]] = {
    "smc": _smc,
    "iohid": _iohid,
    "pressure": _pressure,
    "sysfs": _sysfs,
}


def capture(
    path: Path, seconds: float, interval_s: float, machine: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    """Write a capture of `seconds` at one poll per `interval_s`: the number of polls, and the
    header's facts, which say which inputs were read (`inputs`) and why others were not
    (`missing`). Raises OSError when the file cannot be written."""
    with ExitStack() as stack:
        readers: dict[str, Reader] = {}
        missing: dict[str, str] = {}
        for name, opener in OPENERS.items():
            try:
                readers[name] = opener(stack)
            except (SourceUnavailable, SMCError, OSError) as exc:
                missing[name] = str(exc)
        facts = {**machine, "inputs": sorted(readers), "missing": missing}
        polls = 0
        with path.open("w", encoding="utf-8") as out:
            out.write(header_line(facts) + "\n")
            started = time.monotonic()
            while True:
                t = time.monotonic() - started
                poll: Poll = {"t": round(t, 3)}
                for name, read in readers.items():
                    value = read()
                    if value is not None:
                        poll[name] = value
                out.write(poll_line(poll) + "\n")
                out.flush()
                polls += 1
                due = started + polls * interval_s
                if due - started > seconds:
                    return polls, facts
                time.sleep(max(0.0, due - time.monotonic()))
