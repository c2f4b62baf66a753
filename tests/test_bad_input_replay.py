"""The bad inputs of issue 28's first-day report, one of each class, replayed against both CLIs:
each is answered with one line naming the problem, exit 2, no traceback, nothing on stdout.
(The signal, data-dir and handshake classes need live processes: tests/test_signals_connect.py,
tests/test_data_dir.py and tests/test_bounds.py replay them.)"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
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


API_REFUSALS = {
    "forward-seq-0": "seq_len must be at least 1, got 0",
    "forward-seq-huge": "seq_len must be at most 1048576, got 1000000000",
    "forward-batch-0": "batch_size must be at least 1, got 0",
    "forward-seq-float": "seq_len must be a whole number, got 1.5",
    "not-a-model": "model must be an MLX model (mlx.nn.Module, e.g. build_model's), got str",
    "bench-no-model": "model must be an MLX model (mlx.nn.Module, e.g. build_model's), got None",
    "build-no-args": "args must be a ModelArgs (ModelArgs.small(), ModelArgs.full()), got None",
    "build-bits-str": "bits must be one of (4, 8, 16), got '4'",
    "shape-huge": "parameters, past the 1e+12 a built-in model may have",
    "suite-bits": "bits must be None or one of (4, 8, 16), got 3",
    "suite-source": "unknown thermal source 'bogus'",
    "suite-one-length": "seq_lengths must be a non-empty list of lengths, got 8",
    "suite-length-0": "seq_len must be at least 1, got 0",
    "suite-iterations-0": "num_iterations must be at least 1, got 0",
    "precision-nan": "precision must be None or a number above 0 and below 1, got nan",
    "precision-0": "precision must be None or a number above 0 and below 1, got 0.0",
    "slow-0": "slow must be a number above 0 and at most 1, got 0.0",
    "sleep-negative": "injected_sleep_s must be a number of seconds from 0 to 1e+06, got -1",
    "poll-nan": "poll_interval must be a finite number",
    "poll-huge": "poll_interval must be at most 1h",
    "history-huge": "history_size must be at most 1000000, got 1000000000000",
    "scheduler-no-monitor": "monitor must be a ThermalMonitor (or RemoteMonitor), got NoneType",
    "scheduler-policy-str": "policy must be a ThermalPolicy or None, got str",
    "policy-stop-huge": "stop_temp must be -50 to 200 °C, got 1e+09",
    "policy-below-zero": "max_speed_temp must be -50 to 200 °C, got -600",
    "policy-pause-step-huge": "pause_duration must be > 0 and at most 3600 seconds, got 1e+12",
}
"""Issue 42's rest of the 13 Python API errors, each call's one line (api_calls)."""


def api_calls() -> dict[str, Callable[[], object]]:
    """API_REFUSALS' calls: before this round, MLX's reshape or randint errors, an
    AttributeError or ZeroDivisionError of ours, a bad value accepted, or a size (a 10**9-token
    forward pass, a 10**12-reading history, a 10**9-wide model) that ran until killed."""
    import dataclasses

    from agent.cooling.scheduler import CoolingScheduler
    from agent.model import ModelArgs, build_model
    from agent.profiling import BenchmarkSuite, MemoryProfiler, SpeedProfiler
    from agent.thermal import ThermalMonitor
    from shared.cooling.policy import ThermalPolicy

    args = ModelArgs.small()
    model = build_model(args, bits=16)
    memory, speed = MemoryProfiler(), SpeedProfiler()
    return {
        "forward-seq-0": lambda: memory.profile_forward(model, seq_len=0),
        "forward-seq-huge": lambda: memory.profile_forward(model, seq_len=10**9),
        "forward-batch-0": lambda: memory.profile_forward(model, 8, batch_size=0),
        "forward-seq-float": lambda: memory.profile_forward(model, seq_len=1.5),  # type: ignore[arg-type]
        "not-a-model": lambda: memory.profile_model("llama"),  # type: ignore[arg-type]
        "bench-no-model": lambda: speed.benchmark_tokens_per_sec(None, seq_len=8),  # type: ignore[arg-type]
        "build-no-args": lambda: build_model(None),  # type: ignore[arg-type]
        "build-bits-str": lambda: build_model(args, bits="4"),  # type: ignore[arg-type]
        "shape-huge": lambda: dataclasses.replace(args, hidden_size=10**9),
        "suite-bits": lambda: BenchmarkSuite(args, bits=3),
        "suite-source": lambda: BenchmarkSuite(args, thermal_source="bogus"),
        "suite-one-length": lambda: BenchmarkSuite(args).benchmark_sequence_lengths(8),  # type: ignore[arg-type]
        "suite-length-0": lambda: BenchmarkSuite(args).benchmark_sequence_lengths([0]),
        "suite-iterations-0": lambda: BenchmarkSuite(args).benchmark_sequence_lengths(
            [8], num_iterations=0
        ),
        "precision-nan": lambda: SpeedProfiler(precision=math.nan),
        "precision-0": lambda: SpeedProfiler(precision=0.0),
        "slow-0": lambda: SpeedProfiler(slow=0.0),
        "sleep-negative": lambda: SpeedProfiler(injected_sleep_s=-1),
        "poll-nan": lambda: ThermalMonitor(poll_interval=math.nan, source="none"),
        "poll-huge": lambda: ThermalMonitor(poll_interval=1e12, source="none"),
        "history-huge": lambda: ThermalMonitor(history_size=10**12, source="none"),
        "scheduler-no-monitor": lambda: CoolingScheduler(None),  # type: ignore[arg-type]
        "policy-stop-huge": lambda: ThermalPolicy(stop_temp=1e9),
        "policy-below-zero": lambda: ThermalPolicy(-600, -550, -500),
        "policy-pause-step-huge": lambda: ThermalPolicy(pause_duration=1e12),
        "scheduler-policy-str": lambda: CoolingScheduler(
            ThermalMonitor(source="none"),
            policy="cool",  # type: ignore[arg-type]
        ),
    }


@pytest.mark.parametrize("case", list(API_REFUSALS))
def test_every_python_api_entry_refuses_bad_arguments_with_its_own_line(case: str) -> None:
    """Each call refused before MLX sees it, in one line naming the argument, raised by our
    own check (never from inside MLX)."""
    calls = api_calls()
    assert set(calls) == set(API_REFUSALS)
    with pytest.raises((ValueError, TypeError)) as refused:
        calls[case]()
    message = str(refused.value)
    assert API_REFUSALS[case] in message and "\n" not in message, message
    raised_in = refused.traceback[-1].path
    assert "mlx" not in raised_in.parts, raised_in


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
