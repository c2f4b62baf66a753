"""Bad input a new user types, each answered with one line naming the problem and exit 2 (or the
documented code): Click's own usage errors included, an empty --hosts, a plot into a folder that
is not there, conflicting configs, a name DNS cannot resolve."""

from __future__ import annotations

import pytest

from shared.io.transport import resolve_error
from tests.conftest import refusal, run_cli


@pytest.mark.parametrize(
    ("command", "needle"),
    [
        (["agent", "bench", "--bogus"], "No such option: --bogus"),
        (["agent", "bench", "-r", "x"], "--repetitions: 'x' is not a whole number or auto"),
        (["agent", "bench", "-r"], "Option '-r' requires an argument"),
        (["agent", "benchh"], "No such command 'benchh'"),
        (["agent", "keys", "trust"], "Missing argument 'KEY'"),
        (["coordinator", "compare", "r-1"], "Missing argument 'RUN_B'"),
        (["coordinator", "monitor", "--bogus", "1"], "No such option: --bogus"),
        (["coordinator", "keys", "add", "mac1"], "Missing argument 'KEY'"),
        (["coordinator", "history", "--since"], "Option '--since' requires an argument"),
        (["agent", "run", "--pace-slice", "2", "--", "true"], "--pace-slice must be 0.05 to 0.5"),
        (["agent", "run", "--pace-min-duty", "0", "--", "true"], "--pace-min-duty must be 0.05"),
        (
            ["coordinator", "policy", "--pause-temp", "90", "--pace-temp", "95"],
            "--pace-temp must be above 2 °C and at most --pause-temp 90 °C",
        ),
    ],
)
def test_every_usage_error_is_one_line_naming_the_option(command: list[str], needle: str) -> None:
    assert needle in refusal(*command)


def test_a_bare_command_still_shows_its_help() -> None:
    result = run_cli("agent", "keys")
    assert "Usage: agent keys" in result.stdout + result.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["coordinator", "benchmark", "--hosts", "", "--config-small"],
        ["coordinator", "status", "--hosts", ""],
        ["coordinator", "monitor", "--once", "--hosts", " , "],
        ["coordinator", "history", "--hosts", ""],
        ["coordinator", "cancel", "--hosts", ""],
    ],
)
def test_an_empty_hosts_is_refused_not_a_local_run(command: list[str]) -> None:
    assert "--hosts is empty" in refusal(*command)


def test_a_plot_into_a_missing_folder_is_refused_before_anything_runs() -> None:
    line = refusal("coordinator", "history", "--plot", "/missing/dir/x.png")
    assert "--plot /missing/dir/x.png: folder /missing/dir does not exist" in line


def test_conflicting_configs_are_refused_by_the_coordinator_too() -> None:
    line = refusal("coordinator", "benchmark", "--config-small", "--config", "full")
    assert "--config-small and --config full conflict" in line


@pytest.mark.parametrize(
    ("command", "line"),
    [
        (
            ["agent", "bench", "--config-small", "-n", "9000"],
            "--n-gen item 1: generation length 9000 is above the limit of 8192",
        ),
        (
            ["agent", "bench", "--config-small", "-p", "16,-4"],
            "--n-prompt item 2: prompt length -4 must be 0 or more",
        ),
        (
            ["coordinator", "benchmark", "--config-small", "-r", "0"],
            "--repetitions: 0 must be at least 1",
        ),
        (
            ["coordinator", "benchmark", "--config-small", "--batch-sizes", "1,2000"],
            "--batch-sizes item 2: batch size 2000 is above the limit of 1024",
        ),
    ],
)
def test_a_matrix_beyond_a_limit_is_one_line_naming_the_field(
    command: list[str], line: str
) -> None:
    """The CLI tells the matrix's words (each names the wire field first: docs/protocol.md §5,
    The matrix) by the option that sets the field (shared.io.options.as_flags), the item
    counted from 1, then the value and the limit in words."""
    assert refusal(*command) == f"error: {line}"


@pytest.mark.slow
def test_a_name_dns_cannot_resolve_says_so() -> None:
    assert resolve_error("127.0.0.1:5555") is None and resolve_error("localhost:5555") is None
    assert resolve_error("[::1]:5555") is None
    assert (resolve_error("no-such-host.invalid:5555") or "").startswith(
        "cannot resolve host no-such-host.invalid: "
    )
    for security in (["--insecure"], []):  # with CURVE, before asking for a key it lacks
        result = run_cli(
            "coordinator", "status", "--hosts", "no-such-host.invalid:5555", *security, "-o", "json"
        )
        assert result.returncode == 1  # documented: a host failed
        assert "cannot resolve host no-such-host.invalid" in result.stdout
        assert "connection refused" not in result.stdout
        assert "no server key" not in result.stdout
