"""How much memory does `coordinator monitor` take while one agent floods it, next to the same
monitor watching a well-behaved agent, and does it still stop when asked?

Both agents are tests/fakes/hostile_agent.py, in their own processes: `benign` publishes a
sample every 0.25 s; `flood` (or `junk`, --mode) does the same, then from the monitor's first
request on publishes samples as fast as it can (every one valid, numbered on, as if its poll
interval were 0) or fills the command socket with junk. Each side runs `coordinator monitor
--hosts FAKE --insecure` (the live dashboard, stdout to /dev/null) for --seconds, sampling the
monitor's RSS every 0.1 s (psutil) and reading its kernel high-water mark (Linux's VmHWM) at the
end; then sends it SIGINT (Ctrl-C, which ends monitor) and waits --stop-timeout seconds,
SIGKILL after. Printed: each side's peak RSS, the ratio flood / benign per round, how many
messages the flood sent, and whether each monitor ended on SIGINT within the timeout (with its
exit code). The rounds interleave the sides; figures are median (min–max) over the rounds.

    python bench/coordinator_flood.py [--seconds 30] [--mode flood|junk] [--repeats 1]
        [--stop-timeout 10] [--quick]

Everything stays on 127.0.0.1 and in temporary MLX_FLEET_HOMEs. Numbers are printed, never
asserted: no timing is asserted either.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from support import BenchError, high_water, interleave, machine, parser, round_count, run, spread

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fakes" / "hostile_agent.py"
COORDINATOR = Path(sys.executable).with_name("coordinator")
READY = re.compile(r"listening on tcp://(\S+)")
SENT = re.compile(r"(\d+) flood messages")


@dataclass
class Side:
    """What one side measured over its rounds."""

    peaks: list[float] = field(default_factory=list)
    endings: list[str] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)


class Fake:
    """One fake agent process; `stop()` ends it and returns how many flood messages it sent."""

    def __init__(self, mode: str, flood_s: float) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(FAKE), "--mode", mode, "--flood-s", str(flood_s)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        assert self.process.stdout is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if select.select([self.process.stdout], [], [], 0.2)[0]:
                line = self.process.stdout.readline()
                if match := READY.search(line):
                    self.address = match.group(1)
                    return
            if self.process.poll() is not None:
                raise BenchError(f"the {mode} fake exited: {self.process.stdout.read()[-500:]}")
        self.process.kill()
        raise BenchError(f"the {mode} fake did not get ready in 30 s")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            out, _ = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        match = SENT.search(out or "")
        return int(match.group(1)) if match else 0


def monitor_peak(mode: str, seconds: float, stop_timeout: float, side: Side) -> float:
    """Peak RSS (bytes) of one `coordinator monitor` watching a `mode` fake for `seconds`;
    records how it ended and what the fake sent into `side`."""
    fake = Fake(mode, flood_s=seconds + stop_timeout + 5)
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "MLX_FLEET_HOME": home, "COLUMNS": "200"}
        with open(Path(home) / "monitor.err", "w+", encoding="utf-8") as err:
            process = subprocess.Popen(
                [str(COORDINATOR), "monitor", "--hosts", fake.address, "--insecure"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
                start_new_session=True,
            )
            watched = psutil.Process(process.pid)
            peak, began = 0, time.monotonic()
            while time.monotonic() - began < seconds and process.poll() is None:
                try:
                    peak = max(peak, watched.memory_info().rss)
                except psutil.Error:
                    break
                time.sleep(0.1)
            peak = max(peak, high_water(process.pid))
            if process.poll() is not None:
                err.seek(0)
                side.endings.append(
                    f"exited {process.returncode} by itself after "
                    f"{time.monotonic() - began:.1f} s: {err.read()[-200:]!r}"
                )
            else:
                process.send_signal(signal.SIGINT)
                stopped = time.monotonic()
                try:
                    code = process.wait(timeout=stop_timeout)
                    side.endings.append(
                        f"ended on SIGINT in {time.monotonic() - stopped:.1f} s, exit {code}"
                    )
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    side.endings.append(f"did NOT end within {stop_timeout:g} s of SIGINT")
    side.sent.append(fake.stop())
    if not peak:
        raise BenchError(f"no RSS read from the monitor of the {mode} fake")
    side.peaks.append(peak)
    return float(peak)


def main() -> None:
    args = parser(__doc__.split("\n\n")[0])
    args.add_argument("--seconds", type=float, default=30.0, help="how long each monitor runs")
    args.add_argument("--mode", choices=["flood", "junk"], default="flood")
    args.add_argument("--stop-timeout", type=float, default=10.0, help="seconds after SIGINT")
    opts = args.parse_args()
    if opts.quick:
        opts.seconds = 3.0
    repeats = round_count(opts, default=1)
    sides = {"benign": Side(), opts.mode: Side()}
    rounds = interleave(
        {
            name: (
                lambda name=name: monitor_peak(name, opts.seconds, opts.stop_timeout, sides[name])
            )
            for name in sides
        },
        repeats,
    )
    mib = 1 / 2**20
    print(f"machine: {machine()}; {repeats} interleaved round(s) of {opts.seconds:g} s a side")
    print(f"   {'coordinator monitor against':40} {'peak RSS MiB':>24} {'× benign':>18}")
    print(
        f"   {'a benign fake (a sample / 0.25 s)':40} {spread(rounds.figures('benign'), mib):>24}"
    )
    print(
        f"   {f'a {opts.mode} fake':40} {spread(rounds.figures(opts.mode), mib):>24} "
        f"{spread(rounds.ratios(opts.mode, 'benign')):>18}"
    )
    sent = sides[opts.mode].sent
    print(f"   the {opts.mode} fake sent {', '.join(map(str, sent))} messages (per round)")
    for name, side in sides.items():
        for index, ending in enumerate(side.endings):
            print(f"   round {index + 1}, {name}: monitor {ending}")


if __name__ == "__main__":
    run(main)
