"""`--model DIR`: a real mlx-lm model directory, built by the test, benchmarked offline."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from tests.conftest import subprocess_env

pytest.importorskip("mlx_lm", reason="the `lm` extra (mlx-lm) is not installed")

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 512,
    "tie_word_embeddings": True,
}


def write_model(directory: Path, config: dict) -> None:
    """config.json + model.safetensors, as mlx-lm's own conversion writes them."""
    from mlx_lm.models import llama

    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    mx.save_safetensors(
        str(directory / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    (directory / "config.json").write_text(json.dumps(config))


def write_tokenizer(directory: Path, vocab_size: int, eos: int = 0) -> None:
    """A word-level tokenizer mlx-lm loads offline (`w0` ... `w<vocab_size - 1>`, `w<eos>` the
    end of text), so the directory trains with mlx_lm lora and serves through mlx_lm.server. An
    `eos` of vocab_size is a word the model never generates (its logits stop below it): every
    answer then runs to its max_tokens, as a serving benchmark needs."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(max(vocab_size, eos + 1))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": f"w{eos}"})
    )


def write_served_model(directory: Path) -> Path:
    """TINY_LLAMA with a tokenizer whose end of text it never generates (write_tokenizer), so
    that every answer it serves runs to its max_tokens; returns `directory`."""
    write_model(directory, TINY_LLAMA)
    write_tokenizer(directory, TINY_LLAMA["vocab_size"], eos=TINY_LLAMA["vocab_size"])
    return directory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-llama")
    write_model(directory, TINY_LLAMA)
    return directory


def bench(agent_cli: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [agent_cli, "bench", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(),
    )


ONE_PASS = ("-s", "8", "-i", "1", "-w", "0")
"""One timed pass of an 8-token prompt, no warm-up: the quickest measured cell."""


def bench_report(agent_cli: str, *args: str) -> dict:
    """The JSON report of `agent bench ARGS` of ONE_PASS, which must succeed."""
    result = bench(agent_cli, *args, *ONE_PASS, "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow
def test_a_model_directory_is_benchmarked(agent_cli: str, model_dir: Path) -> None:
    report = bench_report(
        agent_cli, "--model", str(model_dir), "--decode-tokens", "2", "--bits", "16,8"
    )
    hidden, vocab, inter = 64, 512, 128
    layer = 2 * hidden * hidden + 2 * hidden * 32 + 3 * hidden * inter + 2 * hidden
    expected = vocab * hidden + 2 * layer + hidden
    assert [m["param_count"] for m in report["models"]] == [expected, expected]
    assert [m["kind"] for m in report["models"]] == ["mlx-lm", "mlx-lm"]
    q8, f16 = report["models"][1], report["models"][0]
    assert q8["weight_memory_bytes"] < f16["weight_memory_bytes"]
    assert [c["status"] for c in report["cells"]] == ["ok"] * 4


@pytest.mark.slow
def test_stored_weights_are_used_without_bits(agent_cli: str, model_dir: Path) -> None:
    report = bench_report(agent_cli, "--model", str(model_dir), "--decode-tokens", "0")
    cell = report["cells"][0]
    assert cell["bits"] is None and cell["name"] == f"{model_dir.name}/stored pp8 b1"
    assert report["models"][0]["label"] == f"{model_dir.name}/stored (f16)"


@pytest.mark.slow
def test_same_named_directories_are_told_apart(
    agent_cli: str, model_dir: Path, tmp_path: Path
) -> None:
    """Two folders both named `mlx` (docs/protocol.md §5, The matrix): each label takes its
    parent folder, in the cells' names, the models' labels and the table's rows."""
    first, second = tmp_path / "a" / "mlx", tmp_path / "b" / "mlx"
    for copy in (first, second):
        shutil.copytree(model_dir, copy)
    args = ["--model", str(first), "--model", str(second), "--decode-tokens", "0"]
    report = bench_report(agent_cli, *args)
    assert [c["name"] for c in report["cells"]] == ["a/mlx/stored pp8 b1", "b/mlx/stored pp8 b1"]
    assert [m["label"] for m in report["models"]] == ["a/mlx/stored (f16)", "b/mlx/stored (f16)"]
    table = bench(agent_cli, *args, *ONE_PASS, "--format", "md")
    assert table.returncode == 0, table.stderr
    assert "| a/mlx/stored |" in table.stdout and "| b/mlx/stored |" in table.stdout


def test_a_quantized_directory_is_not_requantized(
    agent_cli: str, model_dir: Path, tmp_path: Path
) -> None:
    quantized = tmp_path / "q4"
    quantized.mkdir()
    (quantized / "model.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes())
    config = dict(TINY_LLAMA, quantization={"group_size": 64, "bits": 4})
    (quantized / "config.json").write_text(json.dumps(config))
    result = bench(agent_cli, "--model", str(quantized), "--bits", "8")
    assert result.returncode == 2
    assert "stored quantized at 4 bits; --bits 8" in result.stderr


def test_a_directory_that_is_not_a_model(agent_cli: str, tmp_path: Path) -> None:
    result = bench(agent_cli, "--model", str(tmp_path))
    assert result.returncode == 2
    assert "not an mlx-lm model directory: no config.json" in result.stderr


def test_missing_lm_extra_is_named(model_dir: Path) -> None:
    """With mlx_lm unimportable, the error says which extra to install."""
    code = (
        "import sys; sys.modules['mlx_lm'] = None; sys.argv = ['agent', 'bench', '--model',"
        f" {str(model_dir)!r}]; from agent.cli import main; main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(),
    )
    assert result.returncode == 2
    assert "pip install 'mlx-fleet[lm]'" in result.stderr
