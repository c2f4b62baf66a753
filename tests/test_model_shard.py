"""Models split over real ranks of MLX's ring backend (two processes on loopback, MLX_RANK and
MLX_HOSTFILE as mlx.launch sets them), tensor-parallel and as a pipeline: the built-in model
and mlx-lm model directories (through mlx_lm's sharded_load) decode the greedy tokens one host
does, with a KV cache, each rank holding half the layers; the configurations that cannot
split are named before any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import import_module
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from agent.model import BUILTIN_CONFIGS, shard_problem
from agent.profiling.sharding import (
    dir_sharding_problem,
    load_sharded_dir,
    model_sharding_problem,
    sharding_problem,
)
from tests.jobs.sharded_decode import model_args
from tests.ring_support import DEADLINE_S, ROOT, run_ranks

JOB = ROOT / "tests" / "jobs" / "sharded_decode.py"

TINY = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 4096,  # the job's prompt reaches token 2913
    "tie_word_embeddings": False,
}
"""A tiny mlx-lm model whose sharded-to-all shares over 2 ranks (64, 128 inputs) are whole
4-bit quantization groups; mlx-lm's llama splits tensor-parallel only, its qwen2 both ways."""


def decode(env: dict[str, str]) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, str(JOB)],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=True,
    )
    return json.loads(completed.stdout)


def decode_on_two_ranks(tmp_path: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    return [json.loads(out) for out in run_ranks(tmp_path, 2, [sys.executable, str(JOB)], env)]


def assert_same_decode(alone: dict[str, Any], ranks: list[dict[str, Any]], sharding: str) -> None:
    """The same tokens; a pipeline the same logits (each layer's arithmetic is unchanged,
    only where it runs), tensor-parallel close ones (its all_sums add in another order)."""
    for rank in ranks:
        assert rank["tokens"] == alone["tokens"]
        worst = max(abs(a - b) for a, b in zip(alone["logits"], rank["logits"], strict=True))
        if sharding == "pipeline":
            assert worst == 0
        else:
            assert worst <= 0.05 * max(abs(value) for value in alone["logits"])


@pytest.mark.parametrize("sharding", ["tensor", "pipeline"])
@pytest.mark.parametrize("bits", [16, 4])
@pytest.mark.slow
def test_two_ranks_decode_the_tokens_one_host_does(
    tmp_path: Path, bits: int, sharding: str
) -> None:
    env = {"BITS": str(bits), "SHARDING": sharding, "TOKENS": "8"}
    assert_same_decode(decode(env), decode_on_two_ranks(tmp_path, env), sharding)


@pytest.mark.parametrize("sharding", ["tensor", "pipeline"])
@pytest.mark.slow
def test_each_rank_holds_half_the_layers_and_the_whole_embedding(
    tmp_path: Path, sharding: str
) -> None:
    args = model_args()
    env = {"BITS": "16", "SHARDING": sharding, "TOKENS": "1"}
    alone = decode(env)["parameters"]
    ranks = [rank["parameters"] for rank in decode_on_two_ranks(tmp_path, env)]
    norms_on_each = 2 * args.num_hidden_layers + 1 if sharding == "tensor" else 1
    whole_on_each = args.vocab_size * args.hidden_size + args.hidden_size * norms_on_each
    assert ranks[0] == ranks[1] == whole_on_each + (alone - whole_on_each) // 2


def write_model_dir(directory: Path, config: dict[str, Any]) -> Path:
    """config.json, model.safetensors with its index and a tokenizer.json, as mlx-lm's own
    conversion leaves a model (sharded_load reads all three)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    directory.mkdir()
    mx.random.seed(0)  # the same weights every run: a tie near the top is met every run or never
    models = import_module(f"mlx_lm.models.{config['model_type']}")
    model = models.Model(models.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(directory / "model.safetensors"), weights)
    index = {"weight_map": dict.fromkeys(weights, "model.safetensors")}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "config.json").write_text(json.dumps(config))
    Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")).save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("mlx_lm", reason="the `lm` extra (mlx-lm) is not installed")
    root = tmp_path_factory.mktemp("models")
    return {
        kind: write_model_dir(root / kind, {**TINY, "model_type": kind})
        for kind in ("llama", "qwen2")
    }


@pytest.mark.parametrize(
    ("kind", "sharding", "bits"),
    [("llama", "tensor", ""), ("llama", "tensor", "4"), ("qwen2", "pipeline", "")],
)
@pytest.mark.slow
def test_a_model_dir_split_decodes_the_tokens_one_host_does(
    tmp_path: Path, model_dirs: dict[str, Path], kind: str, sharding: str, bits: str
) -> None:
    """Stored float weights as they are, or re-quantized after the split; one host loads the
    same directory whole (runner.load_model_dir)."""
    env = {"MODEL_DIR": str(model_dirs[kind]), "BITS": bits, "SHARDING": sharding, "TOKENS": "8"}
    alone = decode(env)
    ranks = decode_on_two_ranks(tmp_path, env)
    assert_same_decode(alone, ranks, sharding)
    for rank in ranks:
        assert rank["projection_parameters"] * 2 == alone["projection_parameters"]


@pytest.mark.parametrize(
    ("config", "bits", "ranks", "problem"),
    [
        ("small", 16, 2, None),
        ("full", 4, 2, None),
        ("full", 16, 4, None),
        ("small", 16, 3, "its 4 attention heads do not split evenly over 3 ranks"),
        ("full", 16, 3, "its 8 key/value heads do not split evenly over 3 ranks"),
        (
            "small",
            4,
            2,
            "4-bit down_proj would give each of 2 ranks 352 inputs, not a multiple of the "
            "quantization group (64)",
        ),
    ],
)
def test_a_config_that_cannot_split_is_named(
    config: str, bits: int, ranks: int, problem: str | None
) -> None:
    assert shard_problem(BUILTIN_CONFIGS[config](), bits, ranks) == problem


@pytest.mark.parametrize(
    ("config", "bits", "ranks", "sharding", "problem"),
    [
        ("small", 4, 2, "pipeline", None),  # whole layers move: no quantization group to split
        ("small", 16, 3, "pipeline", None),  # 4 layers as 2 + 1 + 1
        ("small", 16, 4, "pipeline", None),
        ("small", 16, 5, "pipeline", "its 4 layers cannot give each of 5 ranks one"),
        ("small", 16, 3, "tensor", "its 4 attention heads do not split evenly over 3 ranks"),
        ("small", 16, 2, "expert", "unknown sharding 'expert': choose one of tensor, pipeline"),
    ],
)
def test_a_config_that_cannot_pipeline_is_named(
    config: str, bits: int, ranks: int, sharding: str, problem: str | None
) -> None:
    assert sharding_problem(BUILTIN_CONFIGS[config](), bits, ranks, sharding) == problem
    assert model_sharding_problem(config, bits, ranks, sharding) == problem


def test_a_model_dir_that_cannot_split_is_named(
    tmp_path: Path, model_dirs: dict[str, Path]
) -> None:
    llama, qwen2 = model_dirs["llama"], model_dirs["qwen2"]
    assert dir_sharding_problem(llama, 2, "tensor") is None
    assert dir_sharding_problem(qwen2, 2, "pipeline") is None
    assert dir_sharding_problem(llama, 2, "pipeline") == (
        "mlx-lm's llama model has no model.pipeline(): it cannot split into a pipeline"
    )
    assert dir_sharding_problem(qwen2, 3, "pipeline") == (
        "its 2 layers cannot give each of 3 ranks one"
    )
    assert model_sharding_problem(str(qwen2), None, 3, "pipeline") == (
        "its 2 layers cannot give each of 3 ranks one"
    )

    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gpt2",
                "n_ctx": 64,
                "n_embd": 64,
                "n_head": 4,
                "n_layer": 2,
                "n_positions": 64,
                "layer_norm_epsilon": 1e-5,
                "vocab_size": 512,
            }
        )
    )
    (gpt2 / "tokenizer.json").write_text((llama / "tokenizer.json").read_text())
    assert dir_sharding_problem(gpt2, 2, "tensor") == (
        "mlx-lm's gpt2 model has no shard(): it cannot split tensor-parallel"
    )

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).symlink_to(qwen2 / name)
    assert dir_sharding_problem(bare, 2, "tensor") == (
        f"{bare} has no tokenizer (tokenizer.json, tokenizer.model, tiktoken.model, *.tiktoken), "
        "which sharded_load loads"
    )
    (bare / "tokenizer.json").symlink_to(qwen2 / "tokenizer.json")
    assert dir_sharding_problem(bare, 2, "pipeline") == (
        f"{bare} has no model.safetensors.index.json, which sharded_load reads to place the layers"
    )


def test_a_dir_that_cannot_split_fails_before_loading(model_dirs: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="llama model has no model.pipeline()"):
        load_sharded_dir(model_dirs["llama"], None, mx.distributed.init(), "pipeline")
