"""`agent calibrate`'s load, in a child process of its own (`python -m agent.cooling.calibrate_load
COUNTER`): real MLX matmuls back to back on the default device, flat out, its work counted in
an 8-byte file the parent maps (no pipe to fill, so the load never blocks on its parent).

The parent runs and rests it with SIGCONT and SIGSTOP, and sees its device on its first line
of stdout ({"ready": DEVICE}) or why there is none ({"error": ...}, or a death before the line:
MLX aborts on a Mac that lists no Metal device, agent.profiling.device_probe says when).

On the thermal plant (`sim:plant`, whose state file the environment names) each iteration
counts as the plant's clock factor, not 1: the plant's clock is a model's, so the work done
under it is too (simulated, as the source is labelled); a real Mac's iterations slow by
themselves when its clock drops."""

from __future__ import annotations

import json
import mmap
import os
import struct
import sys
import time

PLANT_STATE_ENV = "MLX_FLEET_PLANT_STATE"
"""The thermal plant's state file (agent.thermal.plant), inherited from the parent."""
GPU_SIZE, CPU_SIZE = 2048, 384
"""Matmul sides: an iteration of a few milliseconds on an Apple GPU and on MLX's CPU backend,
so a SIGSTOP lands between iterations often and the counter moves smoothly."""
PLANT_EVERY_S = 0.05
COUNTER = struct.Struct("<d")


def clock_factor(path: str | None) -> float:
    """The plant's clock factor (1 without a plant, or while its file cannot be read)."""
    if not path:
        return 1.0
    try:
        value = json.loads(open(path, encoding="utf-8").read()).get("clock_factor")  # noqa: SIM115
    except (OSError, ValueError, AttributeError):
        return 1.0
    return float(value) if isinstance(value, (int, float)) and 0 < value <= 1 else 1.0


def main(argv: list[str]) -> int:
    counter_path = argv[0]
    try:
        import mlx.core as mx

        device = mx.default_device()
        size = GPU_SIZE if device == mx.gpu else CPU_SIZE
        a = mx.random.normal((size, size))
        b = mx.random.normal((size, size))
        mx.eval(a @ b)
    except Exception as exc:  # whatever MLX raises: the parent says it
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps({"ready": str(device), "size": size}), flush=True)
    plant = os.environ.get(PLANT_STATE_ENV)
    with open(counter_path, "r+b") as handle, mmap.mmap(handle.fileno(), COUNTER.size) as shared:
        work, factor, looked = 0.0, clock_factor(plant), time.monotonic()
        while True:
            mx.eval(a @ b)
            work += factor
            shared[:] = COUNTER.pack(work)
            if plant and time.monotonic() - looked >= PLANT_EVERY_S:
                factor, looked = clock_factor(plant), time.monotonic()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
