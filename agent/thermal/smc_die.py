"""Which SMC keys are the hottest part of the chip: pure, so the tests feed it captured values.

MLX heats the GPU more than the CPU, and the SMC has no GPU aggregate, so a poll reads two
figures and acts on the hotter (tests/fixtures/captures/README.md holds the reports):

- the **CPU die**: `TCMz`, the firmware's CPU-die maximum (iSMC smc/sensors.go "CPU Die Max";
  `TCMb` is "CPU Die Average", read beside it). Every M1-M4 and A18 report in iSMC's data set
  has both; the M5 Pro and M5 Max reports have `TCMb` but no `TCMz`, so there the CPU die is the
  hottest plausible `Tp*` (P-core), `Te*` (E-core) or `TCMb` key: in all three M5 reports `TCMb`
  reads above every per-core key (62.6 vs 59.3 °C on the M5 Pro), so the cores alone would
  under-read the die.
- the **GPU**: the hottest plausible `Tg*` key (lower-case g: `TG*` keys are other sensors).
  Under GPU load an M4 Pro read `Tg0k` 96.9 °C beside a cooler CPU (vladkens/macmon#12).

Plausible means above SMC_MIN_C: per-core keys park at placeholders while idle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeGuard

DIE_MAX, DIE_AVERAGE = "TCMz", "TCMb"
CPU_PREFIXES = ("Tp", "Te")
GPU_PREFIX = "Tg"
FABRIC_PREFIX = "Tf"
"""iSMC's "GPU Fabric" keys (M3 and later): never read by the source, since on iSMC's M3 dumps they
follow the CPU die (docs/thermal.md, GPU keys), but held in `agent doctor --capture` files so
that a real Mac's capture under load can confirm it."""


SMC_MIN_C = 20.0
"""At or below this an SMC temperature key is a parked placeholder, not a die: across iSMC's
dumps of 13 machines (M1 to M5, A18) every Tp*/Tg* reading was either <= 5.2 (sentinels -4, 0,
2.5, 4, 5.2) or >= 21.0 (oshi/oshi#3531, which set this floor); an idle M2 Max parks keys at 6.7
and 4.633 (oshi#3535), macmon#12 saw 9.8, an idle M5 Max 19.59 (iSMC report-m5-max-2)."""


SMC_MAX_C = 150.0


def plausible_die(celsius: float | None) -> TypeGuard[float]:
    return celsius is not None and math.isfinite(celsius) and SMC_MIN_C < celsius <= SMC_MAX_C


def die_keys(keys: list[str]) -> list[str]:
    """The keys worth reading each poll: `TCMz` and `TCMb` where the chip has them, every
    Tp*/Te* key where it has no `TCMz`, and every Tg* key."""
    dies = [key for key in (DIE_MAX, DIE_AVERAGE) if key in keys]
    cores = [] if DIE_MAX in keys else [key for key in keys if key.startswith(CPU_PREFIXES)]
    return dies + cores + [key for key in keys if key.startswith(GPU_PREFIX)]


@dataclass(frozen=True)
class DieChoice:
    """The hotter part (`sensor`, `celsius`) and the figures it was chosen from, by key: the
    CPU die's, `TCMb` and the hottest GPU key's."""

    sensor: str
    celsius: float
    sensors: dict[str, float]


def _hottest(values: Mapping[str, float], prefixes: str | tuple[str, ...]) -> str | None:
    keys = [key for key in values if key.startswith(prefixes)]
    return max(keys, key=lambda key: values[key]) if keys else None


def choose_die(
    values: Mapping[str, float | None], gpu: Mapping[str, float] | None = None
) -> DieChoice | None:
    """The hotter of the CPU die (TCMz, else the hottest of Tp*/Te* and TCMb) and the GPU,
    placeholders left out; None when nothing plausible was read. The GPU is the hottest Tg*
    key of `values`, or, given `gpu`, the hottest of those figures instead (GpuWatch's usable
    key, or the HID GPU sensors when the Tg* keys cannot be used)."""
    kept = {
        key: value
        for key, value in values.items()
        if plausible_die(value) and (gpu is None or not key.startswith(GPU_PREFIX))
    }
    cpu = DIE_MAX if DIE_MAX in kept else _hottest(kept, (*CPU_PREFIXES, DIE_AVERAGE))
    if gpu is None:
        gpu_key = _hottest(kept, GPU_PREFIX)
    else:
        usable = {key: value for key, value in gpu.items() if plausible_die(value)}
        gpu_key = max(usable, key=lambda key: usable[key]) if usable else None
        kept.update(usable)
    parts = [key for key in (cpu, DIE_AVERAGE, gpu_key) if key in kept]
    if not parts:
        return None
    sensors = {key: kept[key] for key in dict.fromkeys(parts)}
    hottest = max((key for key in sensors if key != DIE_AVERAGE or key == cpu), key=sensors.get)
    return DieChoice(hottest, sensors[hottest], sensors)


# --- are the GPU keys live? ---------------------------------------------------------------------

PLACEHOLDER_C = 40.0
"""The value whole blocks of SMC keys park at: iSMC's M3 Max (`ismc-m3-max-2`) and M4 Max
reports hold `TCMz` = `TCMb` = 40.0 with 48-54 keys at exactly 40.0 (tests/fixtures/captures/
README.md). A GPU key reading exactly 40.0 is taken for that placeholder: at a real 40 °C no
tier acts anyway, so leaving it out never hides heat."""
FROZEN_POLLS = 10
"""Polls in a row in which every GPU key reads the same value, bit for bit, after which the
GPU keys count as frozen (10 s at the agent's 1 s poll). The float32 keys read to a fraction of
a degree (iSMC's M3 Max: `Tg01` 43.42449188232422), so a live GPU of 8 to 84 keys that repeats
every one of them exactly for ten polls is a firmware placeholder, not a die at rest; a real
Mac must still confirm it (docs/thermal.md, Not verified on hardware)."""
NOT_COVERED = "GPU not covered"


@dataclass(frozen=True)
class GpuKeys:
    """What the GPU keys of a poll say: the hottest usable key and its value, or why none is
    usable (`problem`)."""

    key: str | None
    celsius: float | None
    problem: str | None = None


def gpu_keys_now(values: Mapping[str, float | None]) -> GpuKeys:
    """One poll's Tg* keys: the hottest plausible one that is not the 40.0 placeholder, or why
    there is none: no Tg* key (gone, as on some Macs under macOS 26: narugit/smctemp#44), none
    readable, every one at 0 or a sentinel (as a powered-down GPU reads, vladkens/macmon#12,
    and as some Macs read under load on macOS 26.2+, crystalidea/macs-fan-control#891), or at
    the placeholder."""
    gpu = {key: value for key, value in values.items() if key.startswith(GPU_PREFIX)}
    if not gpu:
        return GpuKeys(None, None, "the SMC lists no GPU key (Tg*)")
    read = {key: value for key, value in gpu.items() if value is not None and math.isfinite(value)}
    if not read:
        return GpuKeys(None, None, f"none of the {len(gpu)} GPU keys (Tg*) could be read")
    live = {key: value for key, value in read.items() if plausible_die(value)}
    usable = {key: value for key, value in live.items() if value != PLACEHOLDER_C}
    if usable:
        key = max(usable, key=lambda key: usable[key])
        return GpuKeys(key, usable[key])
    if live:
        return GpuKeys(
            None, None, f"the GPU keys (Tg*) read {PLACEHOLDER_C:g} °C, a placeholder ({len(live)})"
        )
    return GpuKeys(
        None,
        None,
        f"every GPU key (Tg*, {len(read)}) reads 0 or a sentinel "
        f"(at most {max(read.values()):g} °C)",
    )


class GpuWatch:
    """gpu_keys_now() of each poll, and the GPU keys frozen once they have repeated every value
    for FROZEN_POLLS polls in a row; a change of any key makes them live again."""

    def __init__(self, polls: int = FROZEN_POLLS) -> None:
        self.polls = polls
        self._last: tuple[tuple[str, float | None], ...] | None = None
        self.same = 0

    def check(self, values: Mapping[str, float | None]) -> GpuKeys:
        gpu = tuple(sorted((k, v) for k, v in values.items() if k.startswith(GPU_PREFIX)))
        self.same = self.same + 1 if gpu == self._last else 1
        self._last = gpu
        now = gpu_keys_now(values)
        if now.key is None or self.same < self.polls:
            return now
        return GpuKeys(
            None,
            None,
            f"the GPU keys (Tg*, {len(gpu)}) have repeated every value for {self.same} polls "
            f"({now.key} {now.celsius:g} °C): frozen",
        )
