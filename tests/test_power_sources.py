"""Power sources: their names, the pure decoding fed with captured output (IOReport channel lists,
macmon and powermetrics text), and the sources themselves on real files and real processes (a
fake powercap tree, fake tools on PATH; see tests/fixtures/README.md for where each capture comes
from). The macOS in-process sources (ioreport, smc) are tested through their pure layer only:
this is not a Mac."""

from __future__ import annotations

import json
import platform
import re
import time
from pathlib import Path

import pytest

from agent.power.base import Integrator, NoPowerSource
from agent.power.decode import (
    PowermetricsPowerAssembler,
    counter_delta,
    ioreport_energy,
    ioreport_rail,
    ioreport_rails,
    parse_macmon_power,
    rapl_rail,
    replay_energy,
)
from agent.power.meter import EnergyMeter
from agent.power.rapl import RaplSource
from agent.power.registry import meter_or_reason, open_power_source
from agent.power.streams import MacmonPowerSource, PowermetricsPowerSource
from agent.power.synthetic import PowerReplaySource, PowerSimSource
from agent.sensors.base import SourceUnavailable
from agent.sensors.replay import ReplayFormatError, parse_replay_csv
from shared.benchmark.energy import (
    SHORT_WINDOW_FLAG,
    MeterInfo,
    Window,
    cell_energy,
    energy_flags,
    whole,
)
from shared.cooling.sources import (
    KNOWN_POWER_SOURCES,
    SimParams,
    SourceSpecError,
    UnknownSourceError,
    parse_power_source_name,
)
from tests.conftest import documented_names
from tests.power_support import powercap_zone, write_counter

FIXTURES = Path(__file__).parent / "fixtures"
FAST = {"interval_s": 0.05, "startup_s": 5.0}


def channels(capture: str, value: int = 1000) -> list[tuple[str, str, int]]:
    """A captured channel list (name, unit) with every channel counting `value` units."""
    rows = []
    for line in (FIXTURES / "ioreport" / capture).read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, unit = line.split("\t")
        rows.append((name, unit, value))
    return rows


# --- names --------------------------------------------------------------------------------------


def test_power_source_names_and_their_refusals() -> None:
    documented = documented_names("energy.md", "| name |") | {"auto"}  # auto: above the table
    assert set(KNOWN_POWER_SOURCES) == documented and len(KNOWN_POWER_SOURCES) == len(documented)
    assert KNOWN_POWER_SOURCES[:2] == ("auto", "none")
    assert parse_power_source_name("RAPL") == ("rapl", "")
    assert parse_power_source_name("sim:idle_w=5,max_w=30") == ("sim", "idle_w=5,max_w=30")
    assert parse_power_source_name("replay:watts.csv") == ("replay", "watts.csv")
    with pytest.raises(UnknownSourceError) as excinfo:
        parse_power_source_name("wattmeter")
    assert "unknown power source 'wattmeter'" in str(excinfo.value)
    assert "ioreport" in str(excinfo.value) and "replay:CSV" in str(excinfo.value)
    with pytest.raises(SourceSpecError, match="replay:CSV"):
        parse_power_source_name("replay:")
    with pytest.raises(SourceSpecError, match="bad parameter"):
        parse_power_source_name("sim:volts=3")


@pytest.mark.skipif(platform.system() != "Linux", reason="lists what a Linux machine offers")
def test_a_mac_source_on_linux_names_what_this_machine_offers() -> None:
    for name in ("ioreport", "smc"):
        with pytest.raises(SourceUnavailable) as excinfo:
            open_power_source(name)
        offers = "auto, none, rapl, sim, replay:CSV, capture:FILE"
        assert f"this machine offers: {offers}" in str(excinfo.value)


def test_auto_without_a_meter_is_none_with_every_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLX_FLEET_SYSFS_ROOT", str(tmp_path / "empty"))
    source = open_power_source("auto")
    assert isinstance(source, NoPowerSource)
    if platform.system() == "Linux":
        assert "no powercap RAPL zone" in (source.last_error or "")


# --- IOReport -----------------------------------------------------------------------------------


def test_ioreport_rails_of_an_m1_ultra_match_names_exactly() -> None:
    """Two `DIE_n_CPU Energy` channels are the CPU, not the 100-odd per-core, cluster and DTL
    channels whose names hold "CPU" (all-smi#410); `GPU Energy` (nJ) is the GPU and `GPU0_0`
    is left out beside it; ANE0_0/ANE0_1 and DRAM0_0/DRAM0_1 are ANE and DRAM."""
    summed = ioreport_energy(channels("m1-ultra-energy-model.tsv"))
    assert summed.problems == []
    assert summed.joules == pytest.approx({"cpu": 2.0, "gpu": 1e-6, "ane": 2.0, "dram": 2.0})


def test_ioreport_rails_of_an_m5_max() -> None:
    summed = ioreport_energy(channels("m5-max-energy-model.tsv", value=2500))
    assert summed.joules == pytest.approx({"cpu": 2.5, "gpu": 2.5e-6, "ane": 2.5, "dram": 2.5})
    names = [name for name, _, _ in channels("m5-max-energy-model.tsv")]
    assert ioreport_rails(names) == ("cpu", "gpu", "ane", "dram")


def test_ioreport_gpu_parts_count_only_without_gpu_energy() -> None:
    assert ioreport_rail("GPU0_0", has_gpu_energy=True) is None
    assert ioreport_rail("GPU0_0", has_gpu_energy=False) == "gpu"
    assert ioreport_rail("GPU SRAM0_0", has_gpu_energy=False) is None
    assert ioreport_rail("DIE_1_CPU Energy", has_gpu_energy=True) == "cpu"
    assert ioreport_rail("EACC_CPU0", has_gpu_energy=True) is None
    assert ioreport_rail("DRAM", has_gpu_energy=True) == "dram"
    assert ioreport_rail("DRAM0_1", has_gpu_energy=True) == "dram"
    assert ioreport_rail("ANE", has_gpu_energy=True) == "ane"


def test_ioreport_units_are_read_per_channel_and_an_unknown_one_is_named() -> None:
    summed = ioreport_energy(
        [
            ("CPU Energy", "mJ  ", 1500),  # labels come padded: trimmed (macmon channel_unit)
            ("GPU Energy", "nJ", 2_000_000_000),
            ("ANE", "µJ", 250_000),
            ("DRAM", "uJ", 750_000),
            ("DIE_1_CPU Energy", "kWh", 3),
        ]
    )
    assert summed.joules == pytest.approx({"cpu": 1.5, "gpu": 2.0, "ane": 0.25, "dram": 0.75})
    assert summed.problems == ["DIE_1_CPU Energy: unknown unit 'kWh'"]


# --- RAPL ---------------------------------------------------------------------------------------


def test_counter_delta_across_a_wrap() -> None:
    assert counter_delta(100, 350, 1000) == 250
    assert counter_delta(900, 50, 1000) == 150
    assert counter_delta(5, 5, 1000) == 0


def test_rapl_zone_names() -> None:
    assert rapl_rail("package-0\n") == "cpu"
    assert rapl_rail("package-1") == "cpu"
    assert rapl_rail("dram") == "dram"
    assert rapl_rail("psys") == "system"
    assert rapl_rail("core") is None and rapl_rail("uncore") is None


def test_rapl_source_counts_packages_dram_and_a_wrap(tmp_path: Path) -> None:
    package0 = powercap_zone(tmp_path, "intel-rapl:0", "package-0", 900_000, 1_000_000)
    package1 = powercap_zone(tmp_path, "intel-rapl:1", "package-1", 0, 1_000_000)
    powercap_zone(tmp_path, "intel-rapl:0:0", "core", 0, 1_000_000)
    dram = powercap_zone(tmp_path, "intel-rapl:0:1", "dram", 10, 1_000_000)
    source = RaplSource(tmp_path)
    assert source.rails == ("cpu", "dram")
    assert source.resolution_s == pytest.approx(0.001)
    write_counter(package0 / "energy_uj", 400_000)  # wrapped: 100_000 + 400_000 uJ
    write_counter(package1 / "energy_uj", 250_000)
    write_counter(dram / "energy_uj", 20_010)
    reading = source.read()
    assert reading is not None
    assert reading.joules == pytest.approx({"cpu": 0.75, "dram": 0.02})
    assert reading.total_j == pytest.approx(0.77)
    assert not reading.simulated


def test_rapl_refuses_a_tree_without_zones_and_says_when_root_is_needed(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable, match="no powercap RAPL zone"):
        RaplSource(tmp_path)
    zone = powercap_zone(tmp_path, "intel-rapl:0", "package-0", 1, 10)
    (zone / "energy_uj").chmod(0o000)
    try:
        if _can_read(zone / "energy_uj"):
            pytest.skip("running as root: a mode-0 file is still readable")
        with pytest.raises(SourceUnavailable, match="root only.*CVE-2020-8694"):
            RaplSource(tmp_path)
    finally:
        (zone / "energy_uj").chmod(0o644)


def _can_read(path: Path) -> bool:
    try:
        path.read_text()
    except PermissionError:
        return False
    return True


def test_a_rapl_counter_that_cannot_be_read_fails_the_read_with_why(tmp_path: Path) -> None:
    zone = powercap_zone(tmp_path, "intel-rapl:0", "package-0", 1, 10)
    source = RaplSource(tmp_path)
    (zone / "energy_uj").unlink()
    assert source.read() is None
    assert "cannot read" in (source.last_error or "")


# --- macmon and powermetrics --------------------------------------------------------------------


def test_macmon_power_of_the_captured_line() -> None:
    line = (FIXTURES / "macmon-pipe.jsonl").read_text().splitlines()[0]
    watts = parse_macmon_power(line)
    assert watts == pytest.approx(
        {"cpu": 0.20486385, "gpu": 0.017451683, "ane": 0.0, "dram": 0.0, "system": 5.876533}
    )
    assert whole(watts) == pytest.approx(5.876533)  # the system rail holds the others
    for bad, why in (("not json", "not JSON"), ("[1]", "not a JSON object"), ("{}", "no")):
        with pytest.raises(ValueError, match=why):
            parse_macmon_power(bad)


@pytest.mark.parametrize(
    ("sys_power", "all_power"),
    [(0.0, 4.5), (-1.0, 4.5), (3.0, 4.5), (0.0, None)],
    ids=["unread", "negative", "below all_power", "unread, no all_power"],
)
def test_macmon_sys_power_that_is_no_reading_falls_back_to_the_rails(
    sys_power: float, all_power: float | None
) -> None:
    """macmon writes sys_power 0.0 when PSTR cannot be read and clamps a good one to at least
    all_power (src_lib/metrics.rs; mac-desk-check.md): anything else is not the machine's watts."""
    sample = {"cpu_power": 3.5, "gpu_power": 1.0, "ane_power": 0.0, "sys_power": sys_power}
    if all_power is not None:
        sample["all_power"] = all_power
    watts = parse_macmon_power(json.dumps(sample))
    assert "system" not in watts
    assert whole(watts) == pytest.approx(4.5)


def test_powermetrics_power_of_the_captured_sample() -> None:
    assembler = PowermetricsPowerAssembler()
    samples = [
        sample
        for line in (FIXTURES / "powermetrics-power-apple-silicon.txt").read_text().splitlines()
        if (sample := assembler.feed(line)) is not None
    ]
    assert len(samples) == 1  # complete at its Combined line; the GPU block adds nothing
    assert samples[0].watts == pytest.approx({"cpu": 0.954, "gpu": 0.012, "ane": 0.0})
    assert samples[0].seconds == pytest.approx(1.00351)


def test_powermetrics_sample_without_combined_line_ends_at_the_next_header() -> None:
    assembler = PowermetricsPowerAssembler()
    lines = [
        "*** Sampled system activity (Tue Mar 11 14:20:05 2025 +0100) (500.0ms elapsed) ***",
        "CPU Power: 1.5 W",
        "*** Sampled system activity (Tue Mar 11 14:20:06 2025 +0100) (500.0ms elapsed) ***",
    ]
    outputs = [assembler.feed(line) for line in lines]
    assert outputs[:2] == [None, None]
    assert outputs[2] is not None and outputs[2].watts == {"cpu": 1.5}


def test_macmon_power_source_integrates_each_interval(tool_log: Path) -> None:
    with MacmonPowerSource(**FAST) as source:
        assert source.resolution_s == pytest.approx(0.05)
        first = _wait_reading(source)
        later = _wait_reading(source, lambda r: r.total_j > first.total_j)
    steps = round((later.total_j - first.total_j) / (5.876533 * 0.05))
    assert steps >= 1
    assert later.total_j - first.total_j == pytest.approx(steps * 5.876533 * 0.05)
    assert later.watts["system"] == pytest.approx(5.876533)
    assert "system" in source.rails


def test_powermetrics_power_source_through_sudo(
    tool_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_POWERMETRICS_MODEL", "apple")
    with PowermetricsPowerSource(use_sudo=True, **FAST) as source:
        reading = _wait_reading(source)
    assert reading.watts == pytest.approx({"cpu": 0.954, "gpu": 0.012, "ane": 0.0})
    argv = tool_log.read_text().splitlines()[0].split()
    assert "sudo" in argv[1] and "cpu_power,gpu_power,ane_power" in argv


def test_powermetrics_power_on_intel_says_why(
    tool_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_POWERMETRICS_MODEL", "intel")
    with PowermetricsPowerSource(use_sudo=False, **FAST) as source:
        deadline = time.monotonic() + 10
        refused = re.compile(r"no cpu_power sampler|unrecognized sampler: cpu_power")
        while not refused.search(source.last_error or ""):
            assert time.monotonic() < deadline, source.last_error
            source.read()
            time.sleep(0.02)


def _wait_reading(source, done=lambda reading: True, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reading = source.read()
        if reading is not None and done(reading):
            return reading
        time.sleep(0.02)
    pytest.fail(f"no reading: {source.last_error}")


# --- sim and replay -----------------------------------------------------------------------------


def test_replay_energy_is_the_integral_of_the_steps() -> None:
    rows = parse_replay_csv("seconds,watts\n0,10\n2,20\n3,\n4,5\n", "curve.csv", unit="watts")
    assert replay_energy(rows, 1.0) == pytest.approx(10.0)
    assert replay_energy(rows, 2.5) == pytest.approx(30.0)
    assert replay_energy(rows, 3.5) == pytest.approx(40.0)  # the gap adds nothing
    assert replay_energy(rows, 6.0) == pytest.approx(50.0)
    late = parse_replay_csv("1,10\n", "late.csv", unit="watts")
    assert replay_energy(late, 0.5) is None
    with pytest.raises(ReplayFormatError, match="seconds,watts"):
        parse_replay_csv("0,1,2\n", "bad.csv", unit="watts")


def test_replay_source_is_labelled_and_counts_at_the_replayed_rate(tmp_path: Path) -> None:
    curve = tmp_path / "watts.csv"
    curve.write_text("seconds,watts\n0,12.5\n")
    source = PowerReplaySource(curve)
    first = source.read()
    time.sleep(0.2)
    second = source.read()
    assert first is not None and second is not None
    assert source.simulated and second.simulated and source.name == f"replay:{curve}"
    elapsed = second.monotonic - first.monotonic
    assert second.total_j - first.total_j == pytest.approx(12.5 * elapsed, rel=0.05)
    assert second.watts == {"system": 12.5}


def test_sim_power_follows_the_thermal_models_load() -> None:
    loads = iter([0.0, 1.0, 0.5])
    source = PowerSimSource(SimParams(idle_w=4.0, max_w=24.0), load=lambda: next(loads))
    time.sleep(0.05)
    reading = source.read()
    assert reading is not None and reading.watts == {"system": 24.0}
    assert source.simulated and reading.simulated
    assert reading.joules["system"] == pytest.approx(24.0 * 0.05, rel=0.5)


def test_a_job_reopens_the_daemons_source_by_its_spec(tmp_path: Path) -> None:
    """A job process opens its daemon's power source by `spec`: sim keeps its parameters."""
    curve = tmp_path / "watts.csv"
    curve.write_text("0,12.5\n")
    for name, spec in (
        ("sim:idle_w=50,max_w=50", "sim:idle_w=50,max_w=50"),
        (f"replay:{curve}", f"replay:{curve}"),
        ("none", "none"),
    ):
        with open_power_source(name) as daemons:
            assert daemons.spec == spec
        meter = meter_or_reason(spec, 0.0, 1.0, "no source")
        time.sleep(0.05)
        reading = meter.read()
        if name == "none":
            assert reading is None
        else:
            assert reading is not None and reading.total_w == pytest.approx(
                50.0 if name.startswith("sim") else 12.5
            )
        meter.close()


def test_integrator_from_deltas_and_from_watts() -> None:
    energy = Integrator()
    energy.add({"cpu": 2.0}, 0.5)
    energy.add_watts({"cpu": 8.0}, 0.25)
    assert energy.joules == {"cpu": 4.0}
    assert energy.watts == {"cpu": 8.0}


# --- the meter and a cell's energy ---------------------------------------------------------------


def test_cell_energy_from_windows() -> None:
    meter = MeterInfo("rapl", False, ("cpu", "dram"), 0.001)
    windows = [Window(0.5, {"cpu": 10.0, "dram": 2.0}), Window(0.5, {"cpu": 8.0, "dram": 2.0})]
    fields = cell_energy(windows, tokens_per_window=110, meter=meter, idle_w=4.0)
    assert fields["energy_j"] == pytest.approx(22.0)
    assert fields["energy_net_j"] == pytest.approx(22.0 - 4.0)
    assert fields["power_w"] == pytest.approx(22.0)
    assert fields["tokens_per_joule"] == pytest.approx(220 / 22.0)
    assert fields["joules_per_token"] == pytest.approx(22.0 / 220)
    assert fields["energy_by_rail_j"] == {"cpu": 18.0, "dram": 4.0}
    assert fields["energy_rails"] == ["cpu", "dram"]
    assert fields["energy_note"] is None and energy_flags(fields) == []


def test_windows_shorter_than_the_meters_resolution_are_flagged() -> None:
    meter = MeterInfo("ioreport", False, ("cpu", "gpu"), 2.3)
    fields = cell_energy([Window(0.05, {"cpu": 1.0})] * 3, 64, meter, None)
    assert fields["energy_net_j"] is None  # no baseline: unknown, not the gross
    assert fields["energy_short_windows"] == 3
    assert "3 of 3 windows shorter than the meter's resolution (2.3 s)" in fields["energy_note"]
    assert energy_flags(fields) == [SHORT_WINDOW_FLAG]


def test_meter_idle_baseline_and_a_dead_meter(tmp_path: Path) -> None:
    curve = tmp_path / "watts.csv"
    curve.write_text("0,6\n")
    meter = EnergyMeter(PowerReplaySource(curve), baseline_s=0.1)
    meter.measure_idle()
    assert meter.idle_w == pytest.approx(6.0)
    cell = meter.cell(warmup=1, tokens=10)
    cell.started(0)  # warm-up: not metered
    cell.stopped(0, 0.01)
    cell.started(1)
    time.sleep(0.02)
    cell.stopped(1, 0.02)
    fields = cell.fields()
    assert len(cell.windows) == 1
    assert fields["power_w"] == pytest.approx(6.0)
    assert fields["energy_net_j"] == pytest.approx(0.0, abs=1e-9)
    assert fields["energy_simulated"] is True


def test_a_meter_that_dies_leaves_the_cell_without_energy_saying_why(tmp_path: Path) -> None:
    zone = powercap_zone(tmp_path, "intel-rapl:0", "package-0", 1, 10**9)
    meter = EnergyMeter(RaplSource(tmp_path))
    cell = meter.cell(warmup=0, tokens=10)
    cell.started(0)
    (zone / "energy_uj").unlink()  # the meter goes away mid-window
    cell.stopped(0, 0.01)
    fields = cell.fields()
    assert fields["energy_j"] is None and fields["energy_source"] == "rapl"
    assert "a meter read failed: rapl: cannot read" in fields["energy_note"]


def test_no_meter_says_so() -> None:
    meter = EnergyMeter(NoPowerSource("no power meter found: rapl: no powercap RAPL zone"))
    assert not meter.present
    cell = meter.cell(0, 10)
    cell.started(0)
    cell.stopped(0, 0.1)
    fields = cell.fields()
    assert fields["energy_j"] is None and fields["energy_source"] is None
    assert fields["energy_note"].startswith("no power meter")
