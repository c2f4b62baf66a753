"""The seed's BenchmarkSuite: prefill over several sequence lengths on one model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from agent.model import ModelArgs, build_model
from agent.profiling.runner import run_matrix
from shared.matrix import DEFAULT_SEQ_LENGTHS, MatrixSpec
from shared.report import rich_table

SEED_KEYS = ("seq_len", "tokens_per_sec", "latency_ms", "peak_memory_gb", "active_memory_gb",
             "soc_temp_c")


@dataclass
class BenchmarkResult:
    """`results` maps a cell name to its metrics (the seed's keys first, then the rest)."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    model_info: dict[str, Any] = field(default_factory=dict)

    def to_table(self) -> Table:
        report = {"title": "BenchmarkSuite", "cells": list(self.results.values()),
                  "models": [self.model_info] if self.model_info else []}
        return rich_table(report)


class BenchmarkSuite:
    """Benchmarks one in-memory model built from `config` (default: the full config, float16)."""

    def __init__(self, config: ModelArgs | None = None, bits: int = 16):
        self.config = config or ModelArgs.full()
        self.bits = bits

    def benchmark_sequence_lengths(
        self,
        seq_lengths: list[int] = list(DEFAULT_SEQ_LENGTHS),  # noqa: B006 - the seed's signature
        batch_size: int = 1,
        num_warmup: int = 2,
        num_iterations: int = 5,
    ) -> BenchmarkResult:
        model = build_model(self.config, bits=self.bits)
        spec = MatrixSpec(
            seq_lengths=tuple(seq_lengths), batch_sizes=(batch_size,), models=("custom",),
            bits=(self.bits,), decode_tokens=0, warmup=num_warmup, iterations=num_iterations,
        )
        result = BenchmarkResult()
        for record in run_matrix(spec, on_model=result.model_info.update,
                                 models={"custom": model}):
            ordered = {key: record.get(key) for key in SEED_KEYS}
            result.results[record["name"]] = ordered | record
        return result
