"""The memory-bandwidth probe's pure parts (shared.benchmark.bandwidth): the array's size from
free memory, the figures from raw seconds, what they are a fraction of on each platform, an
agent's bad report refused, and a figure judged against its family's band, made of the stored
probes (coordinator.runs.probes); and the child's real timings on this machine's MLX (its CPU
device: the CPU's memory path, no fraction)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.profiling.device_probe import DeviceProbe, memory_bandwidth, read_probe
from shared.benchmark.bandwidth import (
    MAX_BYTES,
    MIB,
    MIN_BYTES,
    REPETITIONS,
    figures,
    judge,
    probe_bytes,
    rates,
    summary,
)

GIB = 1024 * MIB
M4_MAX = {"chip": "Apple M4 Max", "gpu_cores": 40, "os": "Darwin 24.6.0"}


def raw(backend: str = "gpu", read: float = 0.002, copy: float = 0.005) -> dict:
    return {
        "bytes": GIB,
        "backend": backend,
        "read_s": [read * 1.02, read, read * 0.98, read, read],
        "copy_s": [copy] * 5,
    }


def test_the_array_is_an_eighth_of_free_memory_within_its_bounds() -> None:
    assert probe_bytes(100 * GIB) == (MAX_BYTES, None)
    assert probe_bytes(4 * GIB + 123) == (512 * MIB, None)  # whole MiB
    assert probe_bytes(8 * MIN_BYTES) == (MIN_BYTES, None)
    size, why = probe_bytes(8 * MIN_BYTES - 1)
    assert size is None and why is not None and "too little free memory" in why


def test_rates_are_the_median_and_spread_of_each_repetition() -> None:
    found = rates(10**9, "read", [0.5, 1.0, 2.0])
    assert found == {
        "gbs": 1.0,
        "low_gbs": 0.5,
        "high_gbs": 2.0,
        "spread": 1.5,
        "repetitions": 3,
    }
    assert rates(10**9, "copy", [1.0])["gbs"] == 2.0  # a copy reads and writes each byte


def test_under_metal_the_read_is_a_fraction_of_the_chips_published_bandwidth() -> None:
    found = figures(raw(), M4_MAX)
    assert found["read"]["gbs"] == pytest.approx(GIB / 0.002 / 1e9)  # 536.9 GB/s
    assert found["spec_gbs"] == 546.0 and found["why"] is None
    assert found["fraction"] == pytest.approx(536.870912 / 546.0)
    assert found["copy"]["gbs"] == pytest.approx(2 * GIB / 0.005 / 1e9)
    assert "GPU" in found["path"]
    assert summary(found) == "536.9 GB/s read (spread 4%), 429.5 copy; 98% of 546 GB/s"


def test_an_unknown_chip_or_core_count_has_no_fraction_and_says_why() -> None:
    unknown = figures(raw(), {"chip": "Apple M9 Ultra", "gpu_cores": 80})
    assert unknown["fraction"] is None and unknown["spec_gbs"] is None
    assert "no memory bandwidth known for chip 'M9 Ultra'" in unknown["why"]
    assert unknown["read"]["gbs"] > 0 and summary(unknown).endswith("no spec known")
    cores = figures(raw(), {"chip": "Apple M3 Max", "gpu_cores": None})
    assert cores["fraction"] is None and "depends on its GPU cores" in cores["why"]


def test_on_the_cpu_device_it_is_the_cpus_memory_path_never_a_chips_spec() -> None:
    linux = figures(raw("cpu"), {"chip": "AMD EPYC", "os": "Linux 6.8.0"})
    assert linux["fraction"] is None and linux["spec_gbs"] is None
    assert linux["path"] == "the CPU's memory path (MLX's CPU device)"
    assert "on a Linux machine" in linux["why"] and summary(linux).endswith("CPU memory path")
    mac_cpu = figures(raw("cpu"), M4_MAX)  # a Mac without a Metal device: still no fraction
    assert mac_cpu["fraction"] is None and mac_cpu["spec_gbs"] is None


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({**raw(), "read_s": [0.002, -1.0]}, "read_s[1]"),
        ({**raw(), "backend": "ane"}, "backend"),
        ({**raw(), "bytes": 10}, "bytes"),
        ({**raw(), "read_s": [float("nan")]}, "read_s[0]"),
        ({**raw(), "extra": 1}, "extra"),
        ("fast", "not a map"),
    ],
)
def test_an_agents_bad_report_is_said_never_used(bad: object, named: str) -> None:
    found = figures(bad, M4_MAX)
    assert found["read"]["gbs"] is None and found["fraction"] is None
    assert (
        found["why"].startswith("the agent's bandwidth report is invalid") and named in found["why"]
    )


def test_an_agents_reason_for_no_figures_is_kept() -> None:
    found = figures({"error": "skipped: benchmark job j-1 is running"}, M4_MAX)
    assert found["read"]["gbs"] is None and found["why"] == "skipped: benchmark job j-1 is running"
    assert summary(found) == "unavailable: skipped: benchmark job j-1 is running"


def test_a_figure_below_its_familys_band_fails_and_none_is_judged_without_one() -> None:
    assert judge(400.0, [410.0, 420.0]) == (None, None)  # two figures make no band
    history = [410.0, 420.0, 415.0, 412.0]
    low_high, why = judge(413.0, history)
    assert low_high is not None and low_high[0] < 413.0 < low_high[1] and why is None
    low_high, why = judge(300.0, history)
    assert low_high is not None and why is not None
    assert why.startswith("memory read 300.0 GB/s below its family's band")
    assert "from 4 level-2 results; median 413.5" in why
    assert judge(None, history)[1] is None  # nothing measured: said elsewhere, not judged


def test_the_child_asked_for_bandwidth_names_what_it_was_doing_when_it_died() -> None:
    facts = json.dumps({"facts": {"backend": "gpu"}})
    died = read_probe(-9, facts, "", bench=False, bandwidth=True)
    assert died.bandwidth is None
    assert died.failure == "the MLX device probe died of SIGKILL timing memory reads"
    timed = json.dumps({"bandwidth": raw()})
    told = read_probe(0, f"{facts}\n{timed}", "", bench=False, bandwidth=True)
    assert told == DeviceProbe({"backend": "gpu"}, bandwidth=raw())


@pytest.mark.slow
def test_the_childs_real_timings_read_as_the_cpus_memory_path_here() -> None:
    timed = memory_bandwidth(MIN_BYTES)
    assert timed["bytes"] == MIN_BYTES and len(timed["read_s"]) == REPETITIONS
    found = figures(timed, {"chip": "AMD EPYC", "os": "Linux 6.8.0"})
    if timed["backend"] == "cpu":
        assert found["fraction"] is None and "CPU" in found["path"]
    assert found["read"]["gbs"] > 0 and found["copy"]["gbs"] > 0


def test_stored_probes_make_their_familys_band_and_a_bad_stored_one_is_left_out(
    tmp_path: Path,
) -> None:
    from coordinator.runs.probes import BANDWIDTH, STEADY, add_probe, figure_history
    from coordinator.runs.store import RunStore

    family = ("Apple M4 Max", 40, 64.0, "normal", "24G84", "0.31.2")
    with RunStore(tmp_path / "runs.db") as store:
        runs = [store.create_run({}, ["a", "b"]) for _ in range(3)]
        for run, gbs in zip(runs, (410.0, 420.0, 415.0), strict=True):
            add_probe(store, run, "a", BANDWIDTH, family, gbs, {"read": {"gbs": gbs}})
        add_probe(store, runs[0], "b", BANDWIDTH, (*family[:5], "0.30.0"), 100.0, {})
        add_probe(store, runs[1], "b", STEADY, family, 40.0, {})
        store.query(
            "INSERT INTO probes VALUES (?, 'c', ?, ?, ?)",
            (runs[2], BANDWIDTH, json.dumps(list(family)), json.dumps({"figure": "fast"})),
        )
        history = figure_history(store, BANDWIDTH, family, other_than=runs[2])
        assert sorted(history) == [410.0, 420.0]  # its own run, another family, a bad one: out
        assert sorted(figure_history(store, BANDWIDTH, family, None)) == [410.0, 415.0, 420.0]
        assert judge(300.0, figure_history(store, BANDWIDTH, family, None))[1] is not None
