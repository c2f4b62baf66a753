"""`coordinator doctor --level 3`, the burn-in: its plan, links and judging (pure,
shared.reports.burn_in), its table at 80 columns, bad input in one line, and a real run on two
agents on loopback with a very short --duration: one table with a verdict per host; Ctrl-C in
its sustained run keeps what was measured (-o json) and changes no condition."""

from __future__ import annotations

import json
import signal

import pytest

from coordinator.commands.doctor_burn_in import level_three_table
from shared.benchmark.sustain import SustainError
from shared.reports.burn_in import Link, burn_in_plan, every_link, judge_links, judge_sustained
from tests.conftest import console_script, piped
from tests.fleet_support import AgentPool, cli
from tests.ring_support import free_port_run
from tests.test_doctor_levels import cool_pair
from tests.test_tables_fit import check_fit


def test_the_plan_cuts_any_duration_into_enough_windows_for_a_steady_state() -> None:
    assert burn_in_plan(900.0).window_s == 10.0  # the default 15 min: 10 s windows
    short = burn_in_plan(8.0)
    assert short.window_s == 1.0 and short.windows == 8
    with pytest.raises(SustainError, match="--duration must be at most"):
        burn_in_plan(10**9)


def test_every_pair_of_hosts_is_a_link() -> None:
    assert every_link(["a", "b", "c", "d"]) == [
        ("a", "b"), ("a", "c"), ("a", "d"), ("b", "c"), ("b", "d"), ("c", "d"),
    ]  # fmt: skip
    assert every_link(["a"]) == []


def test_a_failed_link_fails_both_ends_and_a_slow_one_is_named() -> None:
    links = [
        Link(("a", "b"), 10.0),
        Link(("a", "c"), 10.2),
        Link(("b", "c"), 4.0),
        Link(("c", "d"), error="d: unreachable"),
    ]
    rows, why = judge_links("a", links)
    assert [row["link"] for row in rows] == ["a↔b", "a↔c"] and why == []
    rows, why = judge_links("c", links)
    assert len(rows) == 3 and rows[1]["slow"] is not None
    assert why[0].startswith("link to b is slow: 4 GB/s, 60% below")
    assert why[1] == "link to d failed: d: unreachable"
    assert judge_links("d", links)[1] == ["link to c failed: d: unreachable"]


def sustained(steady: float | None, verdict: str = "valid") -> dict:
    return {
        "verdict": verdict,
        "status": "ok",
        "sustain": {
            "first_tokens_per_sec": 50.0,
            "steady_tokens_per_sec": steady,
            "throttle_ratio": None if steady is None else steady / 50.0,
            "time_to_throttle_s": 30.0,
            "windows": [],
            "window_s": 10.0,
        },
    }


def test_a_steady_state_below_its_familys_band_fails_a_throttle_alone_does_not() -> None:
    history = [45.0, 46.0, 44.0]
    found, why = judge_sustained(sustained(45.0), history, "not run")
    assert why == [] and found["time_to_throttle_s"] == 30.0  # throttled, within its band
    assert found["steady_band"] is not None and found["steady_band_runs"] == 3
    found, why = judge_sustained(sustained(30.0), history, "not run")
    assert why[0].startswith("steady 30.0 tok/s below its family's band")
    assert judge_sustained(sustained(30.0), history[:2], "not run")[1] == []  # no band yet
    assert judge_sustained(None, history, "interrupted: not run")[1] == ["interrupted: not run"]
    no_steady = judge_sustained(sustained(None), [], "not run")[1]
    assert no_steady[0].startswith("no steady state: steady needs 3 full windows")


def test_the_level_3_table_fits_80_columns() -> None:
    empty = {"gbs": None}
    row = {
        "host": "studio-1.lab",
        "report": {"ok": True},
        "tokens_per_sec": 41.23,
        "band": (40.0, 44.0),
        "band_runs": 5,
        "bandwidth_gbs": 301.0,
        "memory": {"read": {"gbs": 402.5}, "copy": empty, "fraction": 0.5, "spec_gbs": 800.0},
        "memory_band": None,
        "memory_band_runs": 1,
        "sensor": "41.0 → 55.2 °C",
        "sustained": judge_sustained(sustained(45.0), [], "")[0],
        "links": judge_links("studio-1.lab", [Link(("studio-1.lab",
                                                                "studio-2.lab"), 9.87)])[0],
        "verdict": "fail",
        "why": ["link to studio-2.lab failed: interrupted"],
    }  # fmt: skip
    lines = check_fit(level_three_table([row, {**row, "verdict": "pass", "why": []}]), 80)
    assert any("pass" in line for line in lines)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--level", "4"], "--level 4: choose 1, 2 or 3"),
        (["--level", "3", "--duration", "0"], "--duration must be longer than 0 s"),
        (["--level", "3", "--duration", "-5s"], "--duration: expected a duration"),
        (["--level", "2", "--duration", "5m"], "--duration is level 3's"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], said: str) -> None:
    result = cli("coordinator", "doctor", *args, "--hosts", "127.0.0.1:1")
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_level_3_on_two_agents_prints_one_table_with_a_verdict_per_host(
    agents: AgentPool,
) -> None:
    pair, names = cool_pair(agents)
    port = str(free_port_run(2))
    args = ("--level", "3", "--duration", "8s", "--port", port, "--hosts", names)
    result = cli("coordinator", "doctor", *args, timeout=540)
    assert result.returncode in (0, 1), result.stderr
    assert result.stdout.count("mlx-fleet doctor, level 3 (burn-in)") == 1
    for agent in pair:
        line = next(line for line in result.stdout.splitlines() if agent.address in line)
        assert " pass" in line or " fail" in line, result.stdout
    assert "tok/s" in result.stdout and "GB/s" in result.stdout  # sustained figures, the link
    assert f"to {pair[1].address}: " in result.stdout and f"to {pair[0].address}: " in result.stdout
    assert "sustained run of 8 s on 2 hosts" in result.stderr
    assert f"link 1 of 1: netbench {pair[0].address}↔{pair[1].address}" in result.stderr

    # Ctrl-C during the sustained run: the table of what was measured, no condition changed
    held = conditions()
    long = [console_script("coordinator"), "doctor", *args[:2], "--duration", "10m", *args[4:]]
    long += ["-o", "json"]
    coordinator = piped(long)
    assert coordinator.stderr is not None
    sustained = False
    for line in coordinator.stderr:  # the test's timeout bounds the wait
        sustained = sustained or "sustained run of 600 s" in line
        if sustained and "building small" in line:
            break  # a sustained job has begun
    coordinator.send_signal(signal.SIGINT)
    out, err = coordinator.communicate(timeout=120)
    assert coordinator.returncode == 130, err
    assert "interrupted: the table holds what was measured; no condition was changed" in err
    rows = json.loads(out)
    assert [row["host"] for row in rows] == [agent.address for agent in pair]
    for row in rows:  # level 2's figures kept, the rest said not run
        assert row["verdict"] == "fail" and row["memory"]["read"]["gbs"] > 0
        assert "links interrupted: not run" in row["why"]  # the job cut: failed, or none came
        assert any(why.startswith(("the sustained run is", "interrupted")) for why in row["why"])
        assert row["sustained"]["steady_tokens_per_sec"] is None and row["links"] == []
    assert conditions() == held


def conditions() -> dict:
    return json.loads(cli("coordinator", "health", "--no-record", "-o", "json").stdout)[
        "conditions"
    ]


def test_a_step_that_did_not_run_on_a_host_says_the_line_its_run_failed_with() -> None:
    from coordinator.commands.doctor_levels import not_run

    report = {"hosts": [{"host": "a", "error": "refused: sustain window_s 0.1 s is too short"}]}
    assert not_run(report, "a", "the sustained run") == (
        "the sustained run did not run: refused: sustain window_s 0.1 s is too short"
    )
    assert not_run(report, "b", "the decode cell") == "the decode cell did not run"
