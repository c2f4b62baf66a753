"""A lab for staging tests and bench/bench_staging.py: hosts in network namespaces on one bridge
(tests.netns_support), each host's uplink shaped with `tc tbf`, its bytes counted on its own
interface, and a generated model directory in mlx-lm's layout of about the size asked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.netns_support import Lab, ip

MIB = 1024 * 1024
TBF_LATENCY = "50ms"
"""The most a packet may wait in a link's queue: a switch port's few milliseconds more than a
modem's seconds, so a host that sends and receives at once (the seed) gets its requests and
ACKs out behind its own upload without waiting out a bufferbloated queue."""


def interface(made: Lab, host: str) -> str:
    """`host`'s own end of its cable (the one interface in its namespace besides lo)."""
    listed = json.loads(ip("-j", "-n", made.namespaces[host], "link", "show").stdout)
    (name,) = [link["ifname"] for link in listed if link["ifname"] != "lo"]
    return name


def shape(made: Lab, rate_bits: int) -> None:
    """Every host's uplink limited to `rate_bits` bit/s (tbf on its egress): a copy from a host
    runs at most that fast, and a host sending two at once splits it."""
    burst = max(32 * 1024, rate_bits // 8 // 100)  # 10 ms of the rate, as tbf wants at least
    for host in made.namespaces:
        done = subprocess.run(
            ["tc", "-n", made.namespaces[host], "qdisc", "replace", "dev", interface(made, host),
             "root", "tbf", "rate", f"{rate_bits}bit", "burst", str(burst), "latency",
             TBF_LATENCY],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot rate-limit a veth with tc: {done.stderr.strip()}")


def sent_bytes(made: Lab, host: str) -> int:
    """Bytes `host` has sent on its interface since it was made (the kernel's counter)."""
    shown = json.loads(
        ip("-j", "-s", "-n", made.namespaces[host], "link", "show", interface(made, host)).stdout
    )
    return int(shown[0]["stats64"]["tx"]["bytes"])


def write_model_dir(directory: Path, megabytes: float) -> int:
    """A llama in mlx-lm's layout (config.json, model.safetensors and its index,
    tokenizer.json) whose weights take about `megabytes` MiB, most of them its embedding
    (float32, tied); mlx-lm loads and runs it. Returns the directory's bytes."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    hidden = 128
    vocab = max(512, int(megabytes * MIB / (hidden * 4)) // 64 * 64)
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": 2,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab,
        "tie_word_embeddings": True,
    }
    directory.mkdir(parents=True, exist_ok=True)
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    mx.save_safetensors(str(directory / "model.safetensors"), weights)
    index = {"metadata": {}, "weight_map": dict.fromkeys(weights, "model.safetensors")}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "config.json").write_text(json.dumps(config))
    Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")).save(str(directory / "tokenizer.json"))
    return sum(path.stat().st_size for path in directory.iterdir())
