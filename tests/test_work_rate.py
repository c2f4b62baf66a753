"""The job's own speed: mlx_lm lora's real output in both report formats read through `agent
run`'s tee (tests/fixtures/mlx_lm, captured from mlx-lm 0.31.0 and 0.32.2), and a custom loop's
step-gate work reports."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.cooling.output_tee import OutputTee
from shared.cooling.job_account import TrainReport, parse_report
from shared.cooling.throttle import ThrottlePoll, judge

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
