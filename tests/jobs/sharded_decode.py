"""One rank of a tensor-parallel greedy decode of the built-in small model: every rank builds
the same random weights (a fixed seed), shards them with Model.shard(group), and decodes
greedily; each rank prints one JSON line: the tokens, the logits' last row and how many
parameters it holds.

    MLX_RANK=R MLX_HOSTFILE=hosts.json BITS=16 TOKENS=12 python sharded_decode.py

Without MLX_RANK it is the one-host reference the ranks are compared with.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from agent.model import ModelArgs, build_model

PROMPT = list(range(3, 3000, 97))


def model_args() -> ModelArgs:
    """The small config, with an MLP wide enough (768) to split into whole quantization
    groups over 2 ranks, so 4- and 8-bit shard too."""
    return replace(ModelArgs.small(), intermediate_size=768)


def greedy(tokens: int, bits: int) -> dict[str, Any]:
    group = mx.distributed.init(strict=True, backend="ring") if "MLX_RANK" in os.environ else None
    model = build_model(model_args(), bits=bits)
    if group is not None:
        model.shard(group)
        mx.eval(model.parameters())
    cache = model.make_cache()
    logits = model(mx.array([PROMPT]), cache=cache)
    generated: list[int] = []
    for _ in range(tokens):
        token = mx.argmax(logits[:, -1, :], axis=-1)
        mx.eval(token)
        generated.append(int(token.item()))
        logits = model(token[:, None], cache=cache)
    last = logits[0, -1].astype(mx.float32)
    mx.eval(last)
    held = sum(array.size for _, array in tree_flatten(model.parameters()))
    return {"tokens": generated, "logits": last.tolist(), "parameters": held}


def main() -> int:
    decoded = greedy(int(os.environ.get("TOKENS", "12")), int(os.environ.get("BITS", "16")))
    print(json.dumps(decoded), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
