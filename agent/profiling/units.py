"""The unit every memory figure is reported in, apart from MLX: the machine's facts need it in
a process that never imports MLX (agent doctor, whose device probe runs in a child)."""

from __future__ import annotations

GB = 1e9
"""Decimal gigabytes, as the seed's `*_memory_gb` keys and mlx-lm's reports count them."""


def to_gb(num_bytes: float) -> float:
    return num_bytes / GB
