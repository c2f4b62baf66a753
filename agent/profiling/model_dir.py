"""An mlx-lm model directory on this disk, read before anything loads it: whether it is one,
the bits it is stored quantized at, the --bits it can take, and mlx-lm being installed. Its own
module because both loaders read it, the whole model's (runner.py) and one rank's share
(sharding.py), and the runner imports the sharding: here neither imports the other for it."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path


class ModelLoadError(Exception):
    """A model that cannot be loaded; the message says why and what to do."""


def check_model_dir(path: Path) -> None:
    """Fail early, before anything runs, for a directory that is not an mlx-lm model."""
    try:
        _check_model_dir(path)
    except OSError as exc:  # a name too long, a folder we may not read, ...
        raise ModelLoadError(f"model directory {path} cannot be read: {exc.strerror}") from None


def _check_model_dir(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise ModelLoadError(f"{path} is a file, not a model directory")
    if not path.is_dir():
        raise ModelLoadError(f"model directory {path} does not exist")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} is not an mlx-lm model directory: no config.json")
    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(f"{path} is not an mlx-lm model directory: no *.safetensors")


def stored_bits(path: Path) -> int | None:
    """The bits a model directory is stored quantized at (config.json), None for float."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}/config.json cannot be read: {exc}") from None
    quantization = config.get("quantization") or config.get("quantization_config") or {}
    bits = quantization.get("bits") if isinstance(quantization, dict) else None
    return int(bits) if bits else None


def check_bits_for_dir(path: Path, bits: Iterable[int | None]) -> None:
    """A quantized directory cannot be re-quantized: refuse other --bits before running."""
    stored = stored_bits(path)
    for wanted in bits:
        if stored is not None and wanted is not None and wanted != stored:
            raise ModelLoadError(
                f"{path} is stored quantized at {stored} bits; --bits {wanted} "
                "would need the float weights"
            )


def require_mlx_lm() -> None:
    try:
        import mlx_lm  # noqa: F401 - only checking that the `lm` extra is installed
    except ImportError:
        raise ModelLoadError(
            "benchmarking a model directory needs mlx-lm, which is not installed: "
            "pip install 'mlx-fleet[lm]'"
        ) from None
