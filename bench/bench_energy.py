"""What does metering energy cost, and does it leave the benchmark's clock honest?

  1. the cost of one meter read, per power source this machine offers (a counter's file, a
     model, a replayed curve; on a Mac IOReport's delta and the SMC's PSTR), and of a fake
     powercap tree where there is no readable RAPL (labelled so);
  2. timing fidelity: the profiler's latency per iteration with energy metered around every
     timed iteration (the meter read before the clock starts and after `mx.eval` returns),
     against bench_profiling's bare loops on the same model (a prompt pass as mlx-lm makes
     it, a cached greedy decode; the issue asks for 0.97–1.03), and against the same profiler
     without a meter (what the reads alone change), for pp and for tg at a depth. 1.00 is
     identical.

Both sides of each comparison run in the same rounds, interleaved (the order rotates each
round), repeated (bench/support.py); each figure prints as median (min–max) over the rounds and
a ratio is taken round by round. In a round each side counts its fastest iteration: a loaded
machine only ever adds time, so the fastest is the best estimate of what an iteration costs. A
measurement that fails exits 1 with the reason.

    .venv/bin/python bench/bench_energy.py [--seq-len 128] [--decode-tokens 32] [--repeats 7]
        [--quick]
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import mlx.core as mx
from bench_profiling import bare_decode_samples, bare_prefill_samples
from support import BenchError, interleave, machine, parser, round_count, run, spread

from agent.cooling.guard import NullGuard
from agent.model import BUILTIN_CONFIGS, build_model
from agent.power.meter import EnergyMeter
from agent.power.registry import open_power_source
from agent.profiling.memory import random_tokens
from agent.profiling.speed import SpeedProfiler
from agent.profiling.watch import CellWatch
from agent.sensors.base import SourceUnavailable
from shared.benchmark.matrix import PREFILL, Cell
from shared.cooling.sources import power_auto_order

FIDELITY = (0.97, 1.03)
METERS = ("ioreport", "rapl", "smc", "macmon", "powermetrics")
"""Real meters, first choice for the fidelity run (a fake tree or a replay otherwise)."""


def fake_powercap(root: Path) -> None:
    zone = root / "class" / "powercap" / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    (zone / "energy_uj").write_text("123456789\n")


def meters(scratch: Path) -> dict[str, EnergyMeter]:
    """Every power source this machine offers that opens, by the name it is shown under."""
    curve = scratch / "watts.csv"
    curve.write_text("seconds,watts\n0,12.5\n")
    names = [*power_auto_order(platform.system()), "sim", f"replay:{curve}"]
    found: dict[str, EnergyMeter] = {}
    for name in names:
        try:
            source = open_power_source(name, interval_s=0.1)
        except SourceUnavailable as exc:
            print(f"  {name}: not here ({str(exc).split('; this machine')[0]})")
            continue
        found[name.split(":")[0]] = EnergyMeter(source, baseline_s=0)
    if "rapl" not in found and platform.system() == "Linux":
        tree = scratch / "sys"
        fake_powercap(tree)
        os.environ["MLX_FLEET_SYSFS_ROOT"] = str(tree)
        found["rapl (fake powercap tree)"] = EnergyMeter(open_power_source("rapl"), 0)
    return found


def read_cost_s(meter: EnergyMeter, reads: int) -> float:
    """Seconds per read, over `reads` back to back."""
    began = time.perf_counter()
    for _ in range(reads):
        if meter.read() is None:
            raise BenchError(f"{meter.source.name}: a read failed: {meter.last_error}")
    return (time.perf_counter() - began) / reads


def profiled_s(model, cell: Cell, meter: EnergyMeter | None, warmup: int, iterations: int) -> float:
    """The profiler's fastest iteration, with energy metered around every timed iteration when
    given a meter."""
    watch = CellWatch(cell, warmup, NullGuard(), meter)
    profiler = SpeedProfiler(timing=watch if meter else None, steps=watch.steps)
    if cell.mode == PREFILL:
        result = profiler.benchmark_tokens_per_sec(model, cell.n_prompt, warmup, iterations)
    else:
        result = profiler.benchmark_autoregressive(
            model, cell.n_gen, cell.n_depth, warmup, iterations
        )
    fields = watch.fields()
    if meter is not None and fields.get("energy_j") is None:
        raise BenchError(f"{meter.source.name} metered nothing: {fields.get('energy_note')}")
    return result["min_latency_ms"] / 1000


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--seq-len", type=int, default=128)
    args.add_argument("--decode-tokens", type=int, default=32)
    opts = args.parse_args()
    if opts.quick:
        opts.seq_len, opts.decode_tokens = 16, 4
    repeats = round_count(opts, default=7)
    iterations, warmup, reads = (2, 1, 200) if opts.quick else (10, 2, 5000)
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as scratch:
        found = meters(Path(scratch))
        print(f"\n1. cost of one meter read, µs: median (min–max) over {repeats} rounds")
        costs = interleave(
            {name: (lambda m=meter: read_cost_s(m, reads)) for name, meter in found.items()},
            repeats,
        )
        for name, values in costs.values.items():
            print(f"  {name:28s} {spread(values, 1e6, 1)}")
        chosen = next((name for name in found if name.startswith(METERS)), "replay")
        meter = found[chosen]
        model = build_model(BUILTIN_CONFIGS["small"](), bits=16)
        tokens = random_tokens(model, 1, opts.seq_len)
        mx.eval(tokens)
        prefill = Cell("small", 16, n_prompt=opts.seq_len, n_gen=0, n_depth=0, batch_size=1)
        decode = Cell(
            "small", 16, n_prompt=0, n_gen=opts.decode_tokens, n_depth=opts.seq_len, batch_size=1
        )
        print(
            f"\n2. timing fidelity with energy on ({chosen}), small/f16, {prefill.test} and "
            f"{decode.test}: each side's fastest iteration per round, ms, "
            f"and ratios round by round, median (min–max) over {repeats} rounds"
        )
        sides = {
            "prefill bare": lambda: min(bare_prefill_samples(model, tokens, warmup, iterations)),
            "prefill profiler": lambda: profiled_s(model, prefill, None, warmup, iterations),
            "prefill metered": lambda: profiled_s(model, prefill, meter, warmup, iterations),
            "decode bare": lambda: min(
                bare_decode_samples(model, tokens, opts.decode_tokens, warmup, iterations)
            ),
            "decode profiler": lambda: profiled_s(model, decode, None, warmup, iterations),
            "decode metered": lambda: profiled_s(model, decode, meter, warmup, iterations),
        }
        rounds = interleave(sides, repeats)
        for test in ("prefill", "decode"):
            to_bare = rounds.ratios(f"{test} metered", f"{test} bare")
            inside = FIDELITY[0] <= statistics.median(to_bare) <= FIDELITY[1]
            print(
                f"  {test:8s} bare {spread(rounds.values[f'{test} bare'], 1000)}, "
                f"metered {spread(rounds.values[f'{test} metered'], 1000)}: metered/bare "
                f"{spread(to_bare)} ({'within' if inside else 'OUTSIDE'} "
                f"{FIDELITY[0]}–{FIDELITY[1]}), metered/unmetered "
                f"{spread(rounds.ratios(f'{test} metered', f'{test} profiler'))}"
            )
        for each in found.values():
            each.close()


if __name__ == "__main__":
    run(main)
