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


def choose_die(values: Mapping[str, float | None]) -> DieChoice | None:
    """The hotter of the CPU die (TCMz, else the hottest of Tp*/Te* and TCMb) and the hottest
    Tg* key, placeholders left out; None when nothing plausible was read."""
    kept = {key: value for key, value in values.items() if plausible_die(value)}
    cpu = DIE_MAX if DIE_MAX in kept else _hottest(kept, (*CPU_PREFIXES, DIE_AVERAGE))
    parts = [key for key in (cpu, DIE_AVERAGE, _hottest(kept, GPU_PREFIX)) if key in kept]
    if not parts:
        return None
    sensors = {key: kept[key] for key in dict.fromkeys(parts)}
    hottest = max((key for key in sensors if key != DIE_AVERAGE or key == cpu), key=sensors.get)
    return DieChoice(hottest, sensors[hottest], sensors)
