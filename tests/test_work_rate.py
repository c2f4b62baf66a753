"""The job's own speed: mlx_lm lora's real output in both report formats read through `agent
run`'s tee (tests/fixtures/mlx_lm, captured from mlx-lm 0.31.0 and 0.32.2), and a custom loop's
step-gate work reports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from agent.cooling.output_tee import OutputTee
from agent.cooling.work_report import WorkFile, WorkReport, checked_tokens, work_path
from shared.cooling.job_account import TrainReport, parse_report
from shared.cooling.throttle import ThrottlePoll, judge
from shared.wire import protocol as p
from tests.fleet_support import AgentPool, receive, subscriber
from tests.test_run_cli import events as recorded_events

FIXTURES = Path(__file__).parent / "fixtures" / "mlx_lm"


def teed_reports(capture: Path, tmp_path: Path) -> tuple[list[TrainReport], bytes]:
    """The capture written into a real tee's pipe as CMD would write it: the reports its lines
    give, and what the tee copied on."""
    out = (tmp_path / "copied").open("wb")
    lines: list[str] = []
    tee = OutputTee.open(lambda line, at: lines.append(line), out.fileno())
    assert tee is not None
    written = os.dup(tee.child_fd)
    tee.start()
    data = capture.read_bytes()
    for start in range(0, len(data), 997):  # chunks that cut lines and escapes apart
        os.write(written, data[start : start + 997])
    os.close(written)
    tee.close()
    out.close()
    reports = [report for line in lines if (report := parse_report(line)) is not None]
    return reports, (tmp_path / "copied").read_bytes()


def summary(reports: list[TrainReport]) -> tuple[list[tuple[int, float | None]], list[int]]:
    train = [(r.iteration, r.tokens_per_s) for r in reports if r.kind == "train"]
    return train, [r.iteration for r in reports if r.kind == "val"]


def test_mlx_lm_0_31_print_lines(tmp_path: Path) -> None:
    capture = FIXTURES / "lora-0.31.0-pipe.txt"
    reports, copied = teed_reports(capture, tmp_path)
    assert copied == capture.read_bytes()
    train, val = summary(reports)
    assert train == [
        (2, 4803.039),
        (4, 7820.577),
        (6, 7770.192),
        (8, 7777.921),
        (10, 7833.737),
        (12, 7661.874),
    ]
    assert val == [1, 6, 12]
    first = reports[1]
    assert (first.train_loss, first.it_per_s, first.trained_tokens) == (6.479, 96.061, 100)
    assert first.learning_rate == 1e-05 and first.peak_mem_gb == 0.002


@pytest.mark.parametrize(
    ("capture", "rates"),
    [
        ("lora-0.32.2-pipe.txt", [77.0, 6804.0, 7270.0, 7270.0, 7070.0, 7679.0]),
        ("lora-0.32.2-pty.bin", [4107.0, 7232.0, 7151.0, 6916.0, 6341.0, 7030.0]),
    ],
)
def test_mlx_lm_0_32_table_rows_in_a_pipe_and_on_a_terminal(
    capture: str, rates: list[float], tmp_path: Path
) -> None:
    """0.32's TrainUI rows (rich, coloured, thousands with a comma; on a pty between progress
    bar redraws and cursor escapes): the same reports, tok/s as the row rounds it."""
    reports, copied = teed_reports(FIXTURES / capture, tmp_path)
    assert copied == (FIXTURES / capture).read_bytes()
    train, val = summary(reports)
    assert train == list(zip([2, 4, 6, 8, 10, 12], rates, strict=True))
    assert val == [1, 6, 12]
    assert reports[1].train_loss == 6.479


def test_the_rule_reads_the_reports_as_work_rates(tmp_path: Path) -> None:
    """Each train report is one work-rate reading. The 0.32 capture's first report (77 tok/s:
    compilation inside its steps) is one of the early readings, never judged; the steady run
    after it does not throttle."""
    reports, _ = teed_reports(FIXTURES / "lora-0.32.2-pipe.txt", tmp_path)
    polls = [ThrottlePoll(rate=r.tokens_per_s) for r in reports if r.kind == "train"]
    verdicts = judge(polls)
    assert [v.throttling for v in verdicts] == [False] * 6
    assert verdicts[-1].text == "7679 tok/s of 7270"


# --- a custom loop's work, through the step gate ---------------------------------------------


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), float("inf"), "100", None, True])
def test_a_work_report_that_is_no_count_of_tokens_is_refused_in_one_line(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^report_work: tokens must be ") as refused:
        checked_tokens(bad)
    assert "\n" not in str(refused.value)


def test_the_loops_totals_become_a_rate_by_its_own_clock(tmp_path: Path) -> None:
    state = tmp_path / "job.cooling.json"
    report, read = WorkReport(state), WorkFile(state)
    assert read.rate() is None  # nothing written yet
    report.add(0)
    assert work_path(state).exists() and read.rate() is None  # one total: no rate yet
    written = json.loads(work_path(state).read_text())
    later = written | {"tokens": 500.0, "time": written["time"] + 2}
    work_path(state).write_text(json.dumps(later))
    assert read.rate() == pytest.approx(250.0)
    assert read.rate() is None  # no new work since
    work_path(state).write_text("{not json")
    assert read.rate() is None
    WorkReport(None).add(10)  # outside agent run: checked, written nowhere


LOOP = r"""
import sys, time
from agent.cooling.step_gate import StepGate

gate = StepGate()
start = time.monotonic()
step = 0
while time.monotonic() - start < float(sys.argv[1]):
    gate.check_before_step(step)
    slow = time.monotonic() - start > float(sys.argv[2])
    time.sleep(0.03 if slow else 0.01)  # the same work, three times slower: a throttle
    gate.report_work(100)
    step += 1
gate.report_work(-1)
"""


@pytest.mark.slow
def test_a_custom_loops_work_reports_reach_agent_run_and_the_agent(
    agent_cli: str, fleet_home: Path, agents: AgentPool, tmp_path: Path
) -> None:
    """A loop reporting 100 tokens a step under `agent run`, registered with `agent serve`:
    the agent's samples list the job's tok/s; when its steps slow down threefold, agent run
    records `throttling` with the figures, and the samples say the Mac throttles, why and by
    which job. A negative report ends the loop with one line naming it."""
    agent = agents.start("serve", home=fleet_home, options=["--poll-interval", "0.2"])
    ctx = zmq.Context()
    sock = subscriber(ctx, agent)
    try:
        loop = tmp_path / "loop.py"
        loop.write_text(LOOP)
        run = subprocess.Popen(
            [agent_cli, "run", "--", sys.executable, str(loop), "9", "4"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        seen: list[p.Message] = []
        rated = receive(sock, lambda m: any(w["rate"] for w in job_works(m)), 60, seen)
        work = job_works(rated)[0]
        assert work["unit"] == "tok/s" and work["rate"] > 0 and work["time"] > 0
        throttled = receive(sock, lambda m: m.body.get("throttling") is True, 60, seen)
        evidence = throttled.body["throttle_evidence"]
        assert re.fullmatch(r"job \w+: \d+ tok/s of \d+", evidence), evidence
        now, best = map(int, re.findall(r"(\d+) tok/s of (\d+)", evidence)[0])
        assert now < 0.85 * best
        out, err = run.communicate(timeout=60)
    finally:
        sock.close()
        ctx.term()
    assert run.returncode == 1, err
    assert "ValueError: report_work: tokens must be a finite number >= 0, got -1" in err.decode()
    events = {e.action: e for e in recorded_events(fleet_home)}
    assert re.fullmatch(r"\d+ tok/s of \d+", events["throttling"].detail or "")
    assert not list((fleet_home / "jobs").glob("*.work"))  # agent run cleaned up


def job_works(message: p.Message) -> list[dict]:
    if message.type != "telemetry.sample":
        return []
    return [job["work"] for job in message.body["jobs"] if job.get("work")]


@pytest.mark.slow
def test_a_real_mlx_lm_lora_under_agent_run_shows_its_tok_s_to_the_agent(
    agent_cli: str, fleet_home: Path, agents: AgentPool, tmp_path: Path
) -> None:
    """mlx_lm's own lora on a tiny model (tests.test_gang.write_lora_job), supervised by agent
    run registered with agent serve: the agent's samples list the job's tok/s as mlx_lm
    reported it."""
    pytest.importorskip("mlx_lm", reason="the `lm` extra (mlx-lm) is not installed")
    from tests.test_gang import write_lora_job

    write_lora_job(tmp_path)
    agent = agents.start("serve", home=fleet_home, options=["--poll-interval", "0.2"])
    ctx = zmq.Context()
    sock = subscriber(ctx, agent)
    lora = [sys.executable, "-m", "mlx_lm", "lora", "--model", "model", "--train", "--data",
            "data", "--iters", "3000", "--batch-size", "2", "--num-layers", "1",
            "--steps-per-report", "20", "--steps-per-eval", "100000", "--val-batches", "1",
            "--adapter-path", "adapters"]  # fmt: skip
    run = subprocess.Popen(
        [agent_cli, "run", "--", *lora],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        rated = receive(sock, lambda m: any(w["rate"] for w in job_works(m)), 180)
        work = job_works(rated)[0]
        assert work["unit"] == "tok/s" and work["rate"] > 0
    finally:
        sock.close()
        ctx.term()
        run.terminate()  # agent run forwards it to mlx_lm and ends
        _, err = run.communicate(timeout=60)
    events = [e.action for e in recorded_events(fleet_home)]
    assert "summary" in events, err.decode()


def test_agent_runs_judge_drops_rates_across_a_pause_and_says_when_it_throttles(
    tmp_path: Path,
) -> None:
    """JobSpeed, poll by poll: a rate read across a pause (the poll that finds the job paused,
    and the one after) is no rate of work; the verdict's changes are the events."""
    from agent.cooling.job_speed import JobSpeed

    rates = iter([500.0, 400.0, 100.0, 100.0, 400.0, 400.0, 400.0, 400.0, 300.0, 300.0, 300.0,
                  400.0])  # fmt: skip
    speed = JobSpeed(tmp_path / "j.cooling.json", lambda: next(rates))
    running = [True, True, False, True, True, True, True, True, True, True, True, True]
    changes = [speed.poll(run) for run in running]
    assert speed.watch.best_rate == 400.0  # 500 (the first poll) and the 100s were dropped
    assert changes[:10] == [None] * 10
    assert changes[10] == ("throttling", "300 tok/s of 400")
    assert changes[11] == ("throttle_end", "no longer throttling: 400 tok/s of 400")
    assert speed.work == {"rate": 400.0, "unit": "tok/s", "time": speed.rate_at,
                          "throttling": False, "evidence": "400 tok/s of 400"}  # fmt: skip
