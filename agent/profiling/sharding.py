"""One rank's share of a model split over a group of ranks, the two ways mlx-lm splits one:
"tensor" (`model.shard(group)`: every layer's heads and MLP units divided among the ranks,
two all_sums a layer) and "pipeline" (`model.model.pipeline(group)`: each rank a run of whole
layers, activations sent from rank to rank). The built-in model does both (agent.model); an
mlx-lm directory, or a Hugging Face id once located on this disk, loads through mlx_lm's own
`sharded_load` with what its model class supports.

The *_problem functions say why a request cannot work before any work starts, in one line.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import (
    AllToShardedLinear,
    QuantizedAllToShardedLinear,
    QuantizedShardedToAllLinear,
    ShardedToAllLinear,
)
from mlx.utils import tree_map_with_path

from agent.model import (
    BUILTIN_CONFIGS,
    DEFAULT_SEED,
    QUANT_GROUP_SIZE,
    Model,
    ModelArgs,
    build_model,
    pipeline_problem,
    shard_problem,
)
from agent.profiling.hf_models import locate
from agent.profiling.model_dir import stored_bits
from shared.distributed.group import PIPELINE, SHARDINGS, TENSOR

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "*.tiktoken")
"""What transformers builds a tokenizer from: sharded_load loads one along with the model."""

WEIGHT_INDEX = "model.safetensors.index.json"
"""sharded_load reads it to pick the weight files of a pipeline rank's layers."""


def shard_model(model: nn.Module, group: mx.distributed.Group, sharding: str) -> None:
    """Split `model` in place over `group`: the built-in model or any mlx-lm model, through
    the methods mlx-lm's sharded_load calls (Model.shard, Model.model.pipeline)."""
    if sharding == TENSOR:
        model.shard(group)
    elif sharding == PIPELINE:
        model.model.pipeline(group)
    else:
        raise ValueError(unknown_sharding(sharding))


def build_sharded(
    args: ModelArgs,
    bits: int,
    group: mx.distributed.Group,
    sharding: str,
    seed: int = DEFAULT_SEED,
) -> Model:
    """This rank's share of the built-in model, the same weights build_model gives one host;
    split before evaluation, so a rank never computes the weights it does not keep."""
    problem = sharding_problem(args, bits, group.size(), sharding)
    if problem is not None:
        raise ValueError(problem)
    return build_model(args, bits, seed, split=partial(shard_model, group=group, sharding=sharding))


def unknown_sharding(sharding: str) -> str:
    return f"unknown sharding {sharding!r}: choose one of {', '.join(SHARDINGS)}"


def sharding_problem(args: ModelArgs, bits: int, ranks: int, sharding: str) -> str | None:
    """Why the built-in `args` at `bits` cannot be split `sharding` over `ranks`, or None."""
    if sharding == TENSOR:
        return shard_problem(args, bits, ranks)
    if sharding == PIPELINE:
        return pipeline_problem(args.num_hidden_layers, ranks)
    return unknown_sharding(sharding)


def dir_sharding_problem(path: Path, ranks: int, sharding: str) -> str | None:
    """Why the mlx-lm model in `path` cannot be split `sharding` over `ranks`, or None: its
    model class lacks the method (decided as sharded_load decides, on the model built lazily,
    nothing read but config.json and the weights' headers), a pipeline needs the weight index
    and a layer for every rank, and sharded_load needs a tokenizer."""
    if sharding not in SHARDINGS:
        return unknown_sharding(sharding)
    from mlx_lm.utils import load_model

    if not any(any(path.glob(pattern)) for pattern in TOKENIZER_FILES):
        return f"{path} has no tokenizer ({', '.join(TOKENIZER_FILES)}), which sharded_load loads"
    model, config = load_model(path, lazy=True, strict=False)
    kind = config.get("model_type", type(model).__name__)
    if sharding == TENSOR:
        if not hasattr(model, "shard"):
            return f"mlx-lm's {kind} model has no shard(): it cannot split tensor-parallel"
        return None
    if not hasattr(getattr(model, "model", None), "pipeline"):
        return f"mlx-lm's {kind} model has no model.pipeline(): it cannot split into a pipeline"
    if not (path / WEIGHT_INDEX).is_file():
        return f"{path} has no {WEIGHT_INDEX}, which sharded_load reads to place the layers"
    return pipeline_problem(len(model.model.layers), ranks)


def model_sharding_problem(name: str, bits: int | None, ranks: int, sharding: str) -> str | None:
    """Why `--model name --bits bits` cannot be split `sharding` over `ranks`, or None: a
    built-in config by its arithmetic, anything else as the directory it names (a Hugging Face
    id from the cache alone: hf_models.locate raises ModelNotFound when it is not there; its
    `bits` are not weighed, the quantized shares are checked as the weights load)."""
    if name in BUILTIN_CONFIGS:
        return sharding_problem(
            BUILTIN_CONFIGS[name](), 16 if bits is None else bits, ranks, sharding
        )
    return dir_sharding_problem(locate(name, download=False).path, ranks, sharding)


def load_sharded_dir(
    path: Path, bits: int | None, group: mx.distributed.Group, sharding: str
) -> nn.Module:
    """This rank's share of the mlx-lm model in `path` (model_dir.check_model_dir and
    check_bits_for_dir passed), loaded by mlx_lm's sharded_load: a pipeline rank reads only
    its layers' weight files. `bits` as runner.load_model_dir honours it: None or the stored
    bits keep the stored weights, others re-quantize the float16 weights after the split."""
    from mlx_lm.utils import sharded_load

    problem = dir_sharding_problem(path, group.size(), sharding)
    if problem is not None:
        raise ValueError(problem)
    groups = {"tensor_group": group} if sharding == TENSOR else {"pipeline_group": group}
    model, _ = sharded_load(path, **groups)
    if bits is None or bits == stored_bits(path):
        return model
    model.set_dtype(mx.float16)
    if bits != 16:
        quantize_split(model, bits)
    mx.eval(model.parameters())
    return model


def quantize_split(model: nn.Module, bits: int) -> None:
    """nn.quantize for a model already split: mlx.nn's sharded linears have no to_quantized,
    so each becomes its quantized twin holding its own share quantized, the same numbers as
    quantizing first and sharding after (rows are quantized independently; a sharded-to-all
    share must hold whole quantization groups). The rest goes through nn.quantize."""

    def twin(_: str, module: nn.Module) -> nn.Module:
        if isinstance(module, AllToShardedLinear):
            outputs, inputs = module.weight.shape
            outputs *= module.group.size()
            quantized_class = QuantizedAllToShardedLinear
        elif isinstance(module, ShardedToAllLinear):
            outputs, inputs = module.weight.shape
            if inputs % QUANT_GROUP_SIZE:
                raise ValueError(
                    f"{bits}-bit sharded-to-all layer would give each rank {inputs} inputs, "
                    f"not a multiple of the quantization group ({QUANT_GROUP_SIZE})"
                )
            inputs *= module.group.size()
            quantized_class = QuantizedShardedToAllLinear
        else:
            return module
        has_bias = "bias" in module
        quantized = quantized_class(
            inputs, outputs, has_bias, QUANT_GROUP_SIZE, bits, group=module.group
        )  # its random weights are lazy, replaced before anything evaluates them
        quantized.weight, quantized.scales, quantized.biases = mx.quantize(
            module.weight, QUANT_GROUP_SIZE, bits
        )
        if has_bias:
            quantized.bias = module.bias
        return quantized

    model.update_modules(
        tree_map_with_path(twin, model.leaf_modules(), is_leaf=nn.Module.is_module)
    )
    nn.quantize(model, group_size=QUANT_GROUP_SIZE, bits=bits)
