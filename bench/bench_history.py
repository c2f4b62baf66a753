"""`coordinator history` over a lab's week, next to a plain SQL aggregate over the same rows.

A store of D days x H hosts at 1 Hz (silences, missing readings, a job paused when hot, a pause
event an hour and a half) is written through the project's own TelemetryStore, once, and kept
with --db for the next run. Then, in interleaved rounds, each a fresh process:
  1. `coordinator history --since Dd --format json`, against a plain `SELECT host, COUNT(*),
     MIN, AVG, MAX ... GROUP BY host` over the same rows: wall time and peak RSS;
  2. `coordinator history --since 2h --format json`, wall time (the store holds D days).
The figures history prints are checked against the plain aggregate's (samples, min, max, mean).

    .venv/bin/python bench/bench_history.py [--days 7] [--hosts 10] [--db PATH] [--repeats 5]
        [--quick]

Numbers are printed, never asserted.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from support import BenchError, child_usage, interleave, machine, parser, round_count, run, spread

BIN = Path(sys.executable).parent
PLAIN = (
    "import json, sqlite3, sys; conn = sqlite3.connect(sys.argv[1]); print(json.dumps("
    "conn.execute('SELECT host, COUNT(*), MIN(celsius), AVG(celsius), MAX(celsius) FROM "
    "samples WHERE time >= ? GROUP BY host', (float(sys.argv[2]),)).fetchall()))"
)
"""The baseline, in a fresh process like history: Python, sqlite3, one aggregate."""


def fill(path: Path, hosts: int, seconds: int, end: float) -> None:
    """`hosts` x `seconds` samples at 1 Hz ending at `end`, through TelemetryStore.add."""
    from coordinator.telemetry.store import TelemetryStore
    from shared.cooling.policy import ThermalPolicy

    rng = random.Random(1)
    start = end - seconds
    job = {"job": "j1", "pid": 4242, "command": "python -m mlx_lm lora --train", "kind": "run"}
    with TelemetryStore(path) as store:
        for index in range(hosts):
            store.record_policy(f"mac{index:02d}:5555", ThermalPolicy().to_dict(), start - 60)
        for hour in range(0, seconds, 3600):
            rows, events = [], []
            for index in range(hosts):
                name = f"mac{index:02d}:5555"
                for t in range(hour, min(hour + 3600, seconds)):
                    if (t // 600 + index) % 97 == 0 and t % 600 < 120:
                        continue  # a two-minute silence now and then
                    celsius = 70 + 12 * math.sin((t + 977 * index) / 5400) + rng.random() * 6
                    paused = celsius >= 85
                    body = {
                        "time": start + t + index * 0.01,
                        "celsius": round(celsius, 2) if t % 1000 else None,
                        "pressure": None,
                        "source": "sim",
                        "sensor": None,
                        "simulated": True,
                        "state": "pause" if paused else "ok",
                        "trend_c_per_min": 0.1,
                        "pause_s_total": 0.0,
                        "jobs": [job | {"state": "paused" if paused else "running"}],
                        "seq": t + 1,
                        "storage_error": None,
                        "power_w": None,
                        "energy_j": None,
                        "power": None,
                    }
                    rows.append((name, body))
                    if t % 5400 == 0:
                        event = {"time": body["time"], "job": "j1", "pid": 4242, "action": "pause"}
                        event |= {"source": "sim", "simulated": True, "celsius": celsius}
                        events.append((name, event | {"detail": None, "policy": None, "seq": t}))
            store.add(rows, events)


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--days", type=float, default=7.0)
    args.add_argument("--hosts", type=int, default=10)
    args.add_argument("--db", type=Path, default=None, help="keep the store here (reused)")
    opts = args.parse_args()
    if opts.quick:
        opts.days, opts.hosts = 0.2, 2
    repeats = round_count(opts)
    with tempfile.TemporaryDirectory(prefix="mlx-fleet-bench-") as tmp:
        home = Path(tmp)
        db = opts.db or home / "week.sqlite"
        marker = db.with_suffix(".json")
        seconds = int(opts.days * 86400)
        if not db.exists():
            began = time.monotonic()
            end = time.time()
            fill(db, opts.hosts, seconds, end)
            marker.write_text(json.dumps({"end": end}))
            print(f"wrote {db} in {time.monotonic() - began:.0f} s")
        end = json.loads(marker.read_text())["end"]
        (home / "coordinator-telemetry.sqlite").symlink_to(db.resolve())
        env = {**os.environ, "MLX_FLEET_HOME": str(home)}
        # history's --since is relative to its own clock; the store ends at `end`; a minute
        # more than the store holds, so that both sides read every row
        since = end - seconds - 60
        span = f"{(time.time() - since) / 3600:.6f}h"
        recent = f"{(time.time() - end) / 3600 + 2:.6f}h"
        print(
            f"{opts.hosts} hosts x {opts.days:g} days at 1 Hz, {db.stat().st_size / 1e6:.0f} MB; "
            f"{repeats} interleaved rounds"
        )
        print(f"machine: {machine()}")
        memory: dict[str, list[int | None]] = {"history": [], "plain": []}

        def history(since: str, key: str | None) -> float:
            command = [str(BIN / "coordinator"), "history", "--since", since, "--format", "json"]
            wall, rss = child_usage(command, env)
            if key:
                memory[key].append(rss)
            return wall

        def plain() -> float:
            wall, rss = child_usage([sys.executable, "-c", PLAIN, str(db), str(since)])
            memory["plain"].append(rss)
            return wall

        rounds = interleave(
            {
                "history": lambda: history(span, "history"),
                "plain": plain,
                "recent": lambda: history(recent, None),
            },
            repeats,
        )
        check(db, since, span, env)
    values = rounds.values
    print(f"\n{'':44} {'wall s':>22} {'peak RSS MB':>22} {'× plain':>20}")
    print(
        f"{'plain SQL aggregate (GROUP BY host)':44} {spread(values['plain']):>22} "
        f"{spread(memory['plain'], 1e-6, 0):>22}"
    )
    print(
        f"{f'coordinator history --since {opts.days:g}d':44} {spread(values['history']):>22} "
        f"{spread(memory['history'], 1e-6, 0):>22} {spread(rounds.ratios('history', 'plain')):>20}"
    )
    print(f"{'coordinator history --since 2h':44} {spread(values['recent']):>22}")


def check(db: Path, since: float, span: str, env: dict[str, str]) -> None:
    """History's samples, min, max and mean per host equal the plain aggregate's."""
    import sqlite3
    import subprocess

    printed = subprocess.run(
        [str(BIN / "coordinator"), "history", "--since", span, "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    ours = {row["host"]: row for row in json.loads(printed.stdout)["hosts"]}
    with sqlite3.connect(db) as conn:
        query = (
            "SELECT host, COUNT(*), MIN(celsius), AVG(celsius), MAX(celsius) FROM samples "
            "WHERE time >= ? GROUP BY host"
        )
        plain = conn.execute(query, (since,)).fetchall()
    for host, count, low, mean, high in plain:
        row = ours.get(host)
        if row is None or (row["samples"], row["min_c"], row["max_c"]) != (count, low, high):
            raise BenchError(f"history and the plain aggregate disagree on {host}")
        if not math.isclose(row["mean_c"], mean, rel_tol=1e-12):
            raise BenchError(f"history's mean for {host} is {row['mean_c']}, SQL says {mean}")
    print(f"checked: history's samples, min, max, mean = the plain aggregate's, {len(plain)} hosts")


if __name__ == "__main__":
    run(main)
