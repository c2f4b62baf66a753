"""The clocks: DVFS tables, residencies and the interval's clocks (agent.clocks.decode), fed the
bytes and counters macmon's code reads; cpufreq on a tree standing in for /sys; which clock
source a machine gets.

The byte layouts come from vladkens/macmon src_lib/sources.rs: a `voltage-states*` property is
8-byte entries, frequency (u32 little-endian) then voltage (u32) (`get_dvfs_mhz`); `acc-clusters`
is 8-byte entries, byte 0 the table number, byte 1 the tier (`parse_acc_clusters`). Residency
layouts are macmon's own test cases (src_lib/metrics.rs tests) and public dumps: per-core `V<i>P<j>`
states after IDLE (macmon#68, an M2 Ultra), GPUPH's OFF, P1... (lablup/all-smi#317), an M2 E
core missing its top state (dehydratedpotato/socpowerbud#8)."""

from __future__ import annotations

import struct
import sys

import pytest

from agent.clocks.base import NoClockSource
from agent.clocks.cpufreq import CpufreqSource, cpufreq_tiers
from agent.clocks.decode import (
    CPU_CORE_STATES,
    CPU_GROUP,
    GPU_CHANNEL,
    GPU_GROUP,
    GPU_STATES,
    ClockTables,
    acc_cluster_keys,
    active_clock,
    cpu_tier,
    dvfs_frequencies_hz,
    interval_clocks,
    ioreport_note,
    pmgr_tables,
    state_delta,
)
from agent.clocks.ioreport import IOReportClockSource
from agent.clocks.registry import open_clock_source
from agent.sensors.base import SourceUnavailable
from agent.sensors.sysfs import LiveSysfs
from tests.sysfs_support import build_sysfs

M1_GPU_HZ = [0, 396_000_000, 528_000_000, 720_000_000, 924_000_000, 1_128_000_000, 1_278_000_000]
"""An M1's GPU table in Hz with its off entry first (powermetrics prints these clocks)."""
M4_P_KHZ = [1_260_000, 2_112_000, 3_000_000, 3_936_000, 4_464_000]
"""M4 CPU tables are in kHz (macmon cpu_freq_scale; 4464 MHz top: vladkens/macmon#78)."""


def table_blob(frequencies: list[int], millivolts: int = 800) -> bytes:
    return b"".join(struct.pack("<II", value, millivolts) for value in frequencies)


def test_a_table_in_hz_and_one_in_khz_decode_alike() -> None:
    assert dvfs_frequencies_hz(table_blob(M1_GPU_HZ)) == [float(v) for v in M1_GPU_HZ]
    assert dvfs_frequencies_hz(table_blob(M4_P_KHZ)) == [v * 1e3 for v in M4_P_KHZ]


@pytest.mark.parametrize(
    ("blob", "said"),
    [
        (b"", "not a whole number"),
        (b"\x01" * 12, "not a whole number"),
        (table_blob([0, 0]), "every entry reads 0"),
        (table_blob([4_000_000_000, 4_000_000]), None),
    ],
)
def test_a_broken_table_says_why(blob: bytes, said: str | None) -> None:
    if said is None:  # mixed: the Hz entry sets Hz, and 4 MHz is a plausible small entry
        assert dvfs_frequencies_hz(blob) == [4e9, 4e6]
        return
    with pytest.raises(ValueError, match=said):
        dvfs_frequencies_hz(blob)


def test_acc_clusters_name_the_two_highest_tiers() -> None:
    """An M5 Max: tables 22, 23 and 5 at tiers 1, 2 and... (oshi/oshi#3674); the highest tier
    is P, the next E, whatever order the entries come in."""
    blob = bytes([23, 2, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 22, 1, 0, 0, 0, 0, 0, 0])
    assert acc_cluster_keys(blob) == ("voltage-states22-sram", "voltage-states23-sram")
    with pytest.raises(ValueError, match="fewer than two"):
        acc_cluster_keys(blob[:8])


def test_pmgr_tables_fall_back_to_acc_clusters_and_drop_the_gpu_off_entry() -> None:
    acc = bytes([22, 1, 0, 0, 0, 0, 0, 0, 23, 2, 0, 0, 0, 0, 0, 0])
    tables = pmgr_tables(
        {
            "voltage-states9": table_blob(M1_GPU_HZ),
            "acc-clusters": acc,
            "voltage-states22-sram": table_blob([1_000_000, 2_000_000]),
            "voltage-states23-sram": table_blob(M4_P_KHZ),
        }
    )
    assert tables.gpu == [float(v) for v in M1_GPU_HZ[1:]]
    assert tables.cpu_e == [1e9, 2e9]
    assert tables.cpu_p == [v * 1e3 for v in M4_P_KHZ]
    assert tables.problems == ()
    missing = pmgr_tables({"voltage-states9": b"\x00" * 5})
    assert missing.gpu is None
    assert any("voltage-states9" in problem for problem in missing.problems)
    assert any("P-cluster" in problem for problem in missing.problems)


def test_macmons_own_residency_case() -> None:
    """metrics.rs `calculates_frequency_over_the_complete_residency_window`: 1800 MHz, active
    0.5 (its states are named by MHz, so by position)."""
    clock = active_clock(
        [("DOWN", 0), ("IDLE", 500), ("1000 MHz", 100), ("2000 MHz", 400)], [1e9, 2e9]
    )
    assert clock is not None
    assert clock.hz == pytest.approx(1.8e9)
    assert clock.active == pytest.approx(0.5)


def test_states_named_by_index_find_their_entry_even_with_one_missing() -> None:
    """An M2 E core lists V0P5..V4P1 with no V5P0 (socpowerbud#8): V<i> is entry i."""
    table = [0.6e9, 0.9e9, 1.2e9, 1.5e9, 1.8e9, 2.4e9]
    states = [("DOWN", 10), ("IDLE", 10), ("V0P5", 0), ("V1P4", 0), ("V2P3", 0), ("V3P2", 0),
              ("V4P1", 20)]  # fmt: skip
    clock = active_clock(states, table)
    assert clock is not None and clock.hz == pytest.approx(1.8e9)
    assert clock.active == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no entry"):
        active_clock([("IDLE", 1), ("V9P0", 1)], table)


def test_gpuph_p_states_index_the_table_without_its_off_entry() -> None:
    gpu = [float(v) for v in M1_GPU_HZ[1:]]
    states = [("OFF", 50), ("P1", 0), ("P2", 0), ("P3", 0), ("P4", 0), ("P5", 25), ("P6", 25)]
    clock = active_clock(states, gpu)
    assert clock is not None
    assert clock.hz == pytest.approx((1_128e6 + 1_278e6) / 2)
    assert clock.active == pytest.approx(0.5)
    idle = active_clock([("OFF", 100), ("P1", 0)], gpu)
    assert idle is not None and idle.hz is None and idle.active == 0.0
    assert active_clock([("OFF", 0), ("P1", 0)], gpu) is None


def test_a_delta_needs_the_same_states_and_counters_that_only_grow() -> None:
    before = [("IDLE", 100), ("V0P1", 50), ("V1P0", 10)]
    after = [("IDLE", 160), ("V0P1", 50), ("V1P0", 50)]
    assert state_delta(before, after) == [("IDLE", 60), ("V0P1", 0), ("V1P0", 40)]
    with pytest.raises(ValueError, match="went back"):
        state_delta(after, before)
    with pytest.raises(ValueError, match="states changed"):
        state_delta(before, after[:2])


def test_tiers_by_channel_name() -> None:
    assert [cpu_tier(name) for name in ("PCPU0", "DIE_1_PCPU1_CPU0", "ECPU3", "MCPU2", "GPUPH")] \
        == ["P", "P", "E", "E", None]  # fmt: skip


def test_an_interval_weights_each_core_by_the_time_it_ran() -> None:
    tables = ClockTables(gpu=[1e9, 1.4e9], cpu_e=[1e9, 2e9], cpu_p=[2e9, 4e9])
    deltas = {
        (GPU_GROUP, GPU_STATES, GPU_CHANNEL): [("OFF", 25), ("P1", 0), ("P2", 75)],
        (CPU_GROUP, CPU_CORE_STATES, "PCPU0"): [("IDLE", 0), ("V0P1", 0), ("V1P0", 100)],
        (CPU_GROUP, CPU_CORE_STATES, "PCPU1"): [("IDLE", 75), ("V0P1", 25), ("V1P0", 0)],
        (CPU_GROUP, CPU_CORE_STATES, "ECPU0"): [("IDLE", 100), ("V0P1", 0), ("V1P0", 0)],
        (CPU_GROUP, CPU_CORE_STATES, "PCPU9"): [("IDLE", 1), ("V7P0", 1)],
    }
    clocks = interval_clocks(deltas, tables)
    assert clocks.gpu_hz == pytest.approx(1.4e9)
    assert clocks.gpu_active == pytest.approx(0.75)
    assert clocks.cpu_p_hz == pytest.approx((100 * 4e9 + 25 * 2e9) / 125)
    assert clocks.cpu_e_hz == pytest.approx(1e9)  # no core ran: the lowest state (macmon)
    assert clocks.problems == ("PCPU9: state V7P0 has no entry in a 2-entry table",)


def test_the_note_says_what_each_generation_shows() -> None:
    assert "requested" in ioreport_note("Apple M4 Pro") and "macmon#78" in ioreport_note("Apple M4")
    assert "granted" in ioreport_note("Apple M5 Max")
    assert "unconfirmed" in ioreport_note("Apple M2 Ultra")


class RecordedStates:
    """Cumulative residencies, one sample per read, as IOReportCreateSamples gives them."""

    def __init__(self, samples: list[dict]) -> None:
        self.samples = samples
        self.closed = False

    def sample(self) -> dict:
        if not self.samples:
            raise OSError("IOReportCreateSamples gave nothing")
        return self.samples.pop(0)

    def close(self) -> None:
        self.closed = True


def test_the_source_reads_the_interval_between_two_samples() -> None:
    gpu = (GPU_GROUP, GPU_STATES, GPU_CHANNEL)
    core = (CPU_GROUP, CPU_CORE_STATES, "PCPU0")
    first = {gpu: [("OFF", 1000), ("P1", 0), ("P2", 0)], core: [("IDLE", 10), ("V0P0", 0)]}
    second = {gpu: [("OFF", 1010), ("P1", 0), ("P2", 30)], core: [("IDLE", 10), ("V0P0", 40)]}
    properties = {
        "voltage-states9": table_blob([0, 1_000_000_000, 1_400_000_000]),
        "voltage-states5-sram": table_blob([3_000_000]),
    }
    source = IOReportClockSource(RecordedStates([first, second]), properties, "Apple M4 Max")
    reading = source.read()
    assert reading is not None
    assert (reading.gpu_hz, reading.gpu_active) == (pytest.approx(1.4e9), pytest.approx(0.75))
    assert reading.cpu_p_hz == pytest.approx(3e9) and reading.cpu_e_hz is None
    assert reading.source == "ioreport" and not reading.simulated
    assert reading.note is not None and "requested" in reading.note
    assert source.read() is None and "IOReportCreateSamples" in (source.last_error or "")


def test_no_table_at_all_is_unavailable_with_the_reason() -> None:
    states = RecordedStates([])
    with pytest.raises(SourceUnavailable, match="no GPU table"):
        IOReportClockSource(states, {}, "Apple M1")
    assert states.closed


@pytest.mark.skipif(sys.platform == "darwin", reason="off a Mac IOReport is unavailable")
def test_off_a_mac_ioreport_is_unavailable_not_an_abort() -> None:
    with pytest.raises(SourceUnavailable, match="need macOS"):
        IOReportClockSource()


CPUFREQ = "devices/system/cpu/cpu{}/cpufreq/{}"


def test_cpufreq_splits_two_kinds_of_cpu_into_tiers(tmp_path) -> None:
    files = {}
    for cpu, (now, top) in enumerate([(3_000_000, 5_000_000), (4_000_000, 5_000_000),
                                      (1_000_000, 3_000_000)]):  # fmt: skip
        files[CPUFREQ.format(cpu, "scaling_cur_freq")] = f"{now}\n"
        files[CPUFREQ.format(cpu, "cpuinfo_max_freq")] = f"{top}\n"
    source = CpufreqSource(LiveSysfs(build_sysfs(tmp_path, files)))
    reading = source.read()
    assert reading is not None
    assert reading.cpu_p_hz == pytest.approx(3.5e9) and reading.cpu_e_hz == pytest.approx(1e9)
    assert reading.gpu_hz is None and reading.gpu_active is None
    assert reading.source == "cpufreq"
    assert cpufreq_tiers({"cpu0": (2_000_000, None)}) == (2e9, None)


def test_no_cpufreq_is_unavailable_and_says_so(tmp_path) -> None:
    with pytest.raises(SourceUnavailable, match="no scaling_cur_freq"):
        CpufreqSource(LiveSysfs(tmp_path))


def test_a_thermal_sources_own_clock_comes_first(tmp_path, monkeypatch) -> None:
    class WithClock:
        clock_source = NoClockSource("the plant's")

    assert open_clock_source(WithClock()) is WithClock.clock_source
    monkeypatch.setenv("MLX_FLEET_SYSFS_ROOT", str(tmp_path))
    if sys.platform.startswith("linux"):
        chosen = open_clock_source(object())
        assert isinstance(chosen, NoClockSource)
        assert chosen.last_error is not None
        assert chosen.last_error.startswith("unavailable: cpufreq: no scaling_cur_freq")


def test_a_thermal_plants_clock_is_read_as_a_clock_source(tmp_path) -> None:
    """The plant's clock (agent.thermal.plant.PlantClocks) is no ClockSource: read through one,
    labelled simulated, and a failing read is a None reading with the reason."""
    from agent.thermal.plant import PlantSource
    from shared.cooling.plant import parse_plant_spec

    plant = PlantSource(
        parse_plant_spec(":air"), load=lambda: 0.0, state_path=tmp_path / "plant.json"
    )
    try:
        clock = open_clock_source(plant)
        reading = clock.read()
        assert reading is not None and reading.simulated and clock.simulated
        assert reading.source.startswith("plant") and reading.gpu_hz is not None
    finally:
        plant.close()

    class Broken:
        name = "broken"

        def read(self) -> None:
            raise RuntimeError("the model diverged")

    class WithBroken:
        clock_source = Broken()

    broken = open_clock_source(WithBroken())
    assert broken.read() is None and broken.last_error == "broken: the model diverged"


# --- captures ---------------------------------------------------------------------------------


def states_row(channel: str, states: list[tuple[str, int]]) -> list:
    """A capture's `ioreport_states` row (agent.sensors.capture.INPUTS): cumulative ticks per
    state as IOReportStateGetResidency reads them, named as IOReportStateGetNameForIndex."""
    group, subgroup = ("GPU Stats", "GPU Performance States") if channel == "GPUPH" else (
        "CPU Stats", "CPU Core Performance States")  # fmt: skip
    return [group, subgroup, channel, [[name, ticks] for name, ticks in states]]


def clock_capture(path, polls: list[dict], header: dict | None = None):
    from agent.sensors.capture import header_line, poll_line

    machine = {"chip": "Apple M4 Max", "pmgr": {
        "voltage-states9": table_blob([0, 1_000_000_000, 1_400_000_000]).hex(),
        "voltage-states1-sram": table_blob([1_000_000, 2_000_000]).hex(),
        "voltage-states5-sram": table_blob([2_000_000, 4_000_000]).hex(),
    }} if header is None else header  # fmt: skip
    path.write_text("\n".join([header_line(machine), *map(poll_line, polls)]) + "\n")
    return path


def test_a_captures_residencies_replay_its_clocks_labelled_replayed(tmp_path) -> None:
    """Two polls' cumulative counters make each interval, as two live reads do; the tables and
    the chip's note come from the header (agent doctor --capture writes both)."""
    from agent.thermal.capture import CaptureSource

    def poll(t: int, off: int, p2: int, pcpu: int) -> dict:
        return {
            "t": t,
            "iohid": {"PMU tdie1": 60.0 + t},
            "ioreport_states": [
                states_row("GPUPH", [("OFF", off), ("P1", 0), ("P2", p2)]),
                states_row("PCPU0", [("IDLE", 100), ("V0P1", 0), ("V1P0", pcpu)]),
            ],
        }

    polls = [poll(0, 1000, 0, 0), poll(1, 1010, 90, 50), poll(2, 1110, 90, 50)]
    path = clock_capture(tmp_path / "clocks.jsonl", polls)
    clock = [0.0]
    with CaptureSource(str(path), lambda: clock[0]) as source:
        clocks = open_clock_source(source)
        assert clocks is source.clock_source
        assert clocks.read() is None and "no interval" in (clocks.last_error or "")
        clock[0] = 1.0
        reading = clocks.read()
        assert reading is not None
        assert reading.gpu_hz == pytest.approx(1.4e9) and reading.gpu_active == pytest.approx(0.9)
        assert reading.cpu_p_hz == pytest.approx(4e9) and reading.cpu_e_hz is None
        assert reading.source == "capture" and not reading.simulated
        assert (
            reading.note is not None and "requested" in reading.note and "replayed" in reading.note
        )
        clock[0] = 2.0
        idle = clocks.read()
        assert idle is not None and idle.gpu_hz is None and idle.gpu_active == 0.0


def test_a_capture_without_clocks_gives_none_never_this_machines(tmp_path) -> None:
    from agent.thermal.capture import CaptureSource

    path = clock_capture(tmp_path / "bare.jsonl", [{"t": 0, "iohid": {"PMU tdie1": 60.0}}])
    with CaptureSource(str(path)) as source:
        clocks = open_clock_source(source)
        assert isinstance(clocks, NoClockSource)
        assert "holds no clock input" in (clocks.last_error or "")


@pytest.mark.parametrize(
    ("polls", "header", "said"),
    [
        ([{"t": 0, "iohid": {"x": 1.0}, "ioreport_states": [["G", None, "C", [["S", -1]]]]}], None,
         "ioreport_states: expected"),
        ([{"t": 0, "iohid": {"x": 1.0}, "ioreport_states": {}}], None, "must be a list"),
        ([{"t": 0, "iohid": {"x": 1.0}, "ioreport_states": []}], {"chip": "x"}, "`pmgr` tables"),
        ([{"t": 0, "iohid": {"x": 1.0}, "ioreport_states": []}], {"pmgr": {"k": "zz"}}, "hex"),
    ],
)  # fmt: skip
def test_a_capture_with_bad_clock_input_is_refused_naming_it(
    tmp_path, polls: list, header: dict | None, said: str
) -> None:
    from agent.sensors.capture import CaptureFormatError
    from agent.thermal.capture import CaptureSource

    path = clock_capture(tmp_path / "bad.jsonl", polls, header)
    with pytest.raises(CaptureFormatError, match=said):
        CaptureSource(str(path))


def test_a_missing_channel_is_said_beside_the_clocks_there_are() -> None:
    """An unknown is said, never left blank: a table whose channel IOReport lacks."""
    tables = ClockTables(gpu=[1e9], cpu_e=[1e9], cpu_p=[2e9])
    deltas = {(CPU_GROUP, CPU_CORE_STATES, "PCPU0"): [("IDLE", 1), ("V0P0", 1)]}
    clocks = interval_clocks(deltas, tables)
    assert clocks.cpu_p_hz == 2e9 and clocks.gpu_hz is None and clocks.gpu_active is None
    assert clocks.problems == (
        "no GPUPH channel in IOReport's GPU Performance States",
        "no E-cluster core channel in IOReport's CPU Core Performance States",
    )
    source = IOReportClockSource(
        RecordedStates([deltas, {key: [(n, t * 2) for n, t in v] for key, v in deltas.items()}]),
        {"voltage-states9": table_blob([0, 1_000_000_000]),
         "voltage-states5-sram": table_blob([2_000_000])},
        "Apple M2",
    )  # fmt: skip
    reading = source.read()
    assert reading is not None and reading.note is not None
    assert reading.note.endswith("no GPUPH channel in IOReport's GPU Performance States")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="binds this process's libc")
def test_a_symbol_the_os_lacks_is_the_source_unavailable_naming_it() -> None:
    """How the ctypes layer meets a private symbol renamed or gone in a macOS release."""
    import ctypes

    from agent.sensors.macos_libs import bind_or_unavailable

    libc = ctypes.CDLL(None)
    assert bind_or_unavailable(libc, "ioreport", "getpid", ctypes.c_int)() > 0
    with pytest.raises(
        SourceUnavailable, match="ioreport: source unavailable: IOReportStateGetResidency missing"
    ):
        bind_or_unavailable(libc, "ioreport", "IOReportStateGetResidency", ctypes.c_int64)
