"""Per-job accounting: mlx_lm's report lines parsed, the account kept (pauses, pressure levels,
the hottest reading, energy, tokens/s and the throttle ratio), and `agent run` end to end: real
commands printing mlx_lm's lines through the tee (a pipe, or a pty), a replayed curve that
crosses pause_temp, the summary printed and recorded, CMD's output passed on byte for byte."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from agent.cooling.output_tee import OutputTee, environment
from shared.cooling.job_account import (
    MAX_LINE,
    NO_METER,
    JobAccount,
    TrainReport,
    detail_json,
    duration,
    parse_report,
    render,
)
from shared.wire.telemetry import Event
from tests.fleet_support import AgentPool
from tests.test_run_cli import events as recorded


def train_line(it: int, tokens_per_s: float, loss: float = 2.345, trained: int = 5101) -> str:
    """mlx_lm/tuner/trainer.py's train report (<= 0.31), as its f-string formats it."""
    return (
        f"Iter {it}: Train loss {loss:.3f}, Learning Rate {1e-05:.3e}, It/sec {0.532:.3f}, "
        f"Tokens/sec {tokens_per_s:.3f}, Trained Tokens {trained}, Peak mem {2.345:.3f} GB"
    )


def val_line(it: int, loss: float = 2.11, took: float = 3.215) -> str:
    return f"Iter {it}: Val loss {loss:.3f}, Val took {took:.3f}s"


def table_row(it: int, loss: float, tokens_per_s: float, trained: int) -> str:
    """mlx_lm 0.32's TrainUI.report_train row, without rich's markup."""
    return f"  {it:>4}    {loss:>5.3f} ▼    {tokens_per_s:>5,.0f}    {trained / 1000:>5.1f}k"


# --- the parser -------------------------------------------------------------------------------


def test_a_train_report_gives_every_field() -> None:
    report = parse_report(train_line(10, 271.381))
    assert report == TrainReport(
        "train",
        10,
        tokens_per_s=271.381,
        train_loss=2.345,
        learning_rate=1e-05,
        it_per_s=0.532,
        trained_tokens=5101,
        peak_mem_gb=2.345,
    )


def test_a_val_report() -> None:
    assert parse_report(val_line(20)) == TrainReport("val", 20, val_loss=2.11, val_s=3.215)


def test_forks_coloured_losses_and_optimizer_steps_still_parse() -> None:
    coloured = train_line(30, 99.5).replace("2.345,", "\x1b[92m2.345\x1b[0m,", 1)
    assert parse_report(coloured) == parse_report(train_line(30, 99.5))
    opt = train_line(40, 120.0).replace("Iter 40:", "Iter 40 (Opt 10):")
    report = parse_report(opt)
    assert report is not None and (report.iteration, report.tokens_per_s) == (40, 120.0)
    extra = "Iter 5: Train loss 1.000, Accuracy 0.500, Margin 0.1, Tokens/sec 50.000"
    assert parse_report(extra) == TrainReport("train", 5, tokens_per_s=50.0, train_loss=1.0)


def test_mlx_lm_0_32_table_rows_parse_and_its_header_does_not() -> None:
    assert parse_report("  iter   train_loss     tok/s     tokens") is None
    row = parse_report(table_row(200, 2.345, 1271.4, 105_100))
    assert row == TrainReport("train", 200, tokens_per_s=1271.0, train_loss=2.345)
    up = parse_report("    10    2.500 ▲      271      5.1k")
    assert up is not None and up.tokens_per_s == 271.0
    assert parse_report("    20    val 2.110    3.21s") == TrainReport(
        "val", 20, val_loss=2.11, val_s=3.21
    )


@pytest.mark.parametrize(
    "line",
    [
        "",
        "Loading pretrained model",
        "hello Iter 10: Tokens/sec 5.000",  # not at the start of the line
        "Iter 10: Train loss 2.345, Learning Rate 1.000e-05",  # no tokens/s
        "Iter 10: Train loss 2.345, Tokens/sec abc",
        "Iter 10: Train loss 2.345, Tokens/sec nan",
        "Iter 10: Train loss 2.345, Tokens/sec inf",
        "Iter 10: Train loss 2.345, Tokens/sec -5.000",
        "Iter x: Train loss 2.345, Tokens/sec 5.000",
        "Iter 20: Val loss nan, Val took 1.000s",
        "    10    2.345 ▼      inf      5.1k",
        "Iter 1: " + "Tokens/sec 1.0, " * 200,  # a line no trainer prints
    ],
)
def test_other_lines_and_refused_numbers_give_no_report(line: str) -> None:
    assert parse_report(line) is None


def test_a_malformed_field_is_dropped_not_guessed() -> None:
    report = parse_report(
        "Iter 7: Train loss nan, Learning Rate x, Tokens/sec 10.000, Trained Tokens 5.5"
    )
    assert report == TrainReport("train", 7, tokens_per_s=10.0)


# --- the account --------------------------------------------------------------------------------

T0 = 1_000_000.0


def test_pauses_and_their_reasons_from_the_reading_that_caused_them() -> None:
    account = JobAccount("job1", T0)
    account.reading(T0 + 1, 60.0, "smc", "TCMz")
    account.reading(T0 + 10, 85.3, "smc", "TCMz")
    account.action("pause", T0 + 10, 85.3)
    account.reading(T0 + 40, 70.0, "smc", "TCMz")
    account.action("resume", T0 + 40, 70.0)
    account.action("pause", T0 + 50, 91.0, "rank 1's Mac asks for pause")
    account.finish(T0 + 70)  # the pause lasts to the end
    summary = account.summary()
    assert summary["wall_s"] == 70.0
    assert summary["paused_s"] == 50.0
    assert summary["pauses"] == 2
    assert summary["pause_list"] == [
        {"at_s": 10.0, "celsius": 85.3, "reason": "85.3 °C smc · TCMz", "s": 30.0},
        {"at_s": 50.0, "celsius": 91.0, "reason": "rank 1's Mac asks for pause", "s": 20.0},
    ]


@pytest.mark.parametrize("end", ["stop", "forward", "kill", "exit"])
def test_every_way_of_stopping_ends_a_pause(end: str) -> None:
    account = JobAccount("job1", T0)
    account.action("pause", T0 + 1, 90.0)
    account.action(end, T0 + 4)
    account.finish(T0 + 10)
    assert account.summary()["paused_s"] == 3.0


def test_reduce_batch_is_counted_until_restore() -> None:
    account = JobAccount("job1", T0)
    account.action("reduce_batch", T0 + 2, 80.0)
    account.action("restore_batch", T0 + 5, 70.0)
    account.action("reduce_batch", T0 + 8, 80.0)
    account.finish(T0 + 10)
    summary = account.summary()
    assert (summary["reduced_s"], summary["reductions"]) == (5.0, 2)


def test_each_pressure_level_holds_until_the_next_reading() -> None:
    account = JobAccount("job1", T0)
    account.reading(T0 + 2, None, "pressure", None, "Nominal")
    account.reading(T0 + 5, None, "pressure", None, "Heavy")
    account.action("pause", T0 + 5)
    account.reading(T0 + 6, None)  # a poll without a reading: unknown from here
    account.reading(T0 + 8, 70.0, "pressure", None, "moderate")
    account.reading(T0 + 9, 70.0, "pressure", None, "bogus")
    account.finish(T0 + 12)
    summary = account.summary()
    assert summary["pressure_s"] == {"nominal": 3.0, "moderate": 1.0, "heavy": 1.0, "unknown": 7.0}
    assert sum(summary["pressure_s"].values()) == summary["wall_s"]
    assert summary["pause_list"][0]["reason"] == "pressure Heavy (pressure)"


def test_the_hottest_reading_and_where_it_came_from() -> None:
    account = JobAccount("job1", T0)
    account.reading(T0 + 1, 80.0, "smc", "TCMz")
    account.reading(T0 + 2, 86.1, "smc", "TCMz")
    account.reading(T0 + 3, math.inf, "smc", "TCMz")
    account.reading(T0 + 4, 86.1, "iohid", "PMU TP1g")  # as hot, later: the first one stays
    account.finish(T0 + 5)
    summary = account.summary()
    assert (summary["max_celsius"], summary["max_source"], summary["max_sensor"]) == (
        86.1,
        "smc",
        "TCMz",
    )
    assert summary["max_at_s"] == 2.0


def test_energy_is_unavailable_unless_a_meter_measured_it() -> None:
    account = JobAccount("job1", T0)
    account.finish(T0 + 1)
    assert account.summary()["energy_j"] is None
    assert account.summary()["energy_note"] == NO_METER
    metered = JobAccount("job2", T0)
    metered.meter(T0, 1000.0)
    metered.meter(T0 + 1, 1500.0)
    metered.meter(T0 + 2, 200.0)  # a restarted meter's counter: refused
    metered.meter(T0 + 3, math.nan)
    metered.finish(T0 + 4)
    assert (metered.summary()["energy_j"], metered.summary()["energy_note"]) == (500.0, None)


def test_throttle_is_the_last_windows_mean_over_the_firsts() -> None:
    """Window 60 s: reports every 5 s from T0+10 to T0+305; the first window is T0+10..T0+70
    (13 reports), the last T0+245 exclusive .. T0+305 (12 reports)."""
    account = JobAccount("job1", T0, window_s=60)
    times = [T0 + 10 + 5 * i for i in range(60)]
    values = [300.0 if i < 10 else 250.0 if i < 40 else 200.0 for i in range(60)]
    for at, value in zip(times, values, strict=True):
        account.report_line(train_line(10 * times.index(at), value), at)
    account.report_line(val_line(100), T0 + 100)
    account.report_line("unrelated output", T0 + 101)
    account.finish(T0 + 310)
    summary = account.summary()
    first = [v for t, v in zip(times, values, strict=True) if t <= times[0] + 60]
    last = [v for t, v in zip(times, values, strict=True) if t > times[-1] - 60]
    assert (len(first), len(last)) == (13, 12)
    assert summary["tok_s_first"] == pytest.approx(sum(first) / len(first), abs=1e-3)
    assert summary["tok_s_last"] == 200.0
    assert summary["throttle"] == round(200.0 / (sum(first) / len(first)), 4)
    assert summary["tok_s_mean"] == pytest.approx(sum(values) / 60, abs=1e-3)
    assert (summary["train_reports"], summary["val_reports"]) == (60, 1)
    assert summary["last_iteration"] == 590 and summary["trained_tokens"] == 5101
    assert summary["tok_s_bucket_s"] == 30.0
    assert summary["tok_s_series"][0] == [0.0, 300.0]  # T0+10..T0+55
    assert summary["tok_s_series"][-1] == [300.0, 200.0]
    assert len(account._recent) == 12  # only the last window is kept


@pytest.mark.parametrize(("span", "known"), [(119.0, False), (120.0, True)])
def test_no_throttle_until_the_windows_cannot_overlap(span: float, known: bool) -> None:
    account = JobAccount("job1", T0, window_s=60)
    account.report(TrainReport("train", 10, tokens_per_s=300.0), T0 + 1)
    account.report(TrainReport("train", 20, tokens_per_s=150.0), T0 + 1 + span)
    account.finish(T0 + 200)
    summary = account.summary()
    assert summary["throttle"] == (0.5 if known else None)
    assert summary["tok_s_first"] == 300.0
    assert summary["tok_s_last"] == (150.0 if known else None)


def test_without_reports_tokens_are_unknown() -> None:
    account = JobAccount("job1", T0)
    account.finish(T0 + 5)
    summary = account.summary()
    assert summary["train_reports"] == 0
    assert summary["tok_s_mean"] is summary["throttle"] is None
    assert summary["tok_s_series"] == []


def test_what_comes_after_the_end_does_not_count() -> None:
    account = JobAccount("job1", T0)
    account.finish(T0 + 5)
    account.reading(T0 + 50, 99.0, "smc", "TCMz")
    account.action("pause", T0 + 50, 99.0)
    account.report(TrainReport("train", 1, tokens_per_s=1.0), T0 + 50)
    summary = account.summary()
    assert summary["wall_s"] == 5.0
    assert summary["max_celsius"] is None and summary["pauses"] == 0
    assert summary["train_reports"] == 0


def test_a_window_must_be_a_positive_number_of_seconds() -> None:
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="throttle window"):
            JobAccount("job1", T0, window_s=bad)


def long_job(more_pauses: int = 0) -> JobAccount:
    """The example of the issue: 12m 04s, two pauses, a trainer at 271 tok/s for its first two
    minutes (reports from T0+10 to T0+130) and 198 for its last (and `more_pauses` pauses with
    long reasons after its last report)."""
    account = JobAccount("1a2b3c4d", T0)
    account.reading(T0, 60.0, "smc", "TCMz", "nominal")
    for start, celsius in ((300, 85.3), (500, 86.1)):
        account.reading(T0 + start, celsius, "smc", "TCMz", "heavy")
        account.action("pause", T0 + start, celsius)
        account.reading(T0 + start + 35, 70.0, "smc", "TCMz", "nominal")
        account.action("resume", T0 + start + 35, 70.0)
    for i in range(140):
        account.report_line(train_line(10 * i, 271.381 if i <= 24 else 198.0), T0 + 10 + 5 * i)
    for i in range(more_pauses):
        account.action("pause", T0 + 706 + i * 0.5, 90.0, "x" * 500)
        account.action("resume", T0 + 706.25 + i * 0.5, 70.0)
    account.finish(T0 + 724)
    return account


def test_the_summary_is_json_and_renders_in_short_lines() -> None:
    account = long_job()
    summary = json.loads(json.dumps(account.summary(), allow_nan=False))
    assert summary == account.summary()
    lines = account.summary_lines()
    assert all(len(line) <= MAX_LINE for line in lines), lines
    text = " ".join(line.strip() for line in lines)
    assert text.startswith("job 1a2b3c4d: 12m 04s wall, paused 1m 10s (2 pauses: 85.3 °C smc")
    assert "pressure nominal 10m 54s · heavy 1m 10s" in text
    assert "max 86.1 °C (smc · TCMz)" in text
    assert "energy unavailable (no agent serve with a power meter" in text
    assert text.endswith("271 tok/s (first 2 min) → 198 tok/s (last 2 min): throttle 0.73")
    assert render(json.loads(account.detail())) == lines


def test_the_detail_fits_its_limit_by_thinning_the_lists() -> None:
    account = long_job(more_pauses=30)
    full = json.loads(account.detail())
    assert "truncated" not in full and len(full["pause_list"]) == 20
    assert all(len(p["reason"]) == 200 for p in full["pause_list"][2:])
    cut = detail_json(account.summary(), limit=2000)
    assert len(cut) <= 2000
    thinned = json.loads(cut)
    assert thinned["truncated"] is True and thinned["pauses"] == full["pauses"]
    assert len(thinned["pause_list"]) < len(full["pause_list"])


@pytest.mark.parametrize(
    ("seconds", "text"), [(4.24, "4.2s"), (60, "1m 00s"), (724, "12m 04s"), (11220, "3h 07m")]
)
def test_durations(seconds: float, text: str) -> None:
    assert duration(seconds) == text


# --- the tee, on a real pipe ------------------------------------------------------------------


def test_the_tee_copies_chunks_at_once_and_hands_on_whole_lines(tmp_path: Path) -> None:
    out = (tmp_path / "out").open("wb")
    lines: list[str] = []
    tee = OutputTee.open(lambda line, at: lines.append(line), out.fileno())
    assert tee is not None and not tee.pty
    written = os.dup(tee.child_fd)  # CMD's end: start() closes the tee's copy of it
    tee.start()
    os.write(written, b"half a ")
    deadline = time.monotonic() + 10
    while (tmp_path / "out").read_bytes() != b"half a ":  # copied before its line ends
        assert time.monotonic() < deadline, "a partial line was not copied"
    os.write(written, b"line\r40%\r100%\n" + b"y" * 70_000 + b"\nnon-utf8 \xff\nlast")
    os.close(written)
    tee.close()
    out.close()
    expected = b"half a line\r40%\r100%\n" + b"y" * 70_000 + b"\nnon-utf8 \xff\nlast"
    assert (tmp_path / "out").read_bytes() == expected
    assert lines == ["half a line", "40%", "100%", "non-utf8 \ufffd", "last"]  # not the long one


def test_the_child_keeps_the_users_pythonunbuffered() -> None:
    assert environment({"A": "1"}) == {"A": "1", "PYTHONUNBUFFERED": "1"}
    assert environment({"PYTHONUNBUFFERED": ""}) == {"PYTHONUNBUFFERED": ""}


# --- agent run, end to end --------------------------------------------------------------------

POLL_S = 0.1
WINDOW_S = 0.3
FIRST = [300.0, 310.0, 290.0]
LAST = [200.0, 190.0]

# Prints FIRST's reports, runs until it has been stopped once (a stall in its own clock) and
# 2 windows have passed, then LAST's reports and a val report. argv: flush (1/0), window.
TRAINER = r"""
import sys, time
flush, window = sys.argv[1] == "1", float(sys.argv[2])
first, last = [300.0, 310.0, 290.0], [200.0, 190.0]
def report(it, tokens):
    print(f"Iter {it}: Train loss {2.5:.3f}, Learning Rate {1e-05:.3e}, It/sec {0.5:.3f}, "
          f"Tokens/sec {tokens:.3f}, Trained Tokens {it * 100}, Peak mem {1.25:.3f} GB",
          flush=flush)
for i, tokens in enumerate(first):
    report(10 * (i + 1), tokens)
print("some other output", flush=flush)
started = before = time.monotonic()
stalled = False
while not (stalled and time.monotonic() - started > 2 * window + 0.2):
    time.sleep(0.01)
    now = time.monotonic()
    stalled = stalled or now - before > 0.4
    before = now
    if now - started > 30:
        sys.exit(3)  # never paused
for i, tokens in enumerate(last):
    report(100 + 10 * i, tokens)
print(f"Iter 120: Val loss {2.0:.3f}, Val took {0.5:.3f}s", flush=flush)
"""


def trainer_output() -> bytes:
    """What TRAINER prints, byte for byte."""

    def report(it: int, tokens: float) -> str:
        return (
            f"Iter {it}: Train loss {2.5:.3f}, Learning Rate {1e-05:.3e}, It/sec {0.5:.3f}, "
            f"Tokens/sec {tokens:.3f}, Trained Tokens {it * 100}, Peak mem {1.25:.3f} GB\n"
        )

    text = "".join(report(10 * (i + 1), t) for i, t in enumerate(FIRST))
    text += "some other output\n"
    text += "".join(report(100 + 10 * i, t) for i, t in enumerate(LAST))
    return (text + f"Iter 120: Val loss {2.0:.3f}, Val took {0.5:.3f}s\n").encode()


def write_curve(path: Path, rows: Sequence[tuple[float, float]]) -> str:
    path.write_text("seconds,celsius\n" + "".join(f"{t},{c}\n" for t, c in rows))
    return f"replay:{path}"


def run_agent(
    agent_cli: str, args: Sequence[str], timeout: float = 90.0, **popen: object
) -> tuple[int, bytes, str]:
    """agent run's exit code, stdout and stderr; one still running after `timeout` is killed
    and the test fails with what it said."""
    agent = subprocess.Popen(
        [agent_cli, "run", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen
    )
    try:
        out, err = agent.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        agent.send_signal(signal.SIGTERM)
        agent.send_signal(signal.SIGTERM)
        out, err = agent.communicate()
        raise AssertionError(f"agent run still running after {timeout:g} s:\n{err!r}") from None
    return agent.returncode, out, err.decode()


def summary_of(home: Path) -> tuple[dict[str, object], list[Event]]:
    events = recorded(home)
    (summary,) = [e for e in events if e.action == "summary"]
    assert [e.action for e in events][-2:] == ["summary", "exit"]
    assert summary.detail is not None
    return json.loads(summary.detail), events


def said(stderr: str) -> str:
    """The summary's lines on stderr, joined into its sentence; each fits 80 columns."""
    lines = [line for line in stderr.splitlines() if line.startswith("[mlx-fleet] ")]
    start = next(i for i, line in enumerate(lines) if line.startswith("[mlx-fleet] job "))
    summary = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("[mlx-fleet]   "):
            break
        summary.append(line)
    assert all(len(line) <= 80 for line in summary), summary
    return " ".join(line.removeprefix("[mlx-fleet] ").strip() for line in summary)


@pytest.mark.parametrize("flush", ["1", "0"])
@pytest.mark.slow
def test_a_paused_trainer_gets_its_summary_and_its_output_unchanged(
    agent_cli: str, fleet_home: Path, tmp_path: Path, flush: str
) -> None:
    """The curve crosses pause_temp (85) at 1.5 s and falls at 2.3 s. With flush 0 the trainer
    relies on the PYTHONUNBUFFERED=1 agent run sets: without it its reports would all arrive at
    its exit and no throttle could be told."""
    source = write_curve(tmp_path / "curve.csv", [(0, 60.0), (1.5, 90.0), (2.3, 60.0)])
    args = ["--thermal-source", source, "--poll-interval", str(POLL_S)]
    args += ["--throttle-window", str(WINDOW_S), "--", sys.executable, "-c", TRAINER]
    code, out, err = run_agent(agent_cli, [*args, flush, str(WINDOW_S)])
    assert code == 0, err
    assert out == trainer_output()

    summary, events = summary_of(fleet_home)
    pause, resume = (next(e for e in events if e.action == a) for a in ("pause", "resume"))
    assert summary["pauses"] == 1
    assert summary["paused_s"] == pytest.approx(resume.time - pause.time, abs=2e-3)
    assert summary["paused_s"] > 0
    assert summary["max_celsius"] == 90.0 == pause.celsius
    assert (summary["max_source"], summary["max_sensor"]) == (source, "replay")
    assert summary["pause_list"][0]["reason"] == f"90.0 °C {source} · replay"
    assert summary["pressure_s"] == {"unknown": summary["wall_s"]}  # a replay has no level
    first, last = sum(FIRST) / len(FIRST), sum(LAST) / len(LAST)
    assert summary["tok_s_first"] == pytest.approx(first, abs=1e-3)
    assert summary["tok_s_last"] == pytest.approx(last, abs=1e-3)
    assert summary["throttle"] == round(last / first, 4)
    assert (summary["train_reports"], summary["val_reports"]) == (5, 1)
    assert summary["energy_j"] is None
    assert summary["wall_s"] >= summary["paused_s"] + 2 * WINDOW_S

    text = said(err)
    assert f"paused {duration(summary['paused_s'])} (1 pause: 90.0 °C" in text
    assert f"max 90.0 °C ({source} · replay)"[:40] in text
    assert "energy unavailable (no agent serve with a power meter" in text
    assert text.endswith(f"→ {last:.0f} tok/s (last 0.3s): throttle {last / first:.2f}")
    assert err.index("[mlx-fleet] job ") < err.index(" exit job ")


@pytest.mark.slow
def test_the_users_pythonunbuffered_stays_and_stderr_is_not_teed(agent_cli: str) -> None:
    script = (
        "import os, sys; print(repr(os.environ.get('PYTHONUNBUFFERED'))); "
        "print('to stderr', file=sys.stderr)"
    )
    base = ["--thermal-source", "none", "--", sys.executable, "-c", script]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    code, out, err = run_agent(agent_cli, base, env=env)
    assert (code, out) == (0, b"'1'\n")
    assert "to stderr" in err
    code, out, _ = run_agent(agent_cli, base, env={**env, "PYTHONUNBUFFERED": "x"})
    assert (code, out) == (0, b"'x'\n")


# Every byte value, progress bars redrawn with \r, 1 MiB without a newline, no final newline.
NOISY = r"""
import sys
out = sys.stdout.buffer
out.write(bytes(range(256)))
for i in range(100):
    out.write(b"\r%d%%" % i)
out.write(b"\n" + b"z" * (1 << 20))
out.write(b"\nIter 10: Train loss 2.000, Tokens/sec 123.456\n" + b"tail")
"""
NOISY_OUT = (
    bytes(range(256))
    + b"".join(b"\r%d%%" % i for i in range(100))
    + b"\n"
    + b"z" * (1 << 20)
    + b"\nIter 10: Train loss 2.000, Tokens/sec 123.456\ntail"
)


@pytest.mark.slow
def test_cmds_output_reaches_a_slow_reader_byte_for_byte(agent_cli: str, fleet_home: Path) -> None:
    """agent run's stdout is read 4 KiB at a time while CMD writes 1 MiB and more."""
    agent = subprocess.Popen(
        [agent_cli, "run", "--thermal-source", "none", "--", sys.executable, "-c", NOISY],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert agent.stdout is not None
    chunks = []
    deadline = time.monotonic() + 60
    while chunk := agent.stdout.read1(4096):
        chunks.append(chunk)
        assert time.monotonic() < deadline, "CMD's output never ended"
    assert agent.wait(timeout=30) == 0
    assert b"".join(chunks) == NOISY_OUT
    summary, _ = summary_of(fleet_home)
    assert summary["train_reports"] == 1 and summary["tok_s_mean"] == 123.456


@pytest.fixture
def escaped(tmp_path: Path) -> Iterator[Path]:
    """Where a test's escaped process writes its pid; it is killed after the test."""
    pidfile = tmp_path / "escaped"
    yield pidfile
    if pidfile.exists() and pidfile.read_text().strip():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def read_pty(master: int, agent: subprocess.Popen[bytes], timeout: float = 60.0) -> bytes:
    """Everything written to the pty until agent run ends (and the pty says no more)."""
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the other end closed it
                return data
            if not chunk:
                return data
            data += chunk
        elif agent.poll() is not None:
            return data
    raise AssertionError(f"agent run still writing after {timeout} s: {data!r}")


@pytest.mark.slow
def test_on_a_terminal_cmd_still_sees_one(agent_cli: str, fleet_home: Path) -> None:
    """agent run's stdout is a pty: CMD's is a pty too, of the same size, and what CMD writes
    arrives as if written to the terminal itself (\n becomes \r\n once). The row is mlx_lm
    0.32's, with the colours rich gives a terminal."""
    script = (
        "import os; print('tty', os.isatty(1), tuple(os.get_terminal_size(1))); "
        "print('\\x1b[2m  10\\x1b[0m    \\x1b[1;32m2.345 ▼\\x1b[0m    \\x1b[1m  271\\x1b[0m    "
        "\\x1b[2m  5.1k\\x1b[0m')"
    )
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 132, 0, 0))
    agent = subprocess.Popen(
        [agent_cli, "run", "--thermal-source", "none", "--", sys.executable, "-c", script],
        stdout=slave,
        stderr=subprocess.PIPE,
    )
    os.close(slave)
    try:
        out = read_pty(master, agent)
    finally:
        os.close(master)
    assert agent.wait(timeout=30) == 0
    row = (
        "\x1b[2m  10\x1b[0m    \x1b[1;32m2.345 ▼\x1b[0m    \x1b[1m  271\x1b[0m    "
        "\x1b[2m  5.1k\x1b[0m"
    )
    assert out == f"tty True (132, 40)\r\n{row}\r\n".encode()
    summary, _ = summary_of(fleet_home)
    assert summary["train_reports"] == 1 and summary["tok_s_mean"] == 271.0


@pytest.mark.parametrize("terminal", [False, True])
@pytest.mark.slow
def test_a_process_outside_the_group_holding_stdout_does_not_keep_agent_run(
    agent_cli: str, escaped: Path, terminal: bool
) -> None:
    """CMD leaves a process of its own session (setsid: not in CMD's group, so agent run does
    not end it) holding CMD's stdout open for 60 s; agent run exits with CMD's code at once."""
    script = f"setsid sleep 60 2>/dev/null & echo $! > {escaped}; echo started; exit 4"
    args = [agent_cli, "run", "--thermal-source", "none", "--", "sh", "-c", script]
    started = time.monotonic()
    if terminal:
        master, slave = os.openpty()
        agent = subprocess.Popen(args, stdout=slave, stderr=subprocess.DEVNULL)
        os.close(slave)
        try:
            code = agent.wait(timeout=30)
            out = read_pty(master, agent)
        finally:
            os.close(master)
        assert out == b"started\r\n"
    else:
        code, raw, err = run_agent(agent_cli, args[2:], timeout=30)
        assert raw == b"started\n", err
    assert code == 4
    assert time.monotonic() - started < 20
    assert escaped.read_text().strip()  # it was there, and is killed after the test


@pytest.mark.slow
def test_energy_comes_from_agent_serves_meter_labelled_as_it_is(
    agent_cli: str, fleet_home: Path, agents: AgentPool
) -> None:
    """With `agent serve` (same data dir) metering with `sim`, the summary's energy is the
    difference of its samples' cumulative joules over the job, said to be the whole Mac's and
    simulated."""
    agents.start("serve", home=fleet_home, options=["--power-source", "sim",
                                                    "--poll-interval", "0.2"])  # fmt: skip
    trainer = "import time; time.sleep(2.0)"  # the job's work: two seconds of wall time
    code, _, err = run_agent(agent_cli, ["--", sys.executable, "-c", trainer])
    assert code == 0, err
    assert "registered with agent serve" in err
    summary, _ = summary_of(fleet_home)
    assert summary["energy_j"] is not None and summary["energy_j"] > 0
    assert summary["energy_source"] == "sim, simulated: not a meter"
    assert "(the whole Mac's, sim, simulated: not a meter)" in said(err)


def test_the_time_the_jobs_own_speed_throttled() -> None:
    """From each `throttling` event to its `throttle_end` (or the job's end), as agent run
    records them (agent.cooling.job_speed)."""
    account = JobAccount("j", 1000.0)
    account.action("throttling", 1010.0, reason="312 tok/s of 402")
    account.action("throttling", 1015.0)  # still the same stretch
    account.action("throttle_end", 1030.0)
    account.action("throttling", 1050.0)
    account.finish(1060.0)
    summary = account.summary()
    assert (summary["throttled_s"], summary["throttlings"]) == (30.0, 2)
    assert "throttling 30.0s" in " ".join(account.summary_lines())
    quiet = JobAccount("k", 0.0)
    quiet.finish(10.0)
    assert quiet.summary()["throttlings"] == 0
    assert "throttling" not in " ".join(quiet.summary_lines())
