"""The SMC's wire format, value types and die choice, pure and fed with captured bytes: lines of
the classic `smc -k KEY -r` tool (`KEY [type] value (bytes ..)`), as published in the projects
quoted beside each. The ctypes shell only moves these structs (agent/thermal/smc.py)."""

from __future__ import annotations

import ctypes
import re
import struct

import pytest

from agent.sensors.smc_protocol import (
    READ_BYTES,
    READ_KEY_INFO,
    VALUE_TYPES,
    KeyData,
    KeyInfo,
    decode,
    fourcc,
    fourcc_text,
    key_info_request,
    read_request,
)
from agent.thermal.pressure import WithPressure, pressure_level
from agent.thermal.smc_die import choose_die, die_keys
from agent.thermal.synthetic import ReplaySource

CAPTURED = [
    # Apple Silicon `flt ` (little-endian float32): a published smc-tool parser's example line,
    # and a test body of an SMC key listing (TB0T, 19.2 °C; the tool prints no decimals).
    ("  Te05  [flt ]  42.3 (bytes: 35 03 29 42)", 42.3),
    ("  TB0T  [flt ]  19 (bytes 98 99 99 41)", 19.2),
    # Intel `sp78` (signed 8.8 big-endian): lines of `smc -t` quoted in two test suites.
    ("  TC0P  [sp78]  46.25 (bytes 2e 40)", 46.25),
    ("TB1T  [sp78]  42.25 (bytes 2a 40)", 42.25),
    # `fpe2` (unsigned 14.2 big-endian) fan speeds, from smcFanControl-style scripts.
    ("   F0Mx  [fpe2]  4000 (bytes 3e 80)", 4000.0),
    ("  F0Mn  [fpe2]  2500 (bytes 27 10)", 2500.0),
    ("  F0Mx  [fpe2]  4500.00 (bytes 46 50)", 4500.0),
]


def parse_smc_line(line: str) -> tuple[str, bytes]:
    match = re.search(r"\[(.{4})\].*\(bytes:? ([0-9a-f ]+)\)", line)
    assert match, line
    return match.group(1), bytes.fromhex(match.group(2).replace(" ", ""))


@pytest.mark.parametrize(("line", "value"), CAPTURED)
def test_captured_values_decode(line: str, value: float) -> None:
    data_type, raw = parse_smc_line(line)
    assert decode(data_type, raw) == pytest.approx(value, abs=0.05)  # printed to 0.1


def test_ioft_is_48_16_fixed_point_little_endian() -> None:
    """No public capture shows `ioft` bytes; this is the layout Stats and iSMC decode."""
    raw = struct.pack("<Q", 45 * 65536 + 32768)
    assert decode("ioft", raw) == 45.5


def test_unknown_types_and_short_values_decode_to_nothing() -> None:
    assert decode("ui8 ", b"\x2a") is None
    assert decode("flt ", b"\x00\x00") is None


def test_the_key_data_struct_is_the_80_bytes_the_smc_expects() -> None:
    """Offsets of mactop's SMCKeyData_t under C alignment: key 0, keyInfo 28, result 40,
    data8 42, data32 44, bytes 48."""
    assert ctypes.sizeof(KeyData) == 80
    offsets = {name: getattr(KeyData, name).offset for name, _ in KeyData._fields_}
    assert offsets == {
        "key": 0,
        "vers": 4,
        "p_limit_data": 12,
        "key_info": 28,
        "result": 40,
        "status": 41,
        "data8": 42,
        "data32": 44,
        "bytes": 48,
    }


def test_a_read_is_key_info_then_the_bytes() -> None:
    info_request = key_info_request("TCMz")
    assert (info_request.key, info_request.data8) == (0x54434D7A, READ_KEY_INFO)
    info = KeyInfo(data_size=4, data_type=fourcc("flt "))
    request = read_request("TCMz", info)
    assert (request.data8, request.key_info.data_size) == (READ_BYTES, 4)
    assert fourcc_text(request.key_info.data_type) == "flt "
    assert bytes(request)[:4] == (0x54434D7A).to_bytes(4, "little")  # the struct's own order


def test_die_max_is_the_temperature_with_the_average_beside_it() -> None:
    """SiliconScope#57 (M2 Max): TCMb 49.8, TCMz 64.4; per-core keys parked at 6.7."""
    choice = choose_die({"TCMz": 64.4, "TCMb": 49.8, "Tp09": 6.7})
    assert choice is not None
    assert (choice.sensor, choice.celsius) == ("TCMz", 64.4)
    assert choice.sensors == {"TCMz": 64.4, "TCMb": 49.8}


def test_without_die_keys_the_hottest_plausible_cluster_key() -> None:
    """oshi#3535: idle M2 Max per-core keys park at 6.7 and 4.633; macmon#12 saw 9.8."""
    values = {"Tp01": 6.7, "Tp05": 4.633, "Te05": 42.3, "Tg0f": 47.5, "Tp09": 9.8, "Tg1U": None}
    choice = choose_die(values)
    assert choice is not None
    assert (choice.sensor, choice.celsius) == ("Tg0f", 47.5)
    assert choice.sensors == {"Te05": 42.3, "Tg0f": 47.5}
    assert choose_die({"Tp01": 6.7, "TCMz": None}) is None


def test_the_die_aggregates_and_every_gpu_key_are_polled() -> None:
    """Per-core CPU keys only on a chip without TCMz (M5: TCMb but no TCMz)."""
    every = ["#KEY", "TB0T", "TCMb", "TCMz", "Te05", "Tp09", "Tg0f", "TCHP", "TG0B"]
    assert die_keys(every) == ["TCMz", "TCMb", "Tg0f"]
    assert die_keys([key for key in every if key != "TCMz"]) == ["TCMb", "Te05", "Tp09", "Tg0f"]
    assert die_keys([key for key in every if not key.startswith("TCM")]) == [
        "Te05",
        "Tp09",
        "Tg0f",
    ]


def test_a_gpu_hotter_than_the_cpu_die_is_the_temperature() -> None:
    """MLX's work is GPU work: TCMz 70 beside Tg0k 97 reads 97 from Tg0k."""
    choice = choose_die({"TCMz": 70.0, "TCMb": 61.0, "Tg0k": 97.0, "Tg1k": 90.8, "Tg0j": 9.8})
    assert choice is not None
    assert (choice.sensor, choice.celsius) == ("Tg0k", 97.0)
    assert choice.sensors == {"TCMz": 70.0, "TCMb": 61.0, "Tg0k": 97.0}


def test_without_tcmz_the_cpu_die_is_the_hottest_of_the_cores_and_tcmb() -> None:
    """M5 (iSMC report-m5-pro): TCMb reads above every core key, and a core may be hotter."""
    choice = choose_die({"TCMb": 62.6, "Tp00": 59.3, "Te03": 51.0, "Tg2r": 41.1})
    assert choice is not None
    assert (choice.sensor, choice.celsius) == ("TCMb", 62.6)
    assert choice.sensors == {"TCMb": 62.6, "Tg2r": 41.1}
    core = choose_die({"TCMb": 55.0, "Tp00": 59.3, "Tg2r": 41.1})
    assert core is not None and (core.sensor, core.sensors) == (
        "Tp00",
        {"Tp00": 59.3, "TCMb": 55.0, "Tg2r": 41.1},
    )
    parked = choose_die({"TCMb": 29.5, "Tp08": 19.6, "Tg0C": 19.9})  # iSMC report-m5-max-2
    assert parked is not None and (parked.sensor, parked.celsius) == ("TCMb", 29.5)


def test_a_key_of_a_type_no_decoder_knows_is_not_a_temperature() -> None:
    assert "si32" not in VALUE_TYPES and decode("si32", b"\x05\x00\x00\x00") is None
    # iSMC report-m4-5: TR1d (bytes c4 4e ea ff ff ff ff ff) prints -21.692322: ioft is signed
    assert decode("ioft", bytes.fromhex("c44eeaffffffffff")) == -21.69232177734375


def test_pressure_levels_are_powermetrics_names() -> None:
    """OSThermalNotification.h / MacThrottle: 0 Nominal ... 4 Sleeping."""
    assert [pressure_level(state) for state in range(6)] == [
        "Nominal",
        "Moderate",
        "Heavy",
        "Trapping",
        "Sleeping",
        None,
    ]


def test_every_reading_carries_the_pressure_level(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Whatever gives the degrees; a level the source has itself is kept."""
    curve = tmp_path / "curve.csv"
    curve.write_text("0,70\n")
    with WithPressure(ReplaySource(str(curve)), lambda: "Heavy") as source:
        reading = source.read()
    assert reading is not None
    assert (reading.celsius, reading.pressure, reading.source) == (70.0, "Heavy", f"replay:{curve}")
