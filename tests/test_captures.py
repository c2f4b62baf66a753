"""Captures replayed through the real decoders and the policy: the SMC reports iSMC publishes
(tests/fixtures/captures/README.md) and curves built here in the same format, through
`capture:FILE`, `agent temp`, `agent run` and `agent doctor --capture`."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from agent.power.capture import PowerCaptureSource
from agent.sensors.capture import CaptureFormatError, header_line, poll_line, read_capture
from agent.thermal.capture import CaptureSource
from shared.cooling.calibration import source_defaults
from shared.cooling.policy import Action, CoolingState, Supervision, decide, react
from shared.exit_codes import EXIT_THERMAL_STOP
from tests.power_support import powercap_zone

FIXTURES = Path(__file__).parent / "fixtures" / "captures"
APPLE_SILICON = sorted(p for p in FIXTURES.glob("ismc-*.jsonl") if p.stem != "ismc-intel-t2")


def flt(celsius: float) -> list[str]:
    """An Apple Silicon SMC temperature key's [type, bytes]: float32, little-endian."""
    return ["flt ", struct.pack("<f", celsius).hex()]


def write_capture(path: Path, polls: Iterable[dict[str, Any]]) -> Path:
    lines = [header_line({"chip": "built by tests/test_captures.py"}), *map(poll_line, polls)]
    path.write_text("\n".join(lines) + "\n")
    return path


class Steps:
    """A clock that moves when told: the capture's polls one by one, at no real time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replayed(path: Path, times: Iterable[float]) -> list[tuple[float | None, str | None, str]]:
    """(celsius, pressure, sensor) at each time, through CaptureSource's own decoding."""
    clock = Steps()
    out = []
    with CaptureSource(str(path), clock) as source:
        for t in times:
            clock.now = t
            reading = source.read()
            assert reading is not None, source.last_error
            out.append((reading.celsius, reading.pressure, reading.sensor or ""))
    return out


def test_the_m4_report_reads_the_cpu_die_maximum_with_the_gpu_beside_it() -> None:
    with CaptureSource(str(FIXTURES / "ismc-m4-5.jsonl")) as source:
        reading = source.read()
    assert reading is not None and source.scale == "smc"
    assert (reading.sensor, reading.celsius, reading.source) == ("TCMz", 112.09375, "capture")
    assert reading.sensors == {
        "TCMz": 112.09375,
        "TCMb": pytest.approx(96.498, abs=1e-3),
        "Tg0V": pytest.approx(83.365, abs=1e-3),
    }


def test_a_gpu_hotter_than_the_cpu_die_is_what_the_policy_reads(tmp_path: Path) -> None:
    path = write_capture(
        tmp_path / "gpu.jsonl",
        [{"t": 0, "smc": {"TCMz": flt(70), "TCMb": flt(61), "Tg0k": flt(97), "Tg0j": flt(9.8)}}],
    )
    assert replayed(path, [0]) == [(97.0, None, "Tg0k")]


@pytest.mark.parametrize(
    ("report", "sensor", "celsius"),
    [
        ("ismc-m5-pro", "TCMb", 62.59062576293945),
        ("ismc-m5-max", "TCMb", 36.618751525878906),
        ("ismc-m5-max-2", "TCMb", 29.478124618530273),
    ],
)
def test_m5_has_no_tcmz_reads_the_hottest_plausible_key_and_never_a_parked_one(
    report: str, sensor: str, celsius: float
) -> None:
    """On every M5 report TCMb reads above the per-core keys (m5-pro's hottest, Tp00, is 59.3);
    m5-max-2's every Tp*/Tg* is parked below 20 °C."""
    smc = read_capture(FIXTURES / f"{report}.jsonl").polls[0]["smc"]
    assert "TCMz" not in smc and "TCMb" in smc
    reading = replayed(FIXTURES / f"{report}.jsonl", [0])[0]
    assert reading[2] == sensor and reading[0] == pytest.approx(celsius)


def test_a_key_of_an_unknown_type_is_skipped_and_named(tmp_path: Path) -> None:
    path = write_capture(
        tmp_path / "odd.jsonl",
        [{"t": 0, "smc": {"TCMz": flt(60), "Tg0X": ["si32", "05000000"]}}],
    )
    with CaptureSource(str(path)) as source:
        reading = source.read()
        assert reading is not None and reading.celsius == 60.0
        assert source.decoder.skipped == {"Tg0X": "si32"}  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", APPLE_SILICON, ids=lambda path: path.stem)
def test_every_published_report_replays_to_a_plausible_die_and_a_decision(path: Path) -> None:
    smc = read_capture(path).polls[0]["smc"]
    [(celsius, _, sensor)] = replayed(path, [0])
    assert celsius is not None and 20 < celsius < 150 and sensor in smc
    state = decide(source_defaults("smc").policy, celsius)
    # the hottest report (M4, 112 °C) asks for a smaller batch; nothing published pauses
    assert state is (CoolingState.REDUCE_BATCH if celsius >= 95 else CoolingState.OK)


MACMON_12_GPU_STRESS = {  # vladkens/macmon#12: `macmon debug` on an M4 Pro, macmon stress gpu
    "Tg0K": 87.1, "Tg0L": 87.1, "Tg0d": 89.3, "Tg0e": 89.3, "Tg0j": 90.5, "Tg0k": 96.9,
    "Tg1U": 88.5, "Tg1k": 90.8,
}  # fmt: skip
MACMON_12_GPU_OFF = {  # the same Mac, GPU powered down: every Tg* key a firmware sentinel
    "Tg04": -4.0, "Tg05": 2.4, "Tg0K": 0.0, "Tg0L": -4.0, "Tg0S": 2.2, "Tg0k": 2.4,
    "Tg1c": 0.0, "Tg1l": 2.4,
}  # fmt: skip


def test_the_gpu_under_stress_is_read_and_its_sentinels_at_rest_never_are(tmp_path: Path) -> None:
    stress = {key: flt(value) for key, value in MACMON_12_GPU_STRESS.items()}
    rest = {key: flt(value) for key, value in MACMON_12_GPU_OFF.items()}
    die = {"TCMz": flt(71.5), "TCMb": flt(60.2)}  # a CPU cooler than the stressed GPU
    path = write_capture(
        tmp_path / "m4pro.jsonl",
        [{"t": 0, "smc": {**die, **stress}}, {"t": 1, "smc": {**die, **rest}}],
    )
    assert replayed(path, [0, 1]) == [
        (pytest.approx(96.9, abs=1e-4), None, "Tg0k"),
        (71.5, None, "TCMz"),
    ]


HID_FIXTURES = Path(__file__).parent / "fixtures" / "iohid"


@pytest.mark.parametrize(
    ("dump", "sensor", "celsius"),
    [("m1-mac-mini.txt", "PMU tdie1", 37.3), ("m3-pro.txt", "PMU tdie10", 41.7)],
)
def test_published_hid_dumps_replay_through_the_hid_source(
    tmp_path: Path, dump: str, sensor: str, celsius: float
) -> None:
    """The HID sensors real Macs listed (tests/fixtures/iohid/README.md) as one poll of a
    capture: the calibration constants at 51.9 °C, NAND and battery never win."""
    hid: dict[str, float] = {}
    for line in (HID_FIXTURES / dump).read_text().splitlines():
        name, _, value = line.rpartition("|")
        hid[name.strip()] = max(float(value), hid.get(name.strip(), float(value)))
    path = write_capture(tmp_path / "hid.jsonl", [{"t": 0, "iohid": hid, "pressure": 0}])
    assert replayed(path, [0]) == [(celsius, "Nominal", sensor)]


# --- the policy over an hour of a busy Mac ----------------------------------------------------

NOMINAL, MODERATE, HEAVY, TRAPPING = 0, 1, 2, 3


def hour(pressure: Callable[[int], int] = lambda t: NOMINAL if t % 600 < 300 else MODERATE):
    """An hour of sustained work at 100-108 °C (the SMC die maximum), one poll a second, one
    single-poll spike to 113 °C: (t, °C, pressure state) per poll."""
    for t in range(3600):
        yield t, 113.0 if t == 1800 else 100.0 + (t * 7919 % 81) / 10, pressure(t)


def smc_poll(t: float, celsius: float, state: int) -> dict[str, Any]:
    return {"t": t, "smc": {"TCMz": flt(celsius), "Tg0k": flt(celsius - 12)}, "pressure": state}


def iohid_poll(t: float, celsius: float, state: int) -> dict[str, Any]:
    """The same Mac through HID: 8 °C under the SMC (docs/thermal.md's offset)."""
    return {"t": t, "iohid": {"PMU tdie1": celsius - 8, "NAND CH0 temp": 40.0}, "pressure": state}


def macmon_poll(t: float, celsius: float, state: int) -> dict[str, Any]:
    """The same Mac through macmon's averages: 10 °C under the SMC (docs/thermal.md)."""
    line = json.dumps({"temp": {"cpu_temp_avg": celsius - 10, "gpu_temp_avg": celsius - 21}})
    return {"t": t, "tools": {"macmon": [line]}, "pressure": state}


def decisions(path: Path, scale: str, times: list[float]) -> list[tuple[float, Action]]:
    """(t, action) for every action the one cooling rule takes over the replayed capture,
    under the defaults for `scale`."""
    policy = source_defaults(scale).policy
    state, taken = Supervision(), []
    for t, (celsius, pressure, _) in zip(times, replayed(path, times), strict=True):
        decision = react(state, policy, celsius, pressure)
        state = decision.state
        taken += [(t, action) for action in decision.actions]
    return taken


@pytest.mark.parametrize(
    ("pressure", "expected"),
    [
        (lambda t: NOMINAL if t % 600 < 300 else MODERATE, set()),
        (lambda t: HEAVY if 1000 <= t < 1010 else NOMINAL, {Action.PAUSE, Action.RESUME}),
        (lambda t: TRAPPING if t >= 2000 else NOMINAL, {Action.STOP}),
    ],
    ids=["nominal-moderate", "heavy", "trapping"],
)
def test_an_hour_at_100_to_108_with_a_spike_neither_pauses_nor_stops_under_smc_defaults(
    tmp_path: Path, pressure: Callable[[int], int], expected: set[Action]
) -> None:
    curve = list(hour(pressure))
    path = write_capture(tmp_path / "hour.jsonl", (smc_poll(*poll) for poll in curve))
    taken = decisions(path, "smc", [t for t, _, _ in curve])
    assert {action for _, action in taken} - {Action.REDUCE_BATCH, Action.RESTORE_BATCH} == expected


def test_the_same_hour_through_iohid_and_macmon_decides_alike(tmp_path: Path) -> None:
    curve = list(hour(lambda t: HEAVY if 1000 <= t < 1010 else NOMINAL))
    times = [float(t) for t, _, _ in curve]
    by_scale = {}
    for scale, make in (("smc", smc_poll), ("iohid", iohid_poll), ("macmon", macmon_poll)):
        path = write_capture(tmp_path / f"{scale}.jsonl", (make(*poll) for poll in curve))
        by_scale[scale] = decisions(path, scale, times)
    reference = by_scale.pop("smc")
    for scale, taken in by_scale.items():
        assert [a for _, a in taken] == [a for _, a in reference], scale
        assert all(abs(t - u) <= 1 for (t, _), (u, _) in zip(taken, reference, strict=True))


# --- through the commands -----------------------------------------------------------------------


def run_over(agent_cli: str, capture: Path, seconds: float) -> subprocess.CompletedProcess[str]:
    sleep = f"import time; time.sleep({seconds})"
    return subprocess.run(
        [agent_cli, "run", "--thermal-source", f"capture:{capture}", "--poll-interval", "0.1",
         "--", sys.executable, "-c", sleep],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def actions_said(stderr: str) -> list[str]:
    """The action of each `[mlx-fleet] HH:MM:SS ACTION ...` line."""
    timed = (re.match(r"\[mlx-fleet\] \d\d:\d\d:\d\d (\S+) ", line) for line in stderr.splitlines())
    return [match.group(1) for match in timed if match]  # not the summary's lines


@pytest.mark.parametrize(
    ("pressure", "code", "expected"),
    [
        (lambda i: NOMINAL if i % 20 < 10 else MODERATE, 0, set()),
        (lambda i: HEAVY if 20 <= i < 35 else NOMINAL, 0, {"pause", "resume"}),
        (lambda i: TRAPPING if i >= 30 else NOMINAL, EXIT_THERMAL_STOP, {"stop"}),
    ],
    ids=["nominal-moderate", "heavy", "trapping"],
)
@pytest.mark.slow
def test_agent_run_over_a_capture_of_a_busy_mac(
    agent_cli: str, tmp_path: Path, pressure: Callable[[int], int], code: int, expected: set[str]
) -> None:
    """The hour's shape at 10 polls a second (the rule counts polls, not seconds): 100-108 °C
    with one poll at 113, and the pressure level. Heavy lasts 1.5 s of the capture, from 2 s
    on, so a slow start on a loaded machine still sees it; the last poll holds for ever."""
    polls = [
        smc_poll(i * 0.1, 113.0 if i == 15 else 100.0 + (i * 7919 % 81) / 10, pressure(i))
        for i in range(50)
    ]
    path = write_capture(tmp_path / "busy.jsonl", polls)
    done = run_over(agent_cli, path, 6)
    assert done.returncode == code, done.stderr
    said = actions_said(done.stderr)
    assert set(said) - {"start", "exit", "reduce_batch", "restore_batch"} == expected, said
    assert "supervising with capture here, policy 95/114/120 °C (defaults for smc)" in done.stderr


def test_a_one_poll_spike_past_stop_temp_pauses_and_three_polls_stop(tmp_path: Path) -> None:
    """Over a capture, under the smc defaults (stop at 120): 121 °C once pauses and resumes,
    three polls in a row stop."""
    curve = [105.0] * 5 + [121.0] + [105.0] * 5 + [121.0] * 3 + [105.0]
    path = write_capture(
        tmp_path / "spikes.jsonl", (smc_poll(t, c, 0) for t, c in enumerate(curve))
    )
    taken = decisions(path, "smc", [float(t) for t in range(len(curve))])
    assert [(t, a) for t, a in taken if a is not Action.REDUCE_BATCH] == [
        (5.0, Action.PAUSE),
        (6.0, Action.RESUME),
        (11.0, Action.PAUSE),
        (13.0, Action.STOP),
    ]


HEAD = '{"format": "mlx-fleet-capture", "version": 1, "machine": {}}\n'


@pytest.mark.parametrize(
    ("poll", "needle"),
    [
        ('{"t": 0, "smc": []}', "`smc` must be an object"),
        ('{"t": 0, "iohid": "abc"}', "`iohid` must be an object"),
        ('{"t": 0, "iohid": {"PMU tdie1": NaN}}', "iohid 'PMU tdie1': expected a finite °C"),
        ('{"t": 0, "sysfs": ["a"]}', "`sysfs` must be an object"),
        ('{"t": 0, "tools": ["a"]}', "`tools` must be an object"),
        ('{"t": 0, "ioreport": 5}', "`ioreport` must be a list"),
        ('{"t": 0, "ioreport": [[["x"], null, "CPU Energy", "mJ", 1]]}', "ioreport: expected"),
        ('{"t": 0, "ioreport": [["E", null, "CPU Energy", "mJ", -5]]}', "ioreport: expected"),
        ('{"t": 0, "ioreport": [["E", null, "CPU Energy", "mJ", "abc"]]}', "ioreport: expected"),
        ('{"t": 0, "pressure": 9}', "pressure must be the notify state, 0 to 4"),
        ('{"t": 0, "pressure": true}', "pressure must be the notify state"),
        ('{"t": ' + "9" * 400 + "}", "`t` must be a number of seconds"),
        ('{"t": Infinity}', "`t` must be a number of seconds"),
        ("[1, 2]", "a line must be a JSON object"),
        ('{"t": 0, "gpu": {}}', "unknown inputs 'gpu'"),
    ],
)
def test_a_poll_of_the_wrong_shape_is_refused_naming_its_line(
    tmp_path: Path, poll: str, needle: str
) -> None:
    """Whatever a capture file holds, the sources see only values of the format's types: a
    crafted one is bad input (one line, exit 2 from every command, as above), never a crash."""
    path = tmp_path / "crafted.jsonl"
    path.write_text(HEAD + poll + "\n")
    for open_capture in (read_capture, CaptureSource, PowerCaptureSource):
        with pytest.raises(CaptureFormatError, match=f"{path}:2: ") as refused:
            open_capture(str(path))
        assert needle in str(refused.value)
    version = tmp_path / "version.jsonl"
    version.write_text('{"format": "mlx-fleet-capture", "version": true, "machine": {}}\n')
    with pytest.raises(CaptureFormatError, match="version True"):
        read_capture(version)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "cannot read the capture"),
        ("", "empty"),
        ('{"format": "other"}\n', "not an mlx-fleet-capture file"),
        ('{"format": "mlx-fleet-capture", "version": 2, "machine": {}}\n', "version 2"),
        ('{"format": "mlx-fleet-capture", "version": 1, "machine": {}}\n{"t": "soon"}\n', ":2:"),
        (
            '{"format": "mlx-fleet-capture", "version": 1, "machine": {}}\nnot json\n',
            ":2: not JSON",
        ),
    ],
    ids=["missing", "empty", "other-format", "other-version", "bad-poll", "bad-line"],
)
@pytest.mark.slow
def test_a_capture_that_cannot_be_replayed_is_one_line_and_exit_2(
    agent_cli: str, tmp_path: Path, content: str | None, needle: str
) -> None:
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_text(content)
    source = f"capture:{path}"
    bench = ["bench", "--no-cooling", "-p", "8", "-n", "0"]
    for command in (
        ["temp", "--thermal-source", source],
        [*bench, "--thermal-source", source],
        [*bench, "--power-source", source],
        ["serve", "--bind", "127.0.0.1:0", "--thermal-source", source],
        ["run", "--thermal-source", source, "--", "true"],
    ):
        done = subprocess.run(
            [agent_cli, *command],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert needle in done.stderr and "Traceback" not in done.stderr
        assert str(path) in done.stderr
    with pytest.raises(CaptureFormatError):
        read_capture(path)


@pytest.mark.slow
def test_a_doctor_capture_on_this_machine_round_trips_through_agent_temp(
    agent_cli: str, tmp_path: Path
) -> None:
    """On Linux the capture holds what Linux has: the sysfs files the `linux` source reads (a
    tree standing in for /sys here, as on a VM without thermal zones)."""
    zone = tmp_path / "sys" / "class" / "thermal" / "thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("x86_pkg_temp\n")
    (zone / "temp").write_text("45000\n")
    cpufreq = tmp_path / "sys" / "devices" / "system" / "cpu" / "cpu0" / "cpufreq"
    cpufreq.mkdir(parents=True)
    (cpufreq / "scaling_cur_freq").write_text("2400000\n")
    env = {**os.environ, "MLX_FLEET_SYSFS_ROOT": str(tmp_path / "sys")}
    path = tmp_path / "here.jsonl"
    captured = subprocess.run(
        [agent_cli, "doctor", "--capture", str(path), "--seconds", "2", "--format", "json"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert captured.returncode == 0, captured.stderr
    summary = json.loads(captured.stdout)
    assert summary["inputs"] == ["sysfs"] and summary["polls"] >= 2
    assert "needs macOS" in summary["missing"]["smc"]
    capture = read_capture(path)
    assert capture.polls[0]["sysfs"]["class/thermal/thermal_zone0/temp"] == "45000\n"
    shown = subprocess.run(
        [agent_cli, "temp", "--source", f"capture:{path}", "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    reading = json.loads(shown.stdout)
    assert (reading["celsius"], reading["source"], reading["kind"]) == (45.0, "capture", "capture")
    assert reading["policy_origin"] == "defaults for linux"
    clocks = reading["clocks"]  # cpufreq's files, captured and replayed (agent.clocks.capture)
    assert (clocks["cpu_p_hz"], clocks["clock_source"]) == (2.4e9, "capture")
    assert "replayed" in clocks["clock_note"] and clocks["gpu_hz"] is None


# --- power ------------------------------------------------------------------------------------


def test_ioreport_deltas_in_a_capture_are_joules_per_rail_counted_once(tmp_path: Path) -> None:
    """A delta read twice (the reader faster than the capture) is counted once; polls the reader
    skipped are counted at its next read."""
    rows = [
        ["Energy Model", None, "CPU Energy", "mJ", 1500],
        ["Energy Model", None, "GPU Energy", "nJ", 2_000_000_000],
    ]
    path = write_capture(tmp_path / "io.jsonl", ({"t": t, "ioreport": rows} for t in range(4)))
    clock = Steps()
    with PowerCaptureSource(str(path), clock) as source:
        assert source.rails == ("cpu", "gpu") and source.spec == f"capture:{path}"
        clock.now = 1
        first = source.read()
        again = source.read()
        clock.now = 3
        last = source.read()
    assert first is not None and again is not None and last is not None
    assert first.source == "capture" and dict(first.joules) == {"cpu": 1.5, "gpu": 2.0}
    assert dict(again.joules) == dict(first.joules)
    assert dict(last.joules) == {"cpu": pytest.approx(4.5), "gpu": pytest.approx(6.0)}


def test_rapl_counters_in_a_capture_go_through_the_rapl_meter(tmp_path: Path) -> None:
    zone = "class/powercap/intel-rapl:0"

    def poll(t: int) -> dict[str, Any]:
        files = {"name": "package-0\n", "max_energy_range_uj": "3000000\n"}
        files["energy_uj"] = f"{(999_000 + t * 2_000_000) % 3_000_000}\n"  # 2 J/s, wrapping
        return {"t": t, "sysfs": {f"{zone}/{name}": text for name, text in files.items()}}

    path = write_capture(tmp_path / "rapl.jsonl", map(poll, range(3)))
    clock = Steps()
    with PowerCaptureSource(str(path), clock) as source:
        assert source.decoder.name == "rapl"
        for clock.now in (1, 2):
            reading = source.read()
    assert reading is not None and reading.joules == {"cpu": pytest.approx(4.0)}


@pytest.mark.slow
def test_a_capture_holds_the_tools_lines_and_power_files_and_replays_both(
    agent_cli: str, tool_log: Path, tmp_path: Path
) -> None:
    """A fake macmon on PATH (tests/fixtures/fake_tool.py) and a powercap tree: the capture keeps
    macmon's lines and the counters, and replays them through macmon's parsers and RAPL's."""
    root = tmp_path / "sys"
    powercap_zone(root, "intel-rapl:0", "package-0", 5_000_000, 2**32)
    env = {**os.environ, "MLX_FLEET_SYSFS_ROOT": str(root), "FAKE_POWERMETRICS_MODEL": "apple"}
    path = tmp_path / "tools.jsonl"
    done = subprocess.run(
        [agent_cli, "doctor", "--capture", str(path), "--seconds", "3"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "captured" in done.stderr and "tools" in done.stderr
    capture = read_capture(path)
    lines = [line for poll in capture.polls for line in poll.get("tools", {}).get("macmon", [])]
    assert lines and all(json.loads(line)["sys_power"] == 5.876533 for line in lines)
    kept = [
        line for poll in capture.polls for line in poll.get("tools", {}).get("powermetrics", [])
    ]
    assert "CPU Power: 954 mW" in kept  # root here, or the fake sudo: powermetrics ran too
    assert capture.polls[0]["sysfs"]["class/powercap/intel-rapl:0/energy_uj"] == "5000000\n"
    shown = subprocess.run(
        [agent_cli, "temp", "--source", f"capture:{path}", "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    reading = json.loads(shown.stdout)
    assert (reading["celsius"], reading["sensor"]) == (43.73614, "cpu_temp_avg")
    assert reading["policy_origin"] == "defaults for macmon"
    clock = Steps()
    with PowerCaptureSource(str(path), clock) as power:
        assert power.decoder.name == "macmon"  # before rapl, in auto's order
        clock.now = capture.polls[-1]["t"]
        watts = power.read()
    assert watts is not None and watts.source == "capture"
    assert watts.joules["system"] > 0 and watts.watts["system"] == pytest.approx(5.876533)


def test_powermetrics_lines_in_a_capture_replay_its_level_and_its_watts(tmp_path: Path) -> None:
    """Captured tool output (tests/fixtures/README.md), as `agent doctor --capture` keeps it:
    the thermal sampler's level through the live assembler, the power samplers' watts over the
    interval each header states (1003.51 ms)."""
    thermal = (FIXTURES.parent / "powermetrics-thermal-apple-silicon.txt").read_text().splitlines()
    power = (FIXTURES.parent / "powermetrics-power-apple-silicon.txt").read_text().splitlines()
    level = write_capture(tmp_path / "level.jsonl", [{"t": 0, "tools": {"powermetrics": thermal}}])
    with CaptureSource(str(level)) as source:
        reading = source.read()
    assert reading is not None and source.scale == "powermetrics"
    assert (reading.celsius, reading.pressure, reading.source) == (None, "Nominal", "capture")
    samples = [{"t": t, "tools": {"powermetrics": power}} for t in range(3)]
    path = write_capture(tmp_path / "watts.jsonl", samples)
    clock = Steps()
    with PowerCaptureSource(str(path), clock) as meter:
        assert meter.decoder.name == "powermetrics"
        clock.now = 2
        watts = meter.read()
    assert watts is not None and watts.watts["cpu"] == pytest.approx(0.954)
    # poll 0 is the baseline; polls 1 and 2 hold a whole sample each (its Combined line ends it)
    assert watts.joules["cpu"] == pytest.approx(2 * 0.954 * 1.00351)
