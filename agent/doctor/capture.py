"""`agent doctor --capture FILE`: every raw input this machine's sources read, poll by poll, in
the capture format (agent.sensors.capture), for a bug report or a test fixture. What cannot be
read here is left out of the polls, and the header lists why."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, suppress
from pathlib import Path
from queue import Empty, Queue
from typing import Any

from agent.sensors.base import SourceUnavailable
from agent.sensors.capture import Poll, header_line, poll_line
from agent.sensors.smc import SMCError
from agent.sensors.sysfs import LiveSysfs

CAPTURE_TOOL_INTERVAL_S = 1.0
"""macmon's sample interval while capturing: one line per poll."""
TOOL_STARTUP_S = 5.0

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
    """The files the `linux` thermal source and the `rapl` meter read."""
    from agent.power.rapl import POWERCAP_FILES, zone_dirs
    from agent.thermal.linux import collect_sysfs

    view = LiveSysfs()
    if sys.platform != "linux" and view.root == Path("/sys"):
        raise SourceUnavailable(f"no /sys on {sys.platform}")

    def read() -> dict[str, str]:
        files = collect_sysfs(Path(view.root))
        for directory in zone_dirs(view):
            for name in POWERCAP_FILES:
                with suppress(OSError):  # energy_uj is root's alone since Linux 5.10
                    files[f"{directory}/{name}"] = view.read(f"{directory}/{name}")
        return files

    if not read():
        raise SourceUnavailable(f"no thermal zone, hwmon or powercap file under {view.root}")
    return read


def _ioreport(stack: ExitStack) -> Reader:
    from agent.power.ioreport import live_report

    report = live_report()
    stack.callback(report.close)
    report.delta()  # the first delta runs from the subscription: the polls then each cover one

    def read() -> list[list[Any]]:
        try:
            return [[report.group, None, *row] for row in report.delta()]
        except OSError:
            return []

    return read


def _tools(stack: ExitStack) -> Reader:
    """macmon's lines as it prints them, those of each poll interval together."""
    from agent.sensors.process import end_process, macmon_command

    executable = shutil.which("macmon")
    if executable is None:
        raise SourceUnavailable("macmon not found on PATH (brew install macmon)")
    process = subprocess.Popen(
        macmon_command(executable, round(CAPTURE_TOOL_INTERVAL_S * 1000)),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    stack.callback(end_process, process)
    lines: Queue[str] = Queue()
    threading.Thread(target=_pump, args=(process, lines), daemon=True).start()
    try:  # the first poll holds a line, as a live source waits for its first sample
        first = [lines.get(timeout=TOOL_STARTUP_S)]
    except Empty:
        end_process(process)
        raise SourceUnavailable(f"macmon printed nothing in {TOOL_STARTUP_S:g} s") from None

    def read() -> dict[str, list[str]]:
        taken, first[:] = first[:], []
        with suppress(Empty):
            while True:
                taken.append(lines.get_nowait())
        return {"macmon": taken}

    return read


def _pump(process: subprocess.Popen[str], lines: Queue[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line.rstrip("\n"))


OPENERS: dict[str, Callable[[ExitStack], Reader]] = {
    "smc": _smc,
    "iohid": _iohid,
    "pressure": _pressure,
    "ioreport": _ioreport,
    "tools": _tools,
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
        if "tools" in readers:
            facts["tools_interval_s"] = CAPTURE_TOOL_INTERVAL_S
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
