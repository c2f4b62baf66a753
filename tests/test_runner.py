"""The matrix runner: one model build per group, failures recorded, the run goes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.cooling.guard import GuardReport, RunStopped
from agent.model import ModelArgs
from agent.power.meter import EnergyMeter
from agent.power.rapl import RaplSource
from agent.profiling import BenchmarkSuite
from agent.profiling.runner import run_matrix
from agent.profiling.suite import SEED_KEYS
from shared.benchmark.matrix import MatrixSpec
from tests.power_support import powercap_zone


class FailingGuard:
    """A guard that breaks one named iteration of one cell, as a sensor error or OOM would."""

    def __init__(self, fail_cell: int, error: Exception):
        self.cell = -1
        self.fail_cell = fail_cell
        self.error = error

    def begin_cell(self, cool_start_s: float = 0.0, injected_c: float | None = None) -> None:
        self.cell += 1

    def before_iteration(self, step: int) -> None:
        if self.cell == self.fail_cell:
            raise self.error

    def end_cell(self) -> GuardReport:
        return GuardReport(
            soc_temp_start_c=40.0, soc_temp_end_c=41.5, flags=["hot"], thermal_source="test"
        )


def tiny_spec(**changes) -> MatrixSpec:
    base = dict(n_prompt=(8, 16), models=("small",), n_gen=(2,), warmup=0, iterations=1)
    return MatrixSpec(**(base | changes))


def test_every_cell_yields_a_record_with_the_seed_keys() -> None:
    models: list[dict] = []
    records = list(run_matrix(tiny_spec(), on_model=models.append))
    assert [r["test"] for r in records] == ["pp8", "pp16", "tg2"]
    assert len(models) == 1 and models[0]["label"] == "small/f16"
    for record in records:
        assert record["status"] == "ok"
        for key in (*SEED_KEYS, "samples_ms"):
            assert key in record
        assert record["soc_temp_c"] is None
        # No Metal here: nothing was wired, and the record says so (on Metal: the recommended
        # working set, as mlx-lm wires generation).
        assert record["wired_limit_bytes"] is None


def test_a_failed_cell_is_recorded_and_the_rest_go_on() -> None:
    guard = FailingGuard(fail_cell=1, error=MemoryError("out of memory"))
    records = list(run_matrix(tiny_spec(), guard=guard))
    assert [r["status"] for r in records] == ["ok", "failed", "ok"]
    assert records[1]["error"] == "MemoryError: out of memory"
    assert records[0]["soc_temp_start_c"] == 40.0 and records[0]["flags"] == ["hot"]


def test_a_meter_that_dies_mid_run_leaves_the_later_cells_without_energy_saying_why(
    tmp_path: Path,
) -> None:
    zone = powercap_zone(tmp_path, "intel-rapl:0", "package-0", 1, 10**12)
    records = []
    for record in run_matrix(tiny_spec(), energy=EnergyMeter(RaplSource(tmp_path), 0)):
        records.append(record)
        if len(records) == 1:
            (zone / "energy_uj").unlink()  # the counter goes away between two cells
    assert [r["status"] for r in records] == ["ok"] * 3  # the cells go on
    assert records[0]["energy_j"] == 0.0 and records[0]["energy_source"] == "rapl"
    for record in records[1:]:
        assert record["energy_j"] is None and record["tokens_per_sec"] > 0
        assert record["energy_note"].startswith("a meter read failed: rapl: cannot read")


def test_a_stopping_guard_ends_the_run_after_recording_the_cell() -> None:
    guard = FailingGuard(fail_cell=1, error=RunStopped("too hot: 96.0 °C >= stop 95.0 °C"))
    records = []
    with pytest.raises(RunStopped):
        for record in run_matrix(tiny_spec(), guard=guard):
            records.append(record)
    assert [r["status"] for r in records] == ["ok", "failed"]
    assert "too hot" in records[1]["error"]


def test_a_model_that_cannot_load_fails_its_cells_only(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    records = list(run_matrix(tiny_spec(models=(missing, "small"), n_gen=(0,))))
    assert [r["status"] for r in records] == ["failed", "failed", "ok", "ok"]
    assert "does not exist" in records[0]["error"]


@pytest.mark.slow
def test_each_model_is_built_once_per_bits() -> None:
    models: list[dict] = []
    list(run_matrix(tiny_spec(bits=(16, 8), n_prompt=(8,), n_gen=(0,)), on_model=models.append))
    assert [m["label"] for m in models] == ["small/f16", "small/q8"]


def test_benchmark_suite_keeps_the_seed_api(tmp_path: Path) -> None:
    curve = tmp_path / "curve.csv"
    curve.write_text("0,61.5\n")
    suite = BenchmarkSuite(ModelArgs.small(), thermal_source=f"replay:{curve}")
    result = suite.benchmark_sequence_lengths(seq_lengths=[8, 16], num_warmup=0, num_iterations=1)
    assert list(result.results) == ["custom/f16 pp8 b1", "custom/f16 pp16 b1"]
    first = result.results["custom/f16 pp8 b1"]
    assert list(first)[:6] == [
        "seq_len",
        "tokens_per_sec",
        "latency_ms",
        "peak_memory_gb",
        "active_memory_gb",
        "soc_temp_c",
    ]
    assert first["seq_len"] == 8 and first["tokens_per_sec"] > 0
    assert first["soc_temp_c"] == 61.5 and "simulated" in first["flags"]
    assert BenchmarkSuite().bits == 4 and suite.bits == 16
    assert result.to_table().row_count == 2
    assert "pp16" in str(result) and "object at 0x" not in str(result)  # README: print(result)
