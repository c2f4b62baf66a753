"""Sources that need no tool: sim, replay, none, callables; source names and `auto`'s order."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from agent.sensors.load import CpuLoad, proc_stat_counters
from agent.thermal import (
    KNOWN_SOURCES,
    ReplayFormatError,
    SourceSpecError,
    SourceUnavailable,
    UnknownSourceError,
    auto_order,
    open_source,
)
from agent.thermal.base import CallableSource, NoneSource
from agent.thermal.synthetic import ReplaySource, SimSource, sim_step
from shared.cooling.sources import SimParams, parse_sim_params
from tests.conftest import documented_names


def test_known_sources_are_the_documented_names() -> None:
    """docs/thermal.md's table of sources, where `sim[:k=v,...]` is `sim` and its optional
    parameters; `auto` (the default) comes first."""
    table = documented_names("thermal.md", "| Name |")
    documented = {name.removesuffix("[:k=v,...]") for name in table}
    assert set(KNOWN_SOURCES) == documented and len(KNOWN_SOURCES) == len(documented)
    assert KNOWN_SOURCES[:2] == ("auto", "none")


@pytest.mark.parametrize("name", ["nvidia", "macmon:fast", "", "auto:x"])
def test_unknown_source_is_a_value_error_listing_the_known_names(name: str) -> None:
    with pytest.raises(UnknownSourceError) as excinfo:
        open_source(name)
    assert isinstance(excinfo.value, ValueError)
    for known in KNOWN_SOURCES:
        assert known in str(excinfo.value)


def test_replay_without_a_path_is_bad_input() -> None:
    with pytest.raises(SourceSpecError, match="replay:PATH"):
        open_source("replay:")


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the refusal off macOS")
@pytest.mark.parametrize("name", ["iohid", "smc"])
def test_mac_sources_off_macos_fail_with_the_reason_and_what_this_machine_offers(
    name: str,
) -> None:
    with pytest.raises(SourceUnavailable, match="needs macOS") as refused:
        open_source(name)
    offers = "auto, none, linux, sim, sim:plant[:PRESET], replay:PATH, capture:FILE"
    assert str(refused.value).endswith(f"; this machine offers: {offers}")


def test_none_reads_nothing_and_says_why() -> None:
    with open_source("NONE") as source:
        assert isinstance(source, NoneSource)
        assert source.read() is None
        assert source.last_error


def test_auto_order_per_os() -> None:
    assert auto_order("Darwin") == ("smc", "iohid", "macmon", "powermetrics")
    assert auto_order("Linux") == ("linux",)
    assert auto_order("Windows") == ()


# --- replay -------------------------------------------------------------------------------------


def write_replay(tmp_path: Path) -> Path:
    curve = tmp_path / "curve.csv"
    curve.write_text("seconds,celsius\n0,70\n0.3,90\n")
    return curve


def test_replay_is_labelled_simulated_with_its_file(tmp_path: Path) -> None:
    curve = write_replay(tmp_path)
    with open_source(f"replay:{curve}") as source:
        assert isinstance(source, ReplaySource)
        first = source.read()
        assert first is not None
        assert (first.simulated, first.source) == (True, f"replay:{curve}")
        assert first.sensor == "replay"  # a sensor named alone still says replay


def test_replay_plays_in_real_time_from_opening(tmp_path: Path) -> None:
    with open_source(f"replay:{write_replay(tmp_path)}") as source:
        assert isinstance(source, ReplaySource)
        first = source.read()
        assert first is not None and first.celsius == 70.0
        time.sleep(0.35)
        later = source.read()
        assert later is not None and later.celsius == 90.0


def test_replay_gap_reads_none_with_the_reason(tmp_path: Path) -> None:
    curve = tmp_path / "gap.csv"
    curve.write_text("0,\n")
    source = ReplaySource(curve)
    assert source.read() is None
    assert "no value" in (source.last_error or "")


def test_replay_bad_row_names_file_and_line(tmp_path: Path) -> None:
    curve = tmp_path / "bad.csv"
    curve.write_text("0,70\n1,eighty\n")
    with pytest.raises(ReplayFormatError, match=rf"{curve}:2:"):
        open_source(f"replay:{curve}")


def test_replay_missing_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ReplayFormatError, match="cannot read replay file"):
        open_source(f"replay:{tmp_path / 'missing.csv'}")


# --- sim ----------------------------------------------------------------------------------------


def test_sim_model_approaches_the_load_steady_state_with_time_constant_tau() -> None:
    params = SimParams(ambient_c=25.0, r_c_per_w=2.5, idle_w=4.0, max_w=28.0, tau_s=10.0)
    assert params.steady_c(0.0) == 35.0
    assert params.steady_c(1.0) == 95.0
    assert params.steady_c(7.0) == 95.0  # load is clamped
    after_tau = sim_step(35.0, 1.0, 10.0, params)
    assert after_tau == pytest.approx(95.0 - 60.0 / 2.718281828, abs=0.01)
    assert sim_step(35.0, 1.0, 1e6, params) == pytest.approx(95.0)
    assert sim_step(80.0, 0.0, 0.0, params) == 80.0


def test_sim_params_from_the_source_name() -> None:
    assert parse_sim_params("") == SimParams()
    assert parse_sim_params("ambient_c=30, tau_s=5") == SimParams(ambient_c=30.0, tau_s=5.0)
    for bad, why in [("tau=5", "known"), ("tau_s", "key=value"), ("tau_s=x", "number")]:
        with pytest.raises(SourceSpecError, match=why):
            parse_sim_params(bad)
    with pytest.raises(SourceSpecError, match="tau_s > 0"):
        open_source("sim:tau_s=0")


def loaded_sim() -> SimSource:
    """Idle while it starts, then fully loaded."""
    loads = iter([0.0, 1.0, 1.0])
    return SimSource(SimParams(tau_s=0.05, start_c=40.0), load=lambda: next(loads))


def test_sim_source_is_labelled_simulated() -> None:
    reading = loaded_sim().read()
    assert reading is not None
    assert (reading.source, reading.simulated) == ("sim", True)


def test_sim_source_is_driven_by_load() -> None:
    source = loaded_sim()
    time.sleep(0.3)
    reading = source.read()
    assert reading is not None
    assert reading.celsius == pytest.approx(95.0, abs=0.5)


def test_sim_by_name_uses_this_machines_cpu_load() -> None:
    with open_source("sim:start_c=50") as source:
        reading = source.read()
    assert reading is not None and 35.0 <= reading.celsius <= 95.0


def test_cpu_counters_are_read_from_proc_stats_first_line() -> None:
    """The first lines of this Linux machine's /proc/stat (kernel 6.x; fields as proc(5)
    lists them: user nice system idle iowait irq softirq steal guest guest_nice)."""
    captured = (
        b"cpu  3900076 2102 328892 3044926 33924 0 6117 5877 100 7\n"
        b"cpu0 1862950 1290 152266 1520000 7656 0 1631 2358 0 0\n"
    )
    total = 3900076 + 2102 + 328892 + 3044926 + 33924 + 0 + 6117 + 5877  # guest is in user
    assert proc_stat_counters(captured) == (total - 3044926 - 33924, total)
    assert proc_stat_counters(b"cpu  10 0 5 85\n") == (15.0, 100.0)  # an old kernel's four
    with pytest.raises(ValueError, match="cpu line"):
        proc_stat_counters(b"intr 12 0 3\n")


def test_cpu_load_is_a_share_of_this_machine() -> None:
    load = CpuLoad()
    assert all(0.0 <= load() <= 1.0 for _ in range(3))


# --- callables ----------------------------------------------------------------------------------


def test_callable_source_wraps_a_function() -> None:
    def soc() -> float | None:
        return 61.5

    source = CallableSource(soc)
    reading = source.read()
    assert reading is not None
    assert (reading.celsius, reading.source, reading.simulated) == (61.5, "callable:soc", False)
    nothing = CallableSource(lambda: None)
    assert nothing.read() is None and "returned None" in (nothing.last_error or "")
