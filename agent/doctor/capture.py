"""`agent doctor --capture FILE`: every raw input this machine's sources read, poll by poll, in
the capture format (agent.sensors.capture), for a bug report or a test fixture. What cannot be
read here is left out of the polls, and the header lists why. The header also holds what a
first Mac hands back for parsers only tests have read: `sysctl -n kern.boottime` as it printed,
the recent kernel panic reports by name and first line (agent.awake.panics), and the pmgr DVFS
tables the clock residencies are decoded with (agent.clocks)."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack, suppress
from pathlib import Path
from queue import Empty, Queue
from typing import IO, Any

from agent.sensors.base import SourceUnavailable
from agent.sensors.capture import Poll, header_line, poll_line
from agent.sensors.smc import SMCError
from agent.sensors.sysfs import LiveSysfs
from shared.io.queues import drained

CAPTURE_TOOL_INTERVAL_S = 1.0
"""The tools' sample interval while capturing: one sample per poll."""
TOOL_STARTUP_S = 5.0

Reader = Callable[[], Any]


def _smc(stack: ExitStack) -> Reader:
    from agent.thermal.smc import apple_smc
    from agent.thermal.smc_die import FABRIC_PREFIX, die_keys

    smc = apple_smc()
    stack.callback(smc.close)
    every = smc.keys()
    keys = die_keys(every) + [key for key in every if key.startswith(FABRIC_PREFIX)]

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
    """The files the `linux` thermal source, the `rapl` meter and the `cpufreq` clocks read."""
    from agent.clocks.cpufreq import CPU_DIRS, CURRENT, MAXIMUM
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
        for path in view.glob(f"{CPU_DIRS}/{CURRENT}"):
            directory = path.rsplit("/", 1)[0]
            for name in (CURRENT, MAXIMUM):
                with suppress(OSError):  # a CPU going offline meanwhile
                    files[f"{directory}/{name}"] = view.read(f"{directory}/{name}")
        return files

    if not read():
        raise SourceUnavailable(
            f"no thermal zone, hwmon, powercap or cpufreq file under {view.root}"
        )
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


def _ioreport_states(stack: ExitStack) -> Reader:
    """The clock channels' cumulative residencies (agent.clocks.ioreport), as read: a replay
    takes two polls' difference, as the live source takes two reads'."""
    from agent.clocks.ioreport import live_states

    states = live_states()
    stack.callback(states.close)

    def read() -> list[list[Any]]:
        try:
            sample = states.sample()
        except OSError:
            return []
        return [
            [group, subgroup or None, channel, [[name, ticks] for name, ticks in residencies]]
            for (group, subgroup, channel), residencies in sample.items()
            if all(ticks >= 0 for _, ticks in residencies)  # a count, or not recorded
        ]

    return read


def clock_tables() -> dict[str, Any]:
    """The header's `pmgr`: the DVFS tables as hex (agent.clocks.decode.PMGR_KEYS), so a
    replay decodes the residencies with this Mac's own; `pmgr_missing` says why not."""
    if sys.platform != "darwin":
        return {}
    from agent.clocks.ioreport import read_pmgr

    try:
        return {"pmgr": {key: blob.hex() for key, blob in read_pmgr().items()}}
    except (SourceUnavailable, OSError) as exc:
        return {"pmgr_missing": str(exc)}


def _lines_of(stack: ExitStack, name: str, argv: list[str]) -> Reader:
    """A tool's lines as it prints them, those of each poll interval together; the first poll
    holds its first line, as a live source waits for its first sample."""
    from shared.io.processes import end_process

    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stack.callback(end_process, process)
    lines: Queue[str] = Queue()
    said: deque[str] = deque(maxlen=1)  # its last word on stderr, read all along so it never blocks
    threading.Thread(target=_pump, args=(process.stdout, lines.put), daemon=True).start()
    threading.Thread(target=_pump, args=(process.stderr, said.append), daemon=True).start()
    try:
        first = [lines.get(timeout=TOOL_STARTUP_S)]
    except Empty:
        end_process(process)
        why = f": {said[-1][:200]}" if said else ""
        raise SourceUnavailable(f"{name} printed nothing in {TOOL_STARTUP_S:g} s{why}") from None

    def read() -> list[str]:
        taken, first[:] = first[:], []
        return taken + drained(lines)

    return read


def _macmon(stack: ExitStack) -> Reader:
    from agent.sensors.process import macmon_command

    executable = shutil.which("macmon")
    if executable is None:
        raise SourceUnavailable("macmon not found on PATH (brew install macmon)")
    interval_ms = round(CAPTURE_TOOL_INTERVAL_S * 1000)
    return _lines_of(stack, "macmon", macmon_command(executable, interval_ms))


def _powermetrics(stack: ExitStack) -> Reader:
    """Its thermal and power samplers in one stream: Apple Silicon's pressure level and watts,
    an Intel Mac's die temperatures. Root, or sudo -n with a sudoers entry."""
    from agent.power.streams import POWERMETRICS_SAMPLERS
    from agent.sensors.process import powermetrics_command, sudo_for_root
    from agent.thermal.process import powermetrics_samplers

    executable = shutil.which("powermetrics")
    if executable is None:
        raise SourceUnavailable("powermetrics not found on PATH (it ships with macOS)")
    thermal = powermetrics_samplers(platform.machine())
    samplers = ",".join(thermal if "smc" in thermal else (*thermal, POWERMETRICS_SAMPLERS))
    interval_ms = round(CAPTURE_TOOL_INTERVAL_S * 1000)
    argv = powermetrics_command(executable, samplers, interval_ms, sudo_for_root(None))
    return _lines_of(stack, "powermetrics", argv)


def _pump(stream: IO[str] | None, put: Callable[[str], None]) -> None:
    for line in stream or ():
        put(line.rstrip("\n"))


OPENERS: dict[str, Callable[[ExitStack], Reader]] = {
    "smc": _smc,
    "iohid": _iohid,
    "pressure": _pressure,
    "ioreport": _ioreport,
    "ioreport_states": _ioreport_states,
    "tools.macmon": _macmon,
    "tools.powermetrics": _powermetrics,
    "sysfs": _sysfs,
}
"""Each input a capture may hold; `tools.TOOL` are the lines of TOOL, under `tools`."""


SYSCTL_TIMEOUT_S = 5.0


def boot_facts(sysctl_text: str | None, boot: float | None) -> dict[str, Any]:
    """`sysctl -n kern.boottime`'s text beside boot_time()'s (sysctlbyname) value, and whether
    parse_sysctl of the text agrees with it to the second; None for what is not there."""
    from agent.awake.boot import parse_sysctl

    parsed = parse_sysctl(sysctl_text) if sysctl_text else None
    agrees = None if parsed is None or boot is None else abs(parsed - boot) < 1.0
    return {"boot_time": boot, "sysctl": sysctl_text, "sysctl_parsed": parsed, "agrees": agrees}


def _sysctl_boottime() -> str | None:
    """What `sysctl -n kern.boottime` prints; None off a Mac or when it cannot run."""
    if sys.platform != "darwin":
        return None
    try:
        done = subprocess.run(
            ["sysctl", "-n", "kern.boottime"],
            capture_output=True,
            text=True,
            timeout=SYSCTL_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout or None


def machine_facts() -> dict[str, Any]:
    """The header's boot time and recent panic reports (agent.awake.panics: names and first
    lines only, a report's process table is not for a bug report)."""
    from agent.awake.boot import boot_time
    from agent.awake.panics import RECENT_S, scan

    panics = scan(time.time() - RECENT_S)
    return {
        "boot": boot_facts(_sysctl_boottime(), boot_time()),
        "panics": panics.reports,
        **({"panics_unreadable": panics.unreadable} if panics.unreadable else {}),
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
        facts = {**machine, **machine_facts(), "inputs": sorted(readers), "missing": missing}
        if any(name.startswith("tools.") for name in readers):
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
                    if value is None:
                        continue
                    group, _, tool = name.partition(".")
                    if tool:
                        poll.setdefault(group, {})[tool] = value
                    else:
                        poll[name] = value
                out.write(poll_line(poll) + "\n")
                out.flush()
                polls += 1
                due = started + polls * interval_s
                if due - started > seconds:
                    return polls, facts
                time.sleep(max(0.0, due - time.monotonic()))
