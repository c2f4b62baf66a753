"""A tree standing in for /sys ($MLX_FLEET_SYSFS_ROOT), written by a test."""

from __future__ import annotations

from pathlib import Path


def build_sysfs(root: Path, files: dict[str, str]) -> Path:
    """`files` (path under root: text) written under root; returns root."""
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
