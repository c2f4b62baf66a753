"""The smc source's GPU keys are used only while they are live (agent.thermal.smc_die.GpuWatch):
missing, reading 0 or a sentinel, parked at 40.0 or frozen, they are said in the reading's
`note` and left out; the HID GPU sensors stand in where a capture (or a Mac) has them. Shown on
iSMC's published SMC dumps (tests/fixtures/captures/README.md) and on captures built from them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.sensors.capture import read_capture
from agent.sensors.smc_protocol import VALUE_TYPES, decode
from agent.thermal.capture import CaptureSource
from agent.thermal.parsers import select_gpu_sensors
from agent.thermal.smc_die import (
    FROZEN_POLLS,
    NOT_COVERED,
    PLACEHOLDER_C,
    GpuWatch,
    choose_die,
    gpu_keys_now,
)
from tests.conftest import run_cli
from tests.test_captures import FIXTURES, Steps, flt, write_capture

DIE = {"TCMz": flt(71.5), "TCMb": flt(60.2)}
STRESS = {"Tg0k": flt(96.9), "Tg1k": flt(90.8), "Tg0j": flt(90.5)}
"""An M4 Pro under `macmon stress gpu` (vladkens/macmon#12), beside a cooler CPU die."""


def published(stem: str) -> dict[str, list[str]]:
    return read_capture(FIXTURES / f"{stem}.jsonl").polls[0]["smc"]


def decoded(smc: dict[str, list[str]]) -> dict[str, float]:
    return {
        key: decode(kind, bytes.fromhex(raw))
        for key, (kind, raw) in smc.items()
        if kind in VALUE_TYPES
    }


def readings(path: Path, polls: int) -> list[Any]:
    clock = Steps()
    out = []
    with CaptureSource(str(path), clock) as source:
        for t in range(polls):
            clock.now = float(t)
            reading = source.read()
            assert reading is not None, source.last_error
            out.append(reading)
    return out


def test_an_m3_max_whose_gpu_keys_all_read_0_is_said_not_covered(tmp_path: Path) -> None:
    """iSMC's second M3 Max report: all 32 Tg* keys at 0 or below, beside TCMz = 40.0."""
    values = decoded(published("ismc-m3-max-2"))
    assert gpu_keys_now(values).problem == (
        "every GPU key (Tg*, 32) reads 0 or a sentinel (at most 0 °C)"
    )
    path = write_capture(tmp_path / "m3max2.jsonl", [{"t": 0, "smc": published("ismc-m3-max-2")}])
    [reading] = readings(path, 1)
    assert reading.sensor == "TCMz" and not any(key.startswith("Tg") for key in reading.sensors)
    assert reading.note == (
        f"{NOT_COVERED}: every GPU key (Tg*, 32) reads 0 or a sentinel (at most 0 °C); "
        "acting on the CPU die alone"
    )


def test_gpu_keys_that_vanish_or_park_at_40_are_said_and_never_used(tmp_path: Path) -> None:
    m4 = published("ismc-m4")
    gone = {key: value for key, value in m4.items() if not key.startswith("Tg")}
    parked = {**m4, **{key: flt(PLACEHOLDER_C) for key in m4 if key.startswith("Tg")}}
    path = write_capture(
        tmp_path / "m4.jsonl",
        [{"t": 0, "smc": m4}, {"t": 1, "smc": gone}, {"t": 2, "smc": parked}],
    )
    live, vanished, placeholder = readings(path, 3)
    assert live.note is None and "Tg0V" in live.sensors  # the report's hottest Tg*, 41.8 °C
    alone = "; acting on the CPU die alone"
    assert vanished.note == f"{NOT_COVERED}: none of the 18 GPU keys (Tg*) could be read{alone}"
    assert placeholder.note == (
        f"{NOT_COVERED}: the GPU keys (Tg*) read 40 °C, a placeholder (18){alone}"
    )
    [never] = readings(write_capture(tmp_path / "none.jsonl", [{"t": 0, "smc": gone}]), 1)
    assert never.note == f"{NOT_COVERED}: the SMC lists no GPU key (Tg*){alone}"
    for reading in (vanished, placeholder, never):
        assert reading.sensor == "TCMz" and set(reading.sensors) == {"TCMz", "TCMb"}


def test_gpu_keys_that_repeat_every_value_for_the_documented_polls_are_frozen(
    tmp_path: Path,
) -> None:
    """A GPU at 96.9 °C is the reading until its keys have repeated every value for
    FROZEN_POLLS polls; one key moving makes them live again."""
    same = [{"t": t, "smc": {**DIE, **STRESS}} for t in range(FROZEN_POLLS)]
    moved = {"t": FROZEN_POLLS, "smc": {**DIE, **STRESS, "Tg1k": flt(91.0)}}
    path = write_capture(tmp_path / "frozen.jsonl", [*same, moved])
    found = readings(path, FROZEN_POLLS + 1)
    assert [r.sensor for r in found[: FROZEN_POLLS - 1]] == ["Tg0k"] * (FROZEN_POLLS - 1)
    frozen = found[FROZEN_POLLS - 1]
    assert frozen.sensor == "TCMz" and frozen.celsius == pytest.approx(71.5)
    assert frozen.note == (
        f"{NOT_COVERED}: the GPU keys (Tg*, 3) have repeated every value for {FROZEN_POLLS} "
        "polls (Tg0k 96.9 °C): frozen; acting on the CPU die alone"
    )
    assert found[-1].sensor == "Tg0k" and found[-1].note is None


def test_the_hid_gpu_sensors_stand_in_for_gpu_keys_that_read_0(tmp_path: Path) -> None:
    """An M2 Max names its GPU dies `PMU TP*g` (aristocratos/btop#1601): with the Tg* keys at
    0, the hottest of them is the GPU, and the note says where it came from."""
    zeros = {"Tg0f": flt(0.0), "Tg0j": flt(0.0)}
    hid = {"PMU TP1g": 88.25, "PMU TP2g": 86.0, "PMU tdie1": 70.0, "NAND CH0 temp": 40.0}
    path = write_capture(tmp_path / "hid.jsonl", [{"t": 0, "smc": {**DIE, **zeros}, "iohid": hid}])
    [reading] = readings(path, 1)
    assert reading.sensor == "PMU TP1g" and reading.celsius == 88.25
    assert reading.note == (
        "GPU from HID (PMU TP1g, PMU TP2g): every GPU key (Tg*, 2) reads 0 or a sentinel "
        "(at most 0 °C)"
    )
    assert set(reading.sensors) == {"TCMz", "TCMb", "PMU TP1g"}


def test_hid_gpu_sensors_are_the_gpu_names_alone() -> None:
    pairs = [("PMU TP3g", 61.0), ("GPU MTR Temp Sensor1", 55.0), ("PMU tdie2", 70.0)]
    pairs += [("pACC MTR Temp Sensor2", 72.0), ("PMU TP4g", -1.0)]
    assert select_gpu_sensors(pairs) == {"PMU TP3g": 61.0, "GPU MTR Temp Sensor1": 55.0}


def test_m3s_gpu_is_its_tg_keys_the_tf_fabric_keys_follow_the_cpu_die() -> None:
    """The evidence docs/thermal.md settles M3's GPU keys on (GPU keys on M3): iSMC calls Tf*
    "GPU Fabric Block n" (`Tf?6` its Max), Stats maps Tf1x/Tf2x to the M3 GPU, macmon and
    mactop read Tg*. In both M3 Pro and M3 Max reports the Tf?6 keys read within 4.2 °C of the
    CPU die's hottest figure while every Tg* and every Tf probe reads 25 °C or more below: they
    follow the CPU, so Tg* stays the GPU and Tf* is never read."""
    for stem in ("ismc-m3-max", "ismc-m3-pro"):
        values = decoded(published(stem))
        cpu = max(values["TCMz"], *(v for k, v in values.items() if k.startswith(("Tp", "Te"))))
        maxes = [v for k, v in values.items() if k.startswith("Tf") and k.endswith("6")]
        gpu = max(v for k, v in values.items() if k.startswith("Tg"))
        probes = [v for k, v in values.items() if k.startswith("Tf") and k[3] in "89AB"]
        assert max(maxes) >= cpu - 4.2, stem
        assert cpu - gpu > 25 and cpu - max(probes) > 25, stem
        choice = choose_die({key: value for key, value in values.items()})
        assert choice is not None and not any(key.startswith("Tf") for key in choice.sensors)


def test_a_watch_counts_repeats_per_poll() -> None:
    watch = GpuWatch(polls=2)
    assert watch.check({"Tg0k": 50.0}).key == "Tg0k"
    assert watch.check({"Tg0k": 50.0}).problem is not None and watch.same == 2
    assert watch.check({"Tg0k": 50.5}).key == "Tg0k" and watch.same == 1


@pytest.mark.slow
def test_agent_temp_shows_the_note(tmp_path: Path) -> None:
    path = write_capture(tmp_path / "m3max2.jsonl", [{"t": 0, "smc": published("ismc-m3-max-2")}])
    source = ("--thermal-source", f"capture:{path}")
    shown = run_cli("agent", "temp", *source, "--format", "json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["note"].startswith(f"{NOT_COVERED}: every GPU key")
    table = run_cli("agent", "temp", *source)
    assert "Note" in table.stdout and f"{NOT_COVERED}: every GPU key" in table.stdout
