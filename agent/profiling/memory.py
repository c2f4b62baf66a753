"""Memory accounting: weight bytes from the arrays actually held, and per-cell peaks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from agent.profiling.arguments import check_cell, check_model
from agent.profiling.units import to_gb

"""Decimal gigabytes, as the `*_gb` keys say and mlx-lm reports."""
QUANTIZATION_ARRAYS = ("scales", "biases")


def held_arrays(model: nn.Module) -> Iterator[tuple[nn.Module, str, mx.array]]:
    """Every array the model holds, each once, with the module that owns it.

    Walking modules rather than parameter paths means a tied embedding/output weight, or any
    array shared between modules, is seen once.
    """
    seen: set[int] = set()
    for _, module in model.named_modules():
        for key, value in module.items():
            if isinstance(value, mx.array) and id(value) not in seen:
                seen.add(id(value))
                yield module, key, value


def logical_param_count(module: nn.Module, key: str, array: mx.array) -> int:
    """Parameters an array stands for: packed quantized weights unpack to 32/bits each."""
    bits = getattr(module, "bits", None)
    if bits is not None and "scales" in module:
        if key in QUANTIZATION_ARRAYS:
            return 0
        if key == "weight":
            return array.size * 32 // bits
    return array.size


class MemoryProfiler:
    """The seed's memory profiler, measuring what MLX really holds."""

    def profile_model(self, model: nn.Module) -> dict[str, Any]:
        """Weight bytes and parameter count, read from array shapes: nothing is evaluated."""
        check_model(model)
        weight_bytes = 0
        param_count = 0
        num_arrays = 0
        for module, key, array in held_arrays(model):
            weight_bytes += array.nbytes
            param_count += logical_param_count(module, key, array)
            num_arrays += 1
        return {
            "param_count": param_count,
            "weight_memory_bytes": weight_bytes,
            "weight_memory_gb": to_gb(weight_bytes),
            "num_arrays": num_arrays,
        }

    def reset_peak(self) -> None:
        mx.reset_peak_memory()

    def profile_forward(
        self, model: nn.Module, seq_len: int, batch_size: int = 1
    ) -> dict[str, float]:
        """Peak and active memory of one evaluated forward pass over random tokens."""
        check_model(model)
        check_cell(seq_len=seq_len, batch_size=batch_size)
        weights = self.profile_model(model)["weight_memory_bytes"]
        tokens = random_tokens(model, batch_size, seq_len)
        mx.eval(tokens)
        self.reset_peak()
        logits = model(tokens)
        mx.eval(logits)
        peak = mx.get_peak_memory()
        active = mx.get_active_memory()
        del logits
        return {
            "peak_memory_gb": to_gb(peak),
            "active_memory_gb": to_gb(active),
            "activation_memory_gb": to_gb(max(peak - weights, 0)),
        }

    def device_info(self) -> dict[str, Any]:
        """MLX's description of the device, with the backend and memory counters."""
        info = dict(mx.device_info())
        info["backend"] = mx.default_device().type.name
        info["active_memory_gb"] = to_gb(mx.get_active_memory())
        info["peak_memory_gb"] = to_gb(mx.get_peak_memory())
        info["cache_memory_gb"] = to_gb(mx.get_cache_memory())
        return info


def vocab_size(model: nn.Module) -> int:
    """Vocabulary size of our model or an mlx-lm model."""
    args = getattr(model, "args", None)
    size = getattr(args, "vocab_size", None)
    if size:
        return int(size)
    return int(model.model.embed_tokens.num_embeddings)


def random_tokens(model: nn.Module, batch_size: int, seq_len: int, seed: int = 0) -> mx.array:
    """Token ids drawn from a fixed seed: benchmarks need shapes, not text."""
    key = mx.random.key(seed)
    return mx.random.randint(0, vocab_size(model), (batch_size, seq_len), key=key)
