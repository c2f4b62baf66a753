"""The bad inputs of issue 28's first-day report, one of each class, replayed against both CLIs:
each is answered with one line naming the problem, exit 2, no traceback, nothing on stdout.
(The signal, data-dir and handshake classes need live processes: tests/test_signals_connect.py,
tests/test_data_dir.py and tests/test_bounds.py replay them.)"""

from __future__ import annotations

import re
from pathlib import Path

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


LONG_RUN_ID = "r" * 100_000
"""Past SQLite's LIKE pattern limit: once `LIKE or GLOB pattern too complex` (a traceback)."""
KEY = "A" * 40
ISSUE_42 = [
    # an empty value refused, never a default or `.`
    (["agent", "bench", *SMALL, "--bits", ""], "--bits is empty"),
    (["agent", "bench", *SMALL, "--thermal-source", ""], "--thermal-source is empty"),
    (["agent", "temp", "--thermal-source", ""], "--thermal-source is empty"),
    (["agent", "bench", "-p", "16", "-n", "0", "--model", ""], "--model is empty"),
    (["agent", "bench", *SMALL, "--output", ""], "--output is empty"),
    (["coordinator", "benchmark", *NOWHERE, *SMALL, "--bits", ""], "--bits is empty"),
    (["agent", "serve", "--name", ""], "--name"),
    # an option that means nothing without another, or that another contradicts
    (["agent", "temp", "--count", "3"], "--count applies with --watch only"),
    (["agent", "doctor", "--seconds", "3"], "--seconds applies with --capture only"),
    (["agent", "doctor", "--load", "2", "--capture", "{tmp}/c.jsonl"], "--load and --capture"),
    (["agent", "bench", *SMALL, "--no-cool-start", "--cool-start-limit", "30"],
     "--cool-start-limit and --no-cool-start conflict"),
    (["agent", "bench", *SMALL, "--cool-start-limit", "30", "--no-cool-start"],
     "--no-cool-start and --cool-start-limit conflict"),
    (["agent", "run", "--rank", "1", "--", "true"], "need --group"),
    (["agent", "run", "--group", "g", "--ranks", "2", "--rank", "0", "--rank-hosts", "a,,b",
      "--", "true"], "--rank-hosts item 2 is empty"),
    (["coordinator", "keys", "add", "A+B", KEY], "bad host 'A+B'"),
    (["coordinator", "history", "--plot", "{tmp}/x.txt"], "must end in .png"),
    (["agent", "serve", "--parent-pid", "4194303", "--bind", "127.0.0.1:0"], "no such process"),
    # lines that misled
    (["agent", "bench", *SMALL, "--bits", "3"], "choose from 4, 8, 16 (or none given"),
    (["coordinator", "cancel", "r-1", *NOWHERE], "not both"),
    (["coordinator", "status", "--hostfile", "{tmp}/host5.json"], "host is int 5"),
    # tracebacks
    (["coordinator", "show", LONG_RUN_ID], "a run id has at most 100"),
    (["coordinator", "compare", LONG_RUN_ID, "r-2"], "a run id has at most 100"),
    (["coordinator", "resume", LONG_RUN_ID], "a run id has at most 100"),
    (["coordinator", "cancel", LONG_RUN_ID], "a run id has at most 100"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "named"), ISSUE_42, ids=[" ".join(c)[:60] for c, _ in ISSUE_42]
)
def test_issue_42_bad_inputs_are_one_line_each(
    command: list[str], named: str, tmp_path: Path
) -> None:
    """Issue 42's new user: each once silently accepted, misleading, or a traceback."""
    (tmp_path / "host5.json").write_text('[{"host": 5}]')
    result = run_cli(*(part.replace("{tmp}", str(tmp_path)) for part in command))
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert result.stdout == "" and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert named in lines[0], lines[0]
    assert len(lines[0]) < 400, lines[0]  # a 100,000-character id is never echoed whole


def test_a_binary_hostfile_is_one_warning_and_the_rank_runs_alone(tmp_path: Path) -> None:
    """A binary MLX_HOSTFILE under `agent run` (once a UnicodeDecodeError): one line, and the
    command is supervised alone, as docs/monitoring.md says of a malformed hostfile."""
    hostfile = tmp_path / "hosts.json"
    hostfile.write_bytes(bytes(range(128, 256)))
    result = run_cli(
        "agent", "run", "--", "true", env={"MLX_HOSTFILE": str(hostfile), "MLX_RANK": "0"}
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "not UTF-8 text, so not a JSON hostfile; supervising this rank alone" in result.stderr


@pytest.mark.parametrize(
    ("call", "named"),
    [
        ("tokens_per_sec", "seq_len must be at least 1, got 0"),
        ("tokens_per_sec_huge", "seq_len must be at most"),
        ("prompt_gen", "prompt_len must be at least 1"),
        ("autoregressive", "total_tokens must be at most"),
        ("batch", "batch_size x tokens is"),
        ("policy", "pause_temp must be a finite number (°C), got nan"),
    ],
)
def test_the_python_api_refuses_bad_arguments_before_mlx(call: str, named: str) -> None:
    """Issue 42: seq_len=0 was MLX's reshape error, 10**9 ran until killed, a NaN threshold
    was called "out of order"; each is refused with its own name."""
    from agent.model import ModelArgs, build_model
    from agent.profiling import SpeedProfiler
    from shared.cooling.policy import ThermalPolicy

    model = build_model(ModelArgs.small(), bits=16)
    profiler = SpeedProfiler()
    calls = {
        "tokens_per_sec": lambda: profiler.benchmark_tokens_per_sec(model, seq_len=0),
        "tokens_per_sec_huge": lambda: profiler.benchmark_tokens_per_sec(model, seq_len=10**9),
        "prompt_gen": lambda: profiler.benchmark_prompt_gen(model, 0, 4),
        "autoregressive": lambda: profiler.benchmark_autoregressive(model, total_tokens=10**6),
        "batch": lambda: profiler.benchmark_tokens_per_sec(model, seq_len=8192, batch_size=1024),
        "policy": lambda: ThermalPolicy(pause_temp=float("nan")),
    }
    with pytest.raises(ValueError, match=re.escape(named)):
        calls[call]()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"hidden_size": 0}, "hidden_size must be a whole number of at least 1, got 0"),
        ({"num_hidden_layers": -1}, "num_hidden_layers must be a whole number of at least 1"),
        ({"num_attention_heads": 3}, "must be a multiple of num_attention_heads 3"),
        ({"num_key_value_heads": 3}, "must be a multiple of num_key_value_heads 3"),
        ({"rope_theta": float("nan")}, "rope_theta must be a finite number above 0"),
    ],
)
def test_a_model_shape_mlx_cannot_build_is_refused_by_name(change: dict, named: str) -> None:
    """Issue 42: hidden_size=0 was a ZeroDivisionError, num_hidden_layers=-1 built nothing."""
    import dataclasses

    from agent.model import ModelArgs

    with pytest.raises(ValueError, match=re.escape(named)):
        dataclasses.replace(ModelArgs.small(), **change)
