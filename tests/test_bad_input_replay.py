"""The bad inputs of issue 28's first-day report, one of each class, replayed against both CLIs:
each is answered with one line naming the problem, exit 2, no traceback, nothing on stdout.
(The signal, data-dir and handshake classes need live processes: tests/test_signals_connect.py,
tests/test_data_dir.py and tests/test_bounds.py replay them.)"""

from __future__ import annotations

import pytest

from tests.conftest import run_cli

SMALL = ["--config-small", "-p", "16", "-n", "0"]
NOWHERE = ["--hosts", "127.0.0.1:9"]
REPORT = [
    # nonsense accepted before
    (["agent", "bench", *SMALL, "--sustain", "100000h"], "--sustain"),
    (["coordinator", "status", *NOWHERE, "--connect-timeout", "1e9"], "--connect-timeout"),
    (["coordinator", "runs", "--limit", "1e20"], "--limit"),
    (["coordinator", "monitor", "--once", *NOWHERE, "--format", "xml"], "unknown format 'xml'"),
    (["agent", "bench", *SMALL, "--pause-temp", "nan"], "--pause-temp must be a finite number"),
    (["agent", "bench", *SMALL, "--stop-temp", "inf"], "--stop-temp must be a finite number"),
    (["coordinator", "history", "--hosts", "typo"], "typo"),
    (["agent", "serve", "--bind", "nosuch.invalid:5555"], "nosuch.invalid"),
    # bounds on durations and counts
    (["agent", "bench", *SMALL, "--delay", "1e9"], "--delay"),
    (["agent", "bench", *SMALL, "--cool-start-limit", "-5"], "--cool-start-limit"),
    (["agent", "bench", *SMALL, "-r", "100000"], "--repetitions"),
    (["agent", "bench", *SMALL, "-w", "1000"], "--warmup"),
    (["agent", "temp", "--poll-interval", "inf"], "--poll-interval"),
    (["coordinator", "benchmark", *SMALL, "--host-timeout", "1e12"], "--host-timeout"),
    # the habits of other tools
    (["agent", "bench", *SMALL, "-f", "json"], "No such option: -f"),
    (["agent", "bench", *SMALL, "-o", "xml"], "unknown format 'xml'"),
    (["coordinator", "keys", "remove", "nosuch.invalid"], "nosuch.invalid"),
    (["coordinator", "netbench", "--hosts", "a,b", "--sizes", "64K,1K"], "--sizes"),
]  # fmt: skip


@pytest.mark.parametrize(("command", "named"), REPORT, ids=[" ".join(c) for c, _ in REPORT])
def test_each_bad_input_is_one_line_naming_it(command: list[str], named: str) -> None:
    result = run_cli(*command)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert named in lines[0], lines[0]
