"""The habits users bring from llama-bench, mlx_lm and every other CLI: `-h`, examples in every
`--help`, one format option (`-o/--output-format`, `--format` an alias) that refuses what a
command cannot print, Typer's shell completion (lazy: completing imports no command), usage
placeholders in capitals, and `coordinator keys list|remove`. The real apps, and the real
console scripts in subprocesses where a process is what is checked."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.testing
import zmq

from agent.cli import app as agent_app
from coordinator.cli import app as coordinator_app
from shared.io.keys import new_keypair
from tests.conftest import console_script, subprocess_env
from tests.fleet_support import cli

pytestmark = pytest.mark.timeout(300)

APPS = {"agent": agent_app, "coordinator": coordinator_app}
click = typer.core._click  # the Click the installed Typer carries


def walk(program: str) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command and group of `program`: (its path after the program name, the command)."""
    top = typer.main.get_command(APPS[program])

    def under(path: tuple[str, ...], command: Any) -> Iterator[tuple[tuple[str, ...], Any]]:
        yield path, command
        for name in getattr(command, "list_commands", lambda ctx: [])(None):
            yield from under((*path, name), command.get_command(None, name))

    yield from under((), top)


COMMANDS = [(program, path, command) for program in APPS for path, command in walk(program)]
IDS = [" ".join((program, *path)) for program, path, _ in COMMANDS]
FORMATTED = [
    (program, path, command)
    for program, path, command in COMMANDS
    if any("-o" in getattr(param, "opts", ()) for param in command.params)
]


def invoke(program: str, *args: str) -> Any:
    """The real app run in this process at 80 columns, stderr apart."""
    runner = typer.testing.CliRunner()
    return runner.invoke(APPS[program], list(args), terminal_width=80, prog_name=program)


def test_every_command_and_group_is_listed() -> None:
    assert len(COMMANDS) >= 2 + 9 + 13 + 4 + 4  # both programs, their commands, keys's commands
    assert {"coordinator keys list", "coordinator keys remove", "agent keys list"} <= set(IDS)


@pytest.mark.parametrize(("program", "path", "command"), COMMANDS, ids=IDS)
def test_every_help_takes_h_ends_with_examples_and_fits_80_columns(
    program: str, path: tuple[str, ...], command: Any
) -> None:
    short = invoke(program, *path, "-h")
    assert short.exit_code == 0, short.output
    assert short.stdout == invoke(program, *path, "--help").stdout
    text = short.stdout
    assert "\nExamples:\n" in text or "\n  Examples:\n" in text, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    usage = text.splitlines()[0]
    assert usage.startswith(f"Usage: {' '.join((program, *path))} [OPTIONS]"), usage
    shown = usage.split("[OPTIONS]", 1)[1].split()
    placeholder = re.compile(r"\[?[A-Z][A-Z_]*\]?(\.\.\.)?|\[ARGS\]\.\.\.")
    assert all(placeholder.fullmatch(word) for word in shown), usage


def example_lines(text: str) -> list[str]:
    """The command lines under "Examples:" in a --help."""
    lines = text.split("Examples:\n", 1)[1].splitlines()
    found = []
    for line in lines:
        if not line.startswith("    "):
            break
        found.append(line.strip())
    return found


@pytest.mark.parametrize(("program", "path", "command"), COMMANDS, ids=IDS)
def test_every_example_parses_as_the_real_command_line(
    program: str, path: tuple[str, ...], command: Any
) -> None:
    """Each example of our own programs names real commands, real options and values they
    take: parsed by the real command (its checks run), nothing run."""
    examples = example_lines(invoke(program, *path, "-h").stdout)
    assert examples
    parsed = 0
    for line in examples:
        words = shlex.split(line.split("#")[0].split("|")[0])
        while words and words[0] not in APPS:  # `ssh mac1 agent keys show`
            words.pop(0)
        if not words or len(words) < 2 or words[1].startswith("-") or "-h" in words:
            continue  # the program's own options (--install-completion) act when parsed
        words = [w if "$(" not in w else new_keypair()[0] for w in words]
        group = typer.main.get_command(APPS[words[0]])
        ctx = click.core.Context(group, info_name=words[0])
        rest = words[1:]
        target = group
        while hasattr(target, "resolve_command"):
            name, target, rest = target.resolve_command(ctx, rest)
            ctx = click.core.Context(target, info_name=name, parent=ctx)
        target.make_context(ctx.info_name, rest, parent=ctx.parent)
        parsed += 1
    assert parsed or path == (), examples


def test_agent_bench_and_coordinator_benchmark_say_what_n_and_b_mean() -> None:
    for program, name in (("agent", "bench"), ("coordinator", "benchmark")):
        text = " ".join(invoke(program, name, "-h").stdout.split())
        assert "-n is its -n, tokens generated" in text
        assert "not llama-bench's -b (n_batch, which is --prefill-step-size here)" in text
        assert "not with --bits 4/8 on MLX's CPU backend" in text


def test_mlx_lm_benchmarks_long_names_are_aliases() -> None:
    bench = typer.main.get_command(agent_app).get_command(None, "bench")  # type: ignore[attr-defined]
    ctx = bench.make_context(
        "bench",
        ["--prompt-tokens", "64", "--generation-tokens", "8", "--num-trials", "3"]
        + ["--batch-size", "2", "--prefill-step-size", "256", "--delay", "1"],
    )
    given = {key: ctx.params[key] for key in ("n_prompt", "n_gen", "repetitions", "batch_sizes")}
    assert given == {"n_prompt": "64", "n_gen": "8", "repetitions": "3", "batch_sizes": "2"}
    assert (ctx.params["prefill_step_size"], ctx.params["delay"]) == (256, 1.0)


FORMAT_ARGS = {
    ("show",): ["r-1"],
    ("compare",): ["r-1", "r-2"],
    ("resume",): ["r-1"],
    ("export",): ["r-1"],
    ("verify",): ["r-1.bundle.json"],
    ("canary",): ["--split", "macos"],
    ("stage",): ["org/model"],
}
"""Arguments a command needs before its options are read (positionals, a required option)."""
FORMAT_IDS = [" ".join((program, *path)) for program, path, _ in FORMATTED]


@pytest.mark.parametrize(("program", "path", "command"), FORMATTED, ids=FORMAT_IDS)
def test_one_format_option_everywhere_refusing_what_it_cannot_print(
    program: str, path: tuple[str, ...], command: Any
) -> None:
    option = next(p for p in command.params if "-o" in p.opts)
    assert option.opts == ["-o", "--output-format", "--format"] and option.secondary_opts == []
    args = FORMAT_ARGS.get(path, [])
    for flag in ("-o", "--output-format", "--format"):
        ctx = command.make_context(path[-1], [*args, flag, "json"])
        assert ctx.params[option.name] == "json"
    refused = invoke(program, *path, *args, "-o", "xml")
    assert refused.exit_code == 2, refused.output
    assert refused.stdout == ""
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown format 'xml'; choose from")


def test_monitor_refuses_a_format_it_cannot_print_in_a_real_process() -> None:
    done = cli("coordinator", "monitor", "--hosts", "127.0.0.1:9", "--format", "xml")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == "error: unknown format 'xml'; choose from table, json"
    bench = cli("agent", "bench", "--config-small", "-o", "yaml")
    assert bench.returncode == 2
    assert bench.stderr.strip().splitlines() == [
        "error: unknown format 'yaml'; choose from table, md, csv, json, jsonl, sql, llama-json"
    ]


def test_o_json_and_format_json_print_the_same_in_real_processes() -> None:
    for flag in ("-o", "--output-format", "--format"):
        runs = cli("coordinator", "runs", flag, "json")
        assert runs.returncode == 0, runs.stderr
        assert json.loads(runs.stdout) == []


PROBE = """
import json, sys
sys.argv = [{program!r}]
from {program}.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def complete(program: str, line: str) -> tuple[list[str], set[str]]:
    """Bash completion of `line` as Typer's script asks for it, in a fresh interpreter: the
    words offered and the modules it imported."""
    words = line.split() + ([""] if line.endswith(" ") else [])
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(program=program)],
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(
            **{
                f"_{program.upper()}_COMPLETE": "complete_bash",
                "COMP_WORDS": line,
                "COMP_CWORD": str(len(words) - 1),
            }
        ),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split(), set(json.loads(done.stderr.splitlines()[-1]))


@pytest.mark.parametrize("program", APPS)
def test_completion_names_every_command_importing_none(program: str) -> None:
    offered, modules = complete(program, f"{program} ")
    top = typer.main.get_command(APPS[program])
    assert offered[: len(top.list_commands(None))] == top.list_commands(None)  # type: ignore[attr-defined]
    assert not {m for m in modules if m.startswith(f"{program}.commands.")}
    assert "mlx" not in modules and "zmq" not in modules


def test_completion_of_a_prefix_a_group_and_an_option() -> None:
    assert complete("coordinator", "coordinator st")[0] == ["status", "stage"]
    assert complete("coordinator", "coordinator keys ")[0] == ["show", "add", "list", "remove"]
    offered, modules = complete("agent", "agent keys li")
    assert offered == ["list"] and "agent.commands.bench" not in modules
    assert "--output-format" in complete("coordinator", "coordinator runs --out")[0]


@pytest.mark.parametrize("program", APPS)
def test_the_completion_script_is_typers_for_the_console_script(program: str) -> None:
    script = subprocess.run(
        [console_script(program), "--show-completion"],
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(SHELL="/bin/bash"),
    )
    assert script.returncode == 0, script.stderr
    assert f"_{program.upper()}_COMPLETE=complete_bash" in script.stdout
    assert "--install-completion" in cli(program, "-h").stdout


@pytest.mark.slow
def test_coordinator_keys_list_and_remove_on_a_real_data_dir(fleet_home: Path) -> None:
    key = new_keypair()[0]
    assert cli("coordinator", "keys", "add", "mac1", key).returncode == 0
    assert cli("coordinator", "keys", "add", "10.0.0.2:6000", new_keypair()[0]).returncode == 0
    listed = cli("coordinator", "keys", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1] == f"mac1:5555\t{key}"
    as_json = json.loads(cli("coordinator", "keys", "list", "--format", "json").stdout)
    assert [entry["host"] for entry in as_json] == ["10.0.0.2:6000", "mac1:5555"]
    assert as_json[1]["key"] == key

    removed = cli("coordinator", "keys", "remove", "mac1")
    assert removed.returncode == 0 and "removed the key of mac1:5555" in removed.stderr
    left = json.loads(cli("coordinator", "keys", "list", "-o", "json").stdout)
    assert [entry["host"] for entry in left] == ["10.0.0.2:6000"]
    again = cli("coordinator", "keys", "remove", "mac1")
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.strip().splitlines() == [
        "error: no agent key is stored for 'mac1' (`coordinator keys list` lists them)"
    ]
    bad = cli("coordinator", "keys", "remove", "no such:host")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert cli("coordinator", "keys", "remove", "10.0.0.2:6000").returncode == 0
    empty = cli("coordinator", "keys", "list", "-o", "json")
    assert empty.returncode == 0 and json.loads(empty.stdout) == []
    assert "no agent key is stored yet" in empty.stderr


@pytest.mark.slow
def test_coordinator_keys_on_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    home = tmp_path / "a-file"
    home.write_text("not a folder\n")
    for args in (("list",), ("remove", "mac1")):
        done = cli("coordinator", "keys", *args, home=home)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.slow
def test_agent_keys_list_as_json(fleet_home: Path) -> None:
    key = new_keypair()[0]
    assert cli("agent", "keys", "trust", key, "--name", "laptop").returncode == 0
    listed = json.loads(cli("agent", "keys", "list", "-o", "json").stdout)
    assert listed == [{"name": "laptop", "key": key, "peer": None}]
    assert cli("agent", "keys", "list").stdout == f"laptop\t{key}\n"


@pytest.mark.slow
def test_a_key_starting_with_a_dash_is_a_key_even_holding_h(fleet_home: Path) -> None:
    """`-h` is a short option now: a key such as `-h...` or `-xoh...` is still a key."""
    key = next(
        public
        for public in iter(lambda: zmq.curve_keypair()[0].decode(), None)
        if public.startswith("-") and "h" in public
    )
    trusted = cli("agent", "keys", "trust", key, "--name", "dashing")
    assert trusted.returncode == 0, trusted.stderr
    assert cli("agent", "keys", "list").stdout == f"dashing\t{key}\n"
    added = cli("coordinator", "keys", "add", "mac1", key)
    assert added.returncode == 0, added.stderr
    assert cli("coordinator", "keys", "list").stdout == f"mac1:5555\t{key}\n"
    assert cli("agent", "keys", "revoke", key).returncode == 0
    assert cli("agent", "keys", "trust", "-h").stdout.startswith("Usage: agent keys trust")
