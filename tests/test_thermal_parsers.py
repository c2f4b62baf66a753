"""Pure parsing and selection, fed with captured tool output (tests/fixtures/README.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agent.sensors.process import unrecognized_sampler
from agent.sensors.replay import ReplayFormatError, parse_replay_csv, replay_value
from agent.thermal.parsers import (
    NoDieStreak,
    PowermetricsAssembler,
    PowermetricsSample,
    hottest,
    linux_soc_celsius,
    parse_macmon_line,
    parse_powermetrics,
    parse_sysfs,
    select_die_sensors,
)

FIXTURES = Path(__file__).parent / "fixtures"


def capture(name: str) -> str:
    return (FIXTURES / name).read_text()


# --- powermetrics -------------------------------------------------------------------------------


def test_intel_smc_block_gives_die_temperatures() -> None:
    sample = parse_powermetrics(capture("powermetrics-smc-intel.txt"))
    assert sample == PowermetricsSample(
        {"CPU die temperature": 47.42, "GPU die temperature": 41.0}, None
    )
    assert hottest(sample.sensors) == 47.42


def test_apple_silicon_thermal_sampler_gives_only_a_pressure_level() -> None:
    sample = parse_powermetrics(capture("powermetrics-thermal-apple-silicon.txt"))
    assert sample == PowermetricsSample({}, "Nominal")


def test_text_without_values_is_no_sample() -> None:
    assert parse_powermetrics("Machine model: Mac16,12\nOS version: 24D70\n") is None
    assert parse_powermetrics(capture("powermetrics-smc-apple-silicon.txt")) is None


@pytest.mark.parametrize(
    "line",
    [
        capture("powermetrics-smc-apple-silicon.txt"),
        "unrecongnized sampler: smc",
        "Unrecognized sampler smc",
    ],
)
def test_refused_sampler_is_recognised_in_both_spellings(line: str) -> None:
    assert unrecognized_sampler(line) == "smc"


def test_refused_sampler_not_found_in_a_normal_sample() -> None:
    assert unrecognized_sampler(capture("powermetrics-smc-intel.txt")) is None


def feed_all(assembler: PowermetricsAssembler, text: str) -> list[PowermetricsSample]:
    return [s for line in text.splitlines() if (s := assembler.feed(line)) is not None]


def test_assembler_publishes_each_streamed_sample_once_without_waiting_for_the_next() -> None:
    text = capture("powermetrics-smc-intel.txt")
    cut = text.index("*** Sampled")
    hotter = text[cut:].replace("47.42", "88.50")
    assembler = PowermetricsAssembler()
    first = feed_all(assembler, text)
    assert [hottest(s.sensors) for s in first] == [47.42]
    second = feed_all(assembler, "\n" + hotter)
    assert [hottest(s.sensors) for s in second] == [88.5]


def test_assembler_publishes_a_last_block_without_blank_line_at_the_next_header() -> None:
    assembler = PowermetricsAssembler()
    body = "*** Sampled system activity (x)\n**** Thermal pressure ****\n"
    body += "Current pressure level: Heavy"
    assert feed_all(assembler, body) == []
    assert assembler.feed("*** Sampled system activity (y)") == PowermetricsSample({}, "Heavy")


def test_assembler_ignores_the_machine_header() -> None:
    assembler = PowermetricsAssembler()
    text = capture("powermetrics-thermal-apple-silicon.txt")
    assert feed_all(assembler, text[: text.index("*** Sampled")]) == []


# --- macmon -------------------------------------------------------------------------------------


def test_macmon_line_gives_cpu_and_gpu_averages() -> None:
    sensors = parse_macmon_line(capture("macmon-pipe.jsonl").splitlines()[0])
    assert sensors == {"cpu_temp_avg": 43.73614, "gpu_temp_avg": 36.95167}
    assert hottest(sensors) == 43.73614


def test_macmon_drops_implausible_values() -> None:
    assert parse_macmon_line('{"temp": {"cpu_temp_avg": 0.0, "gpu_temp_avg": 51.5}}') == {
        "gpu_temp_avg": 51.5
    }
    assert parse_macmon_line('{"temp": {"cpu_temp_avg": true, "x": 400}}') == {}


@pytest.mark.parametrize(
    ("line", "reason"),
    [("garbage", "not JSON"), ("[1, 2]", "no 'temp'"), ('{"cpu_power": 1.0}', "no 'temp'")],
)
def test_macmon_garbage_raises_with_a_reason(line: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_macmon_line(line)


# --- Linux sysfs --------------------------------------------------------------------------------

INTEL_LAPTOP = {
    "class/thermal/thermal_zone0/type": "acpitz\n",
    "class/thermal/thermal_zone0/temp": "27800\n",
    "class/thermal/thermal_zone1/type": "x86_pkg_temp\n",
    "class/thermal/thermal_zone1/temp": "61000\n",
    "class/hwmon/hwmon2/name": "coretemp\n",
    "class/hwmon/hwmon2/temp1_label": "Package id 0\n",
    "class/hwmon/hwmon2/temp1_input": "62000\n",
    "class/hwmon/hwmon2/temp2_label": "Core 0\n",
    "class/hwmon/hwmon2/temp2_input": "64000\n",
    "class/hwmon/hwmon3/name": "nvme\n",
    "class/hwmon/hwmon3/temp1_input": "70850\n",
}


def test_sysfs_names_every_sensor_by_where_it_came_from() -> None:
    assert parse_sysfs(INTEL_LAPTOP) == {
        "thermal_zone0/acpitz": 27.8,
        "thermal_zone1/x86_pkg_temp": 61.0,
        "hwmon2/coretemp/Package id 0": 62.0,
        "hwmon2/coretemp/Core 0": 64.0,
        "hwmon3/nvme/temp1": 70.85,
    }


def test_sysfs_soc_is_the_hottest_cpu_sensor_not_the_hotter_disk() -> None:
    assert linux_soc_celsius(parse_sysfs(INTEL_LAPTOP)) == 64.0


def test_sysfs_without_a_cpu_sensor_uses_the_hottest() -> None:
    assert linux_soc_celsius({"thermal_zone0/acpitz": 40.0, "hwmon0/nvme/temp1": 45.0}) == 45.0
    assert linux_soc_celsius({}) is None


def test_sysfs_skips_unreadable_and_implausible_values() -> None:
    files = {
        "class/thermal/thermal_zone0/temp": "garbage",
        "class/thermal/thermal_zone1/temp": "-273000",
        "class/thermal/thermal_zone2/temp": "45000",
        "class/hwmon/hwmon0/temp1_label": "no input beside me",
    }
    assert parse_sysfs(files) == {"thermal_zone2/unknown": 45.0}


# --- IOHID selection ----------------------------------------------------------------------------


def hid_capture(name: str) -> list[tuple[str, float]]:
    """`name | °C` lines of a per-generation HID capture (tests/fixtures/iohid/README.md)."""
    pairs = []
    for line in capture(f"iohid/{name}").splitlines():
        sensor, _, value = line.rpartition("|")
        pairs.append((sensor.strip(), float(value)))
    return pairs


def test_base_m1_keeps_tdie_soc_die_and_gpu_mtr_and_drops_the_calibration_values() -> None:
    """stats#210: PMU tcal and PMU2 TR0Z (51.9, constants) would otherwise be the hottest."""
    dies = select_die_sensors(hid_capture("m1-mac-mini.txt"))
    assert dies == {
        "GPU MTR Temp Sensor1": 27.0,
        "GPU MTR Temp Sensor4": 27.6,
        "PMGR SOC Die Temp Sensor0": 29.0,
        "PMGR SOC Die Temp Sensor1": 28.7,
        "PMGR SOC Die Temp Sensor2": 28.5,
        "PMU tdie1": 37.3,
        "PMU tdie2": 34.3,
        "PMU tdie4": 36.5,
        "PMU tdie5": 36.2,
        "PMU tdie6": 36.0,
        "PMU tdie7": 35.9,
        "PMU tdie8": 34.4,
    }
    assert hottest(dies) == 37.3


def test_m3_pro_keeps_tdie_and_drops_tcal_battery_nand_and_noname() -> None:
    """oshi#3534: no TP* and no MTR names on an M3 Pro; tcal (51.9) must not win."""
    dies = select_die_sensors(hid_capture("m3-pro.txt"))
    assert dies == {"PMU tdie1": 40.0, "PMU tdie10": 41.7}


def test_the_gpu_sensor_is_kept_when_it_is_the_hottest() -> None:
    """M2 Max names (oshi#3534): PMU TP*g are the GPU, the hottest part under MLX's GPU work."""
    values = {
        "PMU tdie0": 52.0,
        "PMU tdie10": 55.1,
        "PMU TP0s": 50.0,
        "PMU TP1g": 63.4,
        "PMU TP1s": 51.0,
        "PMU TP2g": 61.8,
        "PMU TP3g": 60.2,
        "PMU tdev3": 40.0,
        "PMU tcal": 51.9,
    }
    dies = select_die_sensors(values)
    assert set(dies) == {"PMU tdie0", "PMU tdie10", "PMU TP1g", "PMU TP2g", "PMU TP3g"}
    assert hottest(dies) == 63.4


def test_mtr_sensors_are_kept_and_faulty_values_discarded() -> None:
    values = {
        "pACC MTR Temp Sensor2": 58.4,
        "eACC MTR Temp Sensor0": 49.9,
        "GPU MTR Temp Sensor1": 61.7,
        "pACC MTR Temp Sensor5": -1.0,
        "GPU MTR Temp Sensor4": 180.0,
        "SOC MTR Temp Sensor0": 70.0,
        "ANE MTR Temp Sensor1": 30.0,
    }
    assert select_die_sensors(values) == {
        "pACC MTR Temp Sensor2": 58.4,
        "eACC MTR Temp Sensor0": 49.9,
        "GPU MTR Temp Sensor1": 61.7,
        "SOC MTR Temp Sensor0": 70.0,
    }


def test_the_hid_client_is_rebuilt_after_reads_that_found_no_die() -> None:
    streak = NoDieStreak(limit=3)
    assert [streak.rebuild_after(n) for n in (5, 0, 0, 4, 0, 0)] == [False] * 6
    assert streak.rebuild_after(0) is True  # the third read in a row without a die
    assert streak.rebuild_after(0) is False  # counting starts again with the new client


def polls_with_a_die(counted: Callable[[list[tuple[str, float]]], int]) -> list[int]:
    """The polls at which an iohid client, rebuilt by NoDieStreak on `counted(values read)`,
    reads a die sensor. A client sees the services that existed when it was made, as long as
    they exist: the die service vanishes across a sleep (polls 5-9) and comes back as a new
    service, while the NAND sensor answers throughout."""

    def services(poll: int) -> dict[tuple[str, int], float]:  # (name, generation) -> °C
        die = {} if 5 <= poll < 10 else {("PMU tdie1", 0 if poll < 5 else 1): 48.0}
        return {("NAND CH0 temp", 0): 35.0, **die}

    streak = NoDieStreak(limit=3)
    client = set(services(0))
    found = []
    for poll in range(30):
        alive = services(poll)
        seen = [(key[0], value) for key, value in alive.items() if key in client]
        if streak.rebuild_after(counted(seen)):
            client = set(alive)
            seen = [(name, value) for (name, _), value in alive.items()]
        if select_die_sensors(seen):
            found.append(poll)
    return found


def test_die_services_back_from_sleep_are_found_again_while_a_nand_sensor_answers() -> None:
    found = polls_with_a_die(lambda seen: len(select_die_sensors(seen)))
    assert found[:5] == [0, 1, 2, 3, 4]
    assert min(poll for poll in found if poll >= 10) - 10 < 3  # within `limit` polls
    assert found[-1] == 29
    # Counting services that answered instead, the NAND sensor kept the old client forever:
    assert polls_with_a_die(len) == [0, 1, 2, 3, 4]


def test_repeated_names_keep_the_hottest() -> None:
    pairs = [("PMU tdie1", 40.0), ("PMU tdie1", 46.5), ("PMU tdie1", 42.0)]
    assert select_die_sensors(pairs) == {"PMU tdie1": 46.5}


def test_no_die_sensor_is_no_temperature() -> None:
    assert hottest(select_die_sensors({"PMU tcal": 51.8})) is None


# --- replay CSV ---------------------------------------------------------------------------------


def test_replay_csv_with_header_comments_and_gaps() -> None:
    text = "# a curve\nseconds,celsius\n0,70\n\n1.5, 90.5\n2,\n3,70\n"
    assert parse_replay_csv(text, "curve.csv") == [
        (0.0, 70.0),
        (1.5, 90.5),
        (2.0, None),
        (3.0, 70.0),
    ]


@pytest.mark.parametrize(
    ("text", "where", "why"),
    [
        ("0,70\n1,hot\n", "curve.csv:2", "not a number"),
        ("0,70\n1,80,90\n", "curve.csv:2", "expected `seconds,celsius`"),
        ("0,70\n# c\n1,80\n1,85\n", "curve.csv:4", "must increase"),
        ("-1,70\n", "curve.csv:1", ">= 0"),
        ("0,inf\n", "curve.csv:1", "finite"),
        ("seconds,celsius\n0,70\nseconds,celsius\n", "curve.csv:3", "not a number"),
    ],
)
def test_bad_replay_row_names_file_and_line(text: str, where: str, why: str) -> None:
    with pytest.raises(ReplayFormatError) as excinfo:
        parse_replay_csv(text, "curve.csv")
    assert str(excinfo.value).startswith(where + ":")
    assert why in str(excinfo.value)


def test_empty_replay_is_an_error() -> None:
    with pytest.raises(ReplayFormatError, match="no `seconds,celsius` rows"):
        parse_replay_csv("seconds,celsius\n# nothing\n", "empty.csv")


REPLAY_ROWS = [(0.5, 70.0), (1.0, 90.0), (2.0, None), (3.0, 96.0)]


def test_before_the_first_replay_row_there_is_no_value() -> None:
    assert replay_value(REPLAY_ROWS, 0.0) is None


def test_a_replay_row_holds_until_the_next() -> None:
    assert replay_value(REPLAY_ROWS, 0.5) == 70.0
    assert replay_value(REPLAY_ROWS, 0.99) == 70.0
    assert replay_value(REPLAY_ROWS, 1.0) == 90.0
    assert replay_value(REPLAY_ROWS, 2.5) is None


def test_the_last_replay_row_holds_forever() -> None:
    assert replay_value(REPLAY_ROWS, 1e6) == 96.0
