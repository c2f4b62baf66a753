"""The seed's BenchmarkSuite: prefill over several sequence lengths on one model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from agent.cooling.scheduler import ThermalGuard
from agent.model import SUPPORTED_BITS, ModelArgs, build_model
from agent.profiling.arguments import check_cell
from agent.profiling.runner import run_matrix
from agent.thermal import ThermalMonitor
from shared.benchmark.matrix import BUILTIN_DEFAULT_BITS, DEFAULT_SEQ_LENGTHS, MatrixSpec
from shared.cooling.sources import parse_source_name
from shared.reports.benchmark import rich_table

SEED_KEYS = (
    "seq_len",
    "tokens_per_sec",
    "latency_ms",
    "peak_memory_gb",
    "active_memory_gb",
    "soc_temp_c",
)


@dataclass
class BenchmarkResult:
    """`results` maps a cell name to its metrics (the seed's keys first, then the rest)."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    model_info: dict[str, Any] = field(default_factory=dict)

    def to_table(self) -> Table:
        report = {
            "title": "BenchmarkSuite",
            "cells": list(self.results.values()),
            "models": [self.model_info] if self.model_info else [],
        }
        return rich_table(report)

    def __str__(self) -> str:
        """The table as text, so `print(result)` shows it (a Rich Table prints as its repr):
        sized to the terminal, in colour on one."""
        console = Console()
        with console.capture() as captured:
            console.print(self.to_table())
        return captured.get()


class BenchmarkSuite:
    """Benchmarks one in-memory model built from `config` (default: the full config at 4 bits,
    as `agent bench` runs it; a given config runs in float16 unless `bits` says otherwise).

    Temperatures come from `thermal_source` and are recorded per cell (soc_temp_c); the suite
    observes them but never pauses: gating is `agent bench`'s job.
    """

    def __init__(
        self, config: ModelArgs | None = None, bits: int | None = None, thermal_source: str = "auto"
    ):
        if config is not None and not isinstance(config, ModelArgs):
            raise TypeError(f"config must be a ModelArgs or None, got {type(config).__name__}")
        if bits is not None and (isinstance(bits, bool) or bits not in SUPPORTED_BITS):
            raise ValueError(f"bits must be None or one of {SUPPORTED_BITS}, got {bits!r}")
        parse_source_name(thermal_source)  # one line naming the known sources
        self.config = config or ModelArgs.full()
        self.bits = (
            bits
            if bits is not None
            else BUILTIN_DEFAULT_BITS["full" if config is None else "small"]
        )
        self.thermal_source = thermal_source

    def benchmark_sequence_lengths(
        self,
        seq_lengths: list[int] = list(DEFAULT_SEQ_LENGTHS),  # noqa: B006 - the seed's signature
        batch_size: int = 1,
        num_warmup: int = 2,
        num_iterations: int = 5,
    ) -> BenchmarkResult:
        if not isinstance(seq_lengths, (list, tuple)) or not seq_lengths:
            raise ValueError(
                f"seq_lengths must be a non-empty list of lengths, got {seq_lengths!r}"
            )
        for length in seq_lengths:
            check_cell(seq_len=length, batch_size=batch_size)
        check_cell(num_warmup=num_warmup, num_iterations=num_iterations)
        model = build_model(self.config, bits=self.bits)  # after the checks: it takes a while
        spec = MatrixSpec(
            n_prompt=tuple(seq_lengths),
            batch_sizes=(batch_size,),
            models=("custom",),
            bits=(self.bits,),
            n_gen=(0,),
            warmup=num_warmup,
            iterations=num_iterations,
        )
        result = BenchmarkResult()
        with ThermalMonitor(source=self.thermal_source) as monitor:
            guard = ThermalGuard(monitor, enabled=False)
            for record in run_matrix(
                spec, guard=guard, on_model=result.model_info.update, models={"custom": model}
            ):
                ordered = {key: record.get(key) for key in SEED_KEYS}
                result.results[record["name"]] = ordered | record
        return result
