"""MLX's device, asked in a child process, so that what MLX does to a process cannot end ours.

When macOS lists no Metal device (headless, sandboxed or virtualized sessions; seen on macOS 26
and M5 Macs), MLX before 0.31.2 indexed the empty list in `metal::Device::Device()` and the
Objective-C NSRangeException aborted the process (SIGABRT) before Python could catch anything
(ml-explore/mlx#3397, #2691; jundot/omlx#428, #898). ml-explore/mlx#3428, first released in
0.31.2, raises a RuntimeError instead. Either way the agent and `agent doctor` only ever touch
the device here: an abort, a crash, a hang or an error of the child is a DeviceProbe that says
what happened and the fix (docs/thermal.md, "Never abort, always say why").

The child (`python -m agent.profiling.device_probe [--bench SECONDS] [--bandwidth BYTES]`)
prints one JSON line {"facts": ...}, then with --bench one {"bench": ...} (doctor's matmul), with
--bandwidth one {"bandwidth": ...} (level 2's memory probe, shared.benchmark.bandwidth), or
{"error": ...} for a Python exception; the parent keeps whatever came before the child died.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from shared.io.signals import signal_name

PROBE_TIMEOUT_S = 60.0
"""How long a probe may take: the import and the device's first use (a cold Mac's Metal
shader cache included), and doctor's 1-second benchmark."""
MIN_MLX = (0, 31, 2)
"""The first MLX release that raises an error rather than aborting on an empty Metal device
list (ml-explore/mlx#3428, commit 7d40a4f, in tag v0.31.2): pyproject.toml's floor."""
MATMUL_SIZE = 256
NO_DEVICE_FIX = (
    "macOS gave MLX no Metal device: run the agent in a logged-in user's session (its "
    "LaunchAgent; not a VM, not SSH alone), reboot if it persists, and keep MLX >= "
    f"{'.'.join(map(str, MIN_MLX))} (pip install -U mlx) so that it reports this as an error "
    "instead of aborting (ml-explore/mlx#3397, #3428)"
)
_REASON = re.compile(r"exception|reason|error|abort|assert", re.IGNORECASE)


@dataclass(frozen=True)
class DeviceProbe:
    """What the child told: the device's `facts` and doctor's `bench` ({"gflops", "error"})
    when asked, each None when it did not come back; `failure` says why one asked for is
    missing, with the `fix`."""

    facts: dict[str, Any] | None
    bench: dict[str, float] | None = None
    failure: str | None = None
    fix: str | None = None
    bandwidth: dict[str, Any] | None = None
    """The memory probe's raw timings when asked (shared.benchmark.bandwidth.RAW)."""


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """`0.31.2` (or `0.32.0.dev20260101`) -> (0, 31, 2); None when it starts with no number."""
    parts = []
    for part in (text or "").split("."):
        digits = re.match(r"\d+", part)
        if not digits:
            break
        parts.append(int(digits[0]))
        if digits[0] != part:
            break
    return tuple(parts) or None


def older_than_minimum(version: str | None) -> bool:
    found = version_tuple(version)
    return found is not None and found < MIN_MLX


def _said(stderr: str) -> str | None:
    """The line of the child's stderr that names what went wrong (the exception's reason,
    MLX's error), else its last line; cut to 300 characters."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    named = [line for line in lines if _REASON.search(line)]
    chosen = named[0] if named else (lines[-1] if lines else None)
    return chosen[:300] if chosen else None


def read_probe(
    returncode: int | None,
    stdout: str,
    stderr: str,
    *,
    bench: bool,
    timeout_s: float = PROBE_TIMEOUT_S,
    bandwidth: bool = False,
) -> DeviceProbe:
    """The child's exit status (None: killed after `timeout_s`) and output -> DeviceProbe."""
    told: dict[str, Any] = {}
    for line in stdout.splitlines():
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict):
            told.update(found)
    facts = told.get("facts") if isinstance(told.get("facts"), dict) else None
    measured = told.get("bench") if isinstance(told.get("bench"), dict) else None
    memory = told.get("bandwidth") if isinstance(told.get("bandwidth"), dict) else None
    missing = (bench and measured is None) or (bandwidth and memory is None)
    if facts is not None and not missing and returncode == 0:
        return DeviceProbe(facts, measured, bandwidth=memory)
    if facts is None:
        doing = "asking MLX for its device"
    else:
        doing = "measuring its matmul" if bench and measured is None else "timing memory reads"
    said = _said(stderr)
    if returncode is None:
        failure = f"the MLX device probe hung {doing}: no answer in {timeout_s:g} s"
    elif returncode < 0:
        name = signal_name(-returncode)
        failure = f"the MLX device probe died of {name} {doing}" + (f": {said}" if said else "")
    elif isinstance(told.get("error"), str):
        failure = f"MLX failed {doing}: {told['error'][:300]}"
    else:
        failure = f"the MLX device probe exited {returncode} {doing}" + (
            f": {said}" if said else ""
        )
    return DeviceProbe(facts, measured, failure, NO_DEVICE_FIX, memory)


def probe_device(
    bench_s: float | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
    bandwidth_bytes: int | None = None,
) -> DeviceProbe:
    """Run the child: the device's facts, with `bench_s` doctor's matmul for that long, with
    `bandwidth_bytes` the memory probe over an array that large."""
    command = [sys.executable, "-m", __name__, *(["--bench", str(bench_s)] if bench_s else [])]
    command += ["--bandwidth", str(bandwidth_bytes)] if bandwidth_bytes else []
    asked = {"bench": bench_s is not None, "bandwidth": bandwidth_bytes is not None}
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:  # run() killed it
        out, err = (
            part.decode(errors="replace") if isinstance(part, bytes) else (part or "")
            for part in (exc.stdout, exc.stderr)
        )
        return read_probe(None, out, err, timeout_s=timeout_s, **asked)
    except OSError as exc:
        return DeviceProbe(None, None, f"cannot start the MLX device probe: {exc}", None)
    return read_probe(done.returncode, done.stdout, done.stderr, **asked)


# --- the child --------------------------------------------------------------------------------


def device_facts() -> dict[str, Any]:
    """MLX's version and device; on Metal the working set it recommends (what mlx-lm wires)."""
    import mlx.core as mx

    device = dict(mx.device_info())
    return {
        "mlx_version": mx.__version__,
        "backend": mx.default_device().type.name,
        "device": device.get("device_name"),
        "architecture": device.get("architecture", platform.machine()),
        "metal": mx.metal.is_available(),
        "metal_working_set_bytes": device.get("max_recommended_working_set_size"),
    }


def matmul_speed(seconds: float, size: int = MATMUL_SIZE) -> dict[str, float]:
    """A float32 matmul on the default device for `seconds`: GFLOP/s, and its largest error
    relative to the largest entry of the same product summed elementwise on `mx.cpu` (a path
    independent of the matmul kernels, needing nothing but MLX)."""
    import mlx.core as mx

    x = mx.random.normal((size, size), key=mx.random.key(0))
    result = mx.matmul(x, x)
    mx.eval(result)  # warm-up: kernels compile on first use
    with mx.stream(mx.cpu):
        expected = mx.sum(x[:, :, None] * x[None, :, :], axis=1)
        error = (mx.max(mx.abs(result - expected)) / mx.max(mx.abs(expected))).item()
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        mx.eval(mx.matmul(x, x))
        runs += 1
    elapsed = time.perf_counter() - started
    return {"gflops": 2 * size**3 * runs / elapsed / 1e9, "error": error}


def memory_bandwidth(size: int) -> dict[str, Any]:
    """Each kernel of shared.benchmark.bandwidth (a sum, a scaled copy) over a float32 array
    of `size` bytes on the default device: its WARMUP runs untimed, then each of its
    REPETITIONS timed around mx.eval, which returns when the device has finished."""
    import mlx.core as mx

    from shared.benchmark.bandwidth import REPETITIONS, WARMUP

    array = mx.ones((size // 4,), dtype=mx.float32)
    mx.eval(array)
    kernels = {"read": lambda: mx.sum(array), "copy": lambda: array * 2}
    timed: dict[str, Any] = {"bytes": size, "backend": mx.default_device().type.name}
    for name, kernel in kernels.items():
        for _ in range(WARMUP):
            mx.eval(kernel())
        seconds = []
        for _ in range(REPETITIONS):
            started = time.perf_counter()
            mx.eval(kernel())
            seconds.append(time.perf_counter() - started)
        timed[f"{name}_s"] = seconds
    return timed


def _emit(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)  # flushed: a later abort keeps what was said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="MLX's device, for the agent and doctor.")
    parser.add_argument("--bench", type=float, help="seconds of doctor's matmul")
    parser.add_argument("--bandwidth", type=int, help="bytes of the memory probe's array")
    args = parser.parse_args(argv)
    try:
        _emit({"facts": device_facts()})
        if args.bench:
            _emit({"bench": matmul_speed(args.bench)})
        if args.bandwidth:
            _emit({"bandwidth": memory_bandwidth(args.bandwidth)})
    except Exception as exc:  # whatever MLX raises (a RuntimeError since 0.31.2), said
        _emit({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
