"""Which SMC key is the die: pure, so the tests feed it captured values.

`TCMz` (die maximum) and `TCMb` (die average) exist on every Apple Silicon chip in the iSMC data
set and stay live at idle, where per-core keys park at placeholder values such as 6.7 or 4.633 °C
(oshi/oshi#3535 on an M2 Max; macmon#12 saw 9.8). Without them, the hottest plausible (>= 20 °C,
oshi#3531) per-cluster key: `Tp*` (P-cores), `Te*` (E-cores), `Tg*` (GPU).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeGuard

DIE_MAX, DIE_AVERAGE = "TCMz", "TCMb"


CLUSTER_PREFIXES = ("Tp", "Te", "Tg")


SMC_MIN_C = 20.0
"""Below this an SMC temperature key is a parked placeholder, not a die: across iSMC's dumps of
13 machines (M1 to M5, A18) every Tp*/Tg* reading was either <= 5.2 (sentinels -4, 0, 2.5, 4,
5.2) or >= 21.0 (oshi/oshi#3531, which set this floor); an idle M2 Max parks keys at 6.7 and
4.633 (oshi#3535), macmon#12 saw 9.8."""


SMC_MAX_C = 150.0


def plausible_die(celsius: float | None) -> TypeGuard[float]:
    return celsius is not None and math.isfinite(celsius) and SMC_MIN_C < celsius <= SMC_MAX_C


def die_keys(keys: list[str]) -> list[str]:
    """The keys worth reading each poll: the die keys when the chip has them, else every
    per-cluster temperature key."""
    dies = [key for key in (DIE_MAX, DIE_AVERAGE) if key in keys]
    return dies or [key for key in keys if key.startswith(CLUSTER_PREFIXES)]


@dataclass(frozen=True)
class DieChoice:
    sensor: str
    celsius: float
    sensors: dict[str, float]


def choose_die(values: Mapping[str, float | None]) -> DieChoice | None:
    """TCMz when it reads plausibly (TCMb beside it), else TCMb, else the hottest plausible
    Tp*/Te*/Tg* key; None when nothing plausible was read."""
    kept = {key: value for key, value in values.items() if plausible_die(value)}
    for key in (DIE_MAX, DIE_AVERAGE):
        if key in kept:
            dies = {name: kept[name] for name in (DIE_MAX, DIE_AVERAGE) if name in kept}
            return DieChoice(key, kept[key], dies)
    clusters = {key: value for key, value in kept.items() if key.startswith(CLUSTER_PREFIXES)}
    if not clusters:
        return None
    hottest = max(clusters, key=lambda key: clusters[key])
    return DieChoice(hottest, clusters[hottest], clusters)
