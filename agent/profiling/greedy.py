"""The correctness check a distributed cell records: what a model predicts at each position of a
fixed prompt (the prefill), then the tokens it decodes greedily after it with a real KV cache.
Two runs of the same weights agree token for token when their arithmetic does (a sharded model
sums in another order, which moves logits by float16's rounding, not argmaxes), so a group's
tokens against a member's alone say whether the split model computes what the whole one does.
The prompt's predictions come first because random weights decode one token over and over:
sixteen positions of a prompt spread over the vocabulary give sixteen different contexts."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from agent.profiling.speed import new_cache
from shared.distributed.group import CHECK_PROMPT_LENGTH as PROMPT_LENGTH

PROMPT_STRIDE = 997
"""A prime: the prompt's ids spread over any vocabulary larger than PROMPT_LENGTH."""


def check_prompt(vocab_size: int) -> list[int]:
    return [(7 + PROMPT_STRIDE * i) % vocab_size for i in range(PROMPT_LENGTH)]


def greedy_tokens(model: nn.Module, count: int) -> list[int]:
    """PROMPT_LENGTH predictions over the prompt, then `count` tokens decoded greedily."""
    vocab_size = model(mx.array([[1]])).shape[-1]  # no tokenizer needed: ask the model
    cache = new_cache(model)
    logits = model(mx.array([check_prompt(vocab_size)]), cache=cache)
    predicted = mx.argmax(logits[0], axis=-1)
    mx.eval(predicted)
    tokens = [int(token) for token in predicted.tolist()]
    for _ in range(count):
        token = mx.argmax(logits[:, -1, :], axis=-1)
        mx.eval(token)
        tokens.append(int(token.item()))
        logits = model(token[:, None], cache=cache)
    return tokens
