"""The verdict's rules (shared/benchmark/verdict.py), the settings comparison
(shared/benchmark/settings.py) and the fault-injection grammar (shared/benchmark/faults.py), on
records made by the real record functions."""

from __future__ import annotations

import pytest

from shared.benchmark import faults, verdict
from shared.benchmark.matrix import Cell
from shared.benchmark.results import cell_record
from shared.benchmark.settings import differing
from shared.stats import ci95_half_width, summarize_latencies, t975

CELL = Cell("small", 16, 32, 0, 0, 1)


def measured(samples_s: list[float], warmup: int = 2, **fields: object) -> dict:
    metrics = summarize_latencies(samples_s, CELL.tokens)
    metrics.update(warmup_iterations=warmup, rewarm_iterations=0, slept_s=0.0)
    return cell_record(CELL, metrics, measured=dict(fields))


def test_a_warm_steady_cell_is_valid() -> None:
    record = measured([0.100, 0.101, 0.0995, 0.1002, 0.1001])
    assert (record["verdict"], record["verdict_reasons"]) == ("valid", [])
    assert verdict.verdict_text(record) == "valid"


def test_one_cold_iteration_is_cold_and_noisy() -> None:
    record = measured([0.1], warmup=0)
    assert record["verdict"] == "invalid"
    assert record["verdict_reasons"] == ["cold", "noisy"]
    assert verdict.verdict_text(record) == "invalid: cold, noisy"


def test_noisy_follows_the_interval_not_the_spread_alone() -> None:
    wide = measured([0.05, 0.15, 0.08, 0.2, 0.1])
    assert wide["verdict_reasons"] == ["noisy"]
    half = wide["ci95_tokens_per_sec"]
    assert half == pytest.approx(ci95_half_width(wide["samples_tokens_per_sec"]))
    assert half > verdict.NOISY_SHARE * wide["tokens_per_sec"]
    # The same spread over many more iterations narrows the interval below the share.
    many = measured([0.099, 0.101] * 200)
    assert many["verdict"] == "valid"


def test_a_precision_target_tightens_the_limit() -> None:
    samples = [0.100, 0.103, 0.097, 0.102, 0.098]
    assert measured(samples)["verdict"] == "valid"
    assert measured(samples, precision_target=0.005)["verdict_reasons"] == ["noisy"]


def test_sleep_flags_and_settings_are_reasons() -> None:
    steady = [0.1, 0.1001, 0.0999]
    assert measured(steady, slept_s=5.0)["verdict_reasons"] == ["slept"]
    assert measured(steady, slept_s=verdict.SLEPT_TOLERANCE_S)["verdict"] == "valid"
    record = measured(steady, settings={"power_mode": "low", "power_source": "battery"})
    assert record["verdict_reasons"] == ["low-power", "on-battery"]
    record = measured(steady, flags=["paused", "hot", "simulated", "short-energy-window"])
    assert record["verdict_reasons"] == ["paused", "hot"]


def test_failed_and_old_records() -> None:
    failed = cell_record(CELL, error="gpu-error: Timeout: [METAL] Command buffer execution failed")
    assert failed["verdict_reasons"] == ["gpu-error"]
    assert cell_record(CELL, error="out of memory")["verdict_reasons"] == ["failed"]
    old = measured([0.1, 0.1, 0.1])
    del old["warmup_iterations"]
    assert verdict.judge(old)["verdict_reasons"] == ["unverified"]


def test_a_peer_verdict_is_judged_again() -> None:
    record = measured([0.1], warmup=0)
    record["verdict"], record["verdict_reasons"] = "valid", []
    assert verdict.judge(record)["verdict"] == "invalid"


def test_separated_intervals() -> None:
    fast = measured([0.050, 0.0501, 0.0499])
    slow = measured([0.100, 0.1001, 0.0999])
    noisy = measured([0.03, 0.12, 0.07])
    assert verdict.separated(fast, slow)
    assert not verdict.separated(noisy, slow)
    assert not verdict.separated(measured([0.05]), slow)


def test_t_quantiles() -> None:
    assert t975(1) == pytest.approx(12.706)
    assert t975(30) == pytest.approx(2.042)
    assert t975(31) == pytest.approx(2.0395, abs=0.005)
    assert t975(10_000) == pytest.approx(1.96, abs=0.001)
    assert ci95_half_width([1.0]) is None


def test_differing_settings_name_both_sides() -> None:
    normal = [{"settings": {"power_mode": "normal", "mlx_version": "0.32.4"}}]
    low = [{"settings": {"power_mode": "low", "mlx_version": "0.32.4"}}]
    assert differing(normal, low) == {"power_mode": (["normal"], ["low"])}
    assert differing([{}], [{}]) == {}


def test_fault_grammar() -> None:
    parsed = faults.parse("sleep=5@2, gpu-error=PageFault, reboot@3, low-power")
    assert faults.for_cell(parsed, 2) == {"sleep": "5", "gpu-error": "PageFault", "low-power": None}
    assert faults.for_cell(parsed, 3) == {
        "gpu-error": "PageFault",
        "reboot": None,
        "low-power": None,
    }
    assert faults.parse("") == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nap", "unknown fault 'nap'"),
        ("sleep=soon", "sleep=soon is not a number"),
        ("sleep=-1", "out of range"),
        ("reboot=1", "reboot takes no value"),
        ("gpu-error=Melted", "gpu-error=Melted"),
        ("sleep@0", "@0 is not a cell number"),
    ],
)
def test_bad_faults_get_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        faults.parse(text)
    assert "\n" not in str(caught.value)


def test_a_cell_whose_iterations_slowed_down_is_slowed_not_throttled() -> None:
    """A slowdown in the timed iterations (the same work taking 25 % longer from the sixth on)
    makes the cell `slowed` by the throttle rule: a throttle and a load beside the cell both
    give it, so without a clock saying so it is not called throttling."""
    steady = [0.100, 0.101, 0.0995, 0.1002, 0.1001]
    record = measured(steady + [0.125, 0.126, 0.125])
    assert "slowed" in record["verdict_reasons"] and "throttled" not in record["verdict_reasons"]
    assert verdict.slowdown_evidence(record) == "256 tok/s of 322"
    assert verdict.throttle_evidence(record) is None
    # two slow iterations are not three in a row; within the margin is not a slowdown
    assert "slowed" not in measured(steady + [0.125, 0.126, 0.1])["verdict_reasons"]
    assert "slowed" not in measured(steady + [0.11, 0.11, 0.11])["verdict_reasons"]
    # with the clock seen throttling as well, the cell is throttled (and only that)
    low = {"sustained_hz": 1.4e9, "samples": [[1.4e9, 0.9]] + [[1.1e9, 0.95]] * 3}
    both = measured(steady + [0.125, 0.126, 0.125], gpu_clock=low)
    assert "throttled" in both["verdict_reasons"] and "slowed" not in both["verdict_reasons"]


def test_a_cell_measured_under_a_low_gpu_clock_was_throttling() -> None:
    fast = [0.100, 0.101, 0.0995, 0.1002, 0.1001]
    low = {"sustained_hz": 1.4e9, "samples": [[1.4e9, 0.9]] + [[1.1e9, 0.95]] * 3}
    record = measured(fast, gpu_clock=low)
    assert record["verdict_reasons"] == ["throttled"]
    assert verdict.verdict_text(record) == "invalid: throttled"
    assert verdict.throttle_evidence(record) == "GPU 1.10 GHz of 1.40 sustained"
    idle = {"sustained_hz": 1.4e9, "samples": [[0.4e9, 0.02]] * 6}  # not under load: no verdict
    assert measured(fast, gpu_clock=idle)["verdict"] == "valid"
    junk = {"sustained_hz": "fast", "samples": [[None, None], "x", [1, 2, 3]]}
    assert measured(fast, gpu_clock=junk)["verdict"] == "valid"  # a peer's junk judges nothing


def test_a_sustained_cell_is_never_throttled_its_curve_is_the_measurement() -> None:
    record = measured([0.1] * 5 + [0.2] * 5, sustain={"windows": []})
    assert "throttled" not in record["verdict_reasons"]
