"""The built-in model split tensor-parallel over real ranks of MLX's ring backend (two
processes on loopback, MLX_RANK and MLX_HOSTFILE as mlx.launch sets them): the greedy tokens
equal one host's, and the configurations that cannot split are named before any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.model import BUILTIN_CONFIGS, shard_problem
from tests.jobs.sharded_decode import model_args
from tests.ring_support import DEADLINE_S, ROOT, run_ranks

JOB = ROOT / "tests" / "jobs" / "sharded_decode.py"


def decode(env: dict[str, str]) -> dict[str, list[float]]:
    completed = subprocess.run(
        [sys.executable, str(JOB)],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=True,
    )
    return json.loads(completed.stdout)


@pytest.mark.parametrize("bits", [16, 4])
def test_two_ranks_decode_the_tokens_one_host_does(tmp_path: Path, bits: int) -> None:
    alone = decode({"BITS": str(bits)})
    ranks = run_ranks(tmp_path, 2, [sys.executable, str(JOB)], {"BITS": str(bits)})
    for rank in map(json.loads, ranks):
        assert rank["tokens"] == alone["tokens"]
        largest = max(abs(value) for value in alone["logits"])
        worst = max(abs(a - b) for a, b in zip(alone["logits"], rank["logits"], strict=True))
        assert worst <= 0.05 * largest  # float16 sums in another order, not other arithmetic


def test_each_rank_holds_half_the_layers_and_the_whole_embedding(tmp_path: Path) -> None:
    args = model_args()
    alone = decode({"BITS": "16"})["parameters"]
    ranks = [
        json.loads(out)["parameters"] for out in run_ranks(tmp_path, 2, [sys.executable, str(JOB)])
    ]
    whole_on_each = args.vocab_size * args.hidden_size + args.hidden_size * (
        2 * args.num_hidden_layers + 1
    )  # the tied embedding (counted once) and the norms
    assert ranks[0] == ranks[1] == whole_on_each + (alone - whole_on_each) // 2


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
