"""One rank of a split greedy decode: the built-in small model (the same random weights on
every rank, from a fixed seed) or the mlx-lm model in MODEL_DIR, split as SHARDING says
(agent.profiling.sharding: tensor or pipeline), decoded greedily with a KV cache; each rank
prints one JSON line: the tokens, the logits' last row and how many parameters it holds, in
all and in its layers' projections.

    MLX_RANK=R MLX_HOSTFILE=hosts.json BITS=16 SHARDING=tensor TOKENS=12 python sharded_decode.py

Without MLX_RANK it is the one-host reference the ranks are compared with. BITS empty (a
model directory only) keeps the stored weights.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from agent.model import ModelArgs, build_model
from agent.profiling.runner import load_model_dir
from agent.profiling.sharding import build_sharded, load_sharded_dir
from agent.profiling.speed import new_cache

PROMPT = list(range(3, 3000, 373))  # 9 tokens: a quantized prefill is slow on a CPU


def model_args() -> ModelArgs:
    """The small config, with an MLP wide enough (768) to split into whole quantization
    groups over 2 ranks, so 4- and 8-bit shard too."""
    return replace(ModelArgs.small(), intermediate_size=768)


def load(bits: int | None, sharding: str, model_dir: str | None) -> nn.Module:
    """The whole model without MLX_RANK, else this rank's share of it."""
    if "MLX_RANK" not in os.environ:
        if model_dir:
            return load_model_dir(Path(model_dir), bits)
        return build_model(model_args(), bits=bits)
    group = mx.distributed.init(strict=True, backend="ring")
    if model_dir:
        return load_sharded_dir(Path(model_dir), bits, group, sharding)
    return build_sharded(model_args(), bits, group, sharding)


def greedy(model: nn.Module, tokens: int) -> dict[str, Any]:
    cache = new_cache(model)
    logits = model(mx.array([PROMPT]), cache=cache)
    generated: list[int] = []
    for _ in range(tokens):
        token = mx.argmax(logits[:, -1, :], axis=-1)
        mx.eval(token)
        generated.append(int(token.item()))
        logits = model(token[:, None], cache=cache)
    last = logits[0, -1].astype(mx.float32)
    mx.eval(last)
    held = tree_flatten(model.parameters())
    return {
        "tokens": generated,
        "logits": last.tolist(),
        "parameters": sum(array.size for _, array in held),
        "projection_parameters": sum(array.size for path, array in held if "_proj." in path),
    }


def main() -> int:
    bits = os.environ.get("BITS", "16")
    model = load(
        int(bits) if bits else None,
        os.environ.get("SHARDING", "tensor"),
        os.environ.get("MODEL_DIR"),
    )
    decoded = greedy(model, int(os.environ.get("TOKENS", "12")))
    print(json.dumps(decoded), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
