"""The top of `agent` and `coordinator`: a Typer app whose commands are imported only when one
is run (or its own --help is asked for), so `--help`, `--version` and every command pay for the
imports they use and no others: `coordinator status` never imports MLX, and `agent --help`
imports neither MLX nor ZeroMQ.

The list in `--help` comes from each command's summary, written beside its import path;
tests/test_lazy_cli.py keeps every summary equal to its command's docstring. Each command's
`--help` ends with its examples (written there too), `-h` is `--help` everywhere, and shell
completion (Typer's `--install-completion`) names the commands from the same list, importing
none of them.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from difflib import get_close_matches
from typing import Any, ClassVar

import typer
from typer.core import TyperCommand, TyperGroup
from typer.core import _click as click

from shared.exit_codes import SUMMARY
from shared.io.paths import DataDirError


@dataclass(frozen=True)
class LazyCommand:
    """A command by import path: `target` is "module:attribute", a command function or a
    typer.Typer (a group of commands); `summary` is its docstring's first paragraph."""

    name: str
    target: str
    summary: str
    context_settings: dict[str, Any] = field(default_factory=dict)
    examples: tuple[str, ...] = ()
    """Command lines shown under "Examples:" at the end of the command's --help."""
    note: str = ""
    """A paragraph of the --help before the examples."""

    def load(self) -> Any:
        """The click command: the module is imported now."""
        module, attribute = self.target.split(":")
        found = getattr(importlib.import_module(module), attribute)
        if isinstance(found, typer.Typer):
            command = typer.main.get_group(found)
            command.name = self.name
        else:
            single = typer.Typer(add_completion=False, rich_markup_mode=None)
            settings = HELP_OPTIONS | self.context_settings
            single.command(self.name, context_settings=settings)(found)
            command = typer.main.get_command(single)
        if self.examples:
            command.epilog = examples(*self.examples)
        if self.note:
            command.epilog = f"{self.note}\n\n{command.epilog or ''}".strip()
        capital_placeholders(command)
        return command


MATRIX_NAMES = (
    "The short names are llama-bench's: -n is its -n, tokens generated (mlx_lm.benchmark's -g; "
    "its -n, trials, is -r here), and -b is mlx_lm.benchmark's batch size in sequences, not "
    "llama-bench's -b (n_batch, which is --prefill-step-size here)."
)
"""The note in `agent bench --help` and `coordinator benchmark --help` on what -n and -b mean
to users of llama-bench and of mlx_lm.benchmark."""

HELP_OPTIONS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}
"""context_settings giving every command and group `-h` as well as `--help` (a subcommand's
context inherits its parent's)."""


def command_group(summary: str, **settings: Any) -> typer.Typer:
    """A group of commands as every one of ours is made: `summary` as its --help, plain text
    (no Rich markup), `-h` too (HELP_OPTIONS), no shell completion unless `settings` (Typer's
    own) asks."""
    return typer.Typer(
        help=summary,
        rich_markup_mode=None,
        context_settings=HELP_OPTIONS,
        **{"add_completion": False, **settings},
    )


KEY_LENGTH = 40
"""Characters of a CURVE public key in Z85."""


class TakesAKey(TyperCommand):
    """A command with a CURVE key argument (with shared.io.options.TAKES_A_KEY): a Z85 key may
    start with '-' and hold any letter, `h` and `o` included, which Click would read as a
    cluster of short options (`-h` showing the help). A 40-character word starting with '-'
    is handed on as an argument whole, after `--`."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        keys = [word for word in args if len(word) == KEY_LENGTH and word.startswith("-")]
        if keys and "--" not in args:
            args = [word for word in args if word not in keys] + ["--", *keys]
        return super().parse_args(ctx, args)


def examples(*lines: str) -> str:
    """An epilog listing `lines` under "Examples:", each kept on its own line (Click's \\b
    marker: never rewrapped). Each is a real command line; keep it within 74 columns, so that
    the help stays within 80."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def capital_placeholders(command: Any) -> None:
    """Show `command`'s arguments (and its subcommands', for a group) in capitals in usage
    lines and messages: `RUN`, `[RUN]`, `CMD...`, where Typer writes `{run}`."""
    for param in getattr(command, "params", []):
        if param.param_type_name != "argument":
            continue
        if param.metavar is None:
            param.metavar = param.name.upper()
        usage = param.metavar if param.required else f"[{param.metavar}]"
        dots = "..." if param.nargs != 1 and not param.metavar.endswith("...") else ""
        param.get_usage_pieces = lambda ctx, shown=usage + dots: [shown]
    for sub in getattr(command, "commands", {}).values():
        capital_placeholders(sub)


UsageError: type[Exception] = typer.BadParameter.__bases__[0]
"""Click's UsageError as the installed Typer raises it (Typer 0.2x carries its own Click)."""
NoArgsIsHelp = getattr(sys.modules[UsageError.__module__], "NoArgsIsHelpError", ())
"""The "error" a group given no command raises to show its help: kept as it is."""


def one_line(exc: Any) -> Exception:
    """`error: MESSAGE (COMMAND --help lists them)` on stderr, and the exit (2) to raise; the
    help a command shows when given nothing goes through as it is."""
    if isinstance(exc, NoArgsIsHelp):
        return exc
    from shared.io.cli import usage_error  # only once there is an error to print

    where = f" (`{exc.ctx.command_path} --help` lists them)" if exc.ctx is not None else ""
    message = " ".join(exc.format_message().split())
    return usage_error(f"{message}{where}")


class LazyGroup(TyperGroup):
    """A TyperGroup that imports a command's module the first time the command is needed.
    Its usage errors (an unknown option or command, a missing or bad value), its own and every
    subcommand's, are one line naming the option, exit 2, as every other bad input is: Click's
    own are a usage line, a hint and the message."""

    lazy: ClassVar[dict[str, LazyCommand]] = {}

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except UsageError as exc:
            raise one_line(exc) from None

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            raise one_line(exc) from None
        except DataDirError as exc:  # a command that met the data dir before data_home() did
            from shared.io.cli import usage_error

            raise usage_error(str(exc)) from None

    def list_commands(self, ctx: Any) -> list[str]:
        return [*self.commands, *(name for name in self.lazy if name not in self.commands)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self.commands[cmd_name] = self.lazy[cmd_name].load()
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """As Typer does, with its "Did you mean" among every command, loaded or not."""
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            matches = get_close_matches(name, self.list_commands(ctx))
            hint = f". Did you mean {', '.join(map(repr, matches))}?" if matches else "."
            ctx.fail(f"No such command {name!r}{hint}")
        return super().resolve_command(ctx, args)

    def summary_of(self, name: str, limit: int = 45) -> str:
        """A command's one-line help, from its summary unless it is loaded already."""
        if name in self.lazy and name not in self.commands:
            return TyperCommand(name, help=self.lazy[name].summary).get_short_help_str(limit)
        return self.commands[name].get_short_help_str(limit)

    def shell_complete(self, ctx: Any, incomplete: str) -> list[Any]:
        """Shell completion of a command name (and of this group's options), from the summaries:
        completing `coordinator st` imports no command."""
        from typer._click.shell_completion import CompletionItem

        results = [
            CompletionItem(name, help=self.summary_of(name))
            for name in self.list_commands(ctx)
            if name.startswith(incomplete)
        ]
        return results + click.Command.shell_complete(self, ctx, incomplete)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The command list from the summaries, importing nothing."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, self.summary_of(name, limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def fleet_app(
    program: str, summary: str, commands: list[LazyCommand], shown: tuple[str, ...] = ()
) -> typer.Typer:
    """A top-level CLI of lazily imported `commands`: plain rewrapped --help ending with the
    `shown` examples and the exit codes, --version, -h, Typer's shell completion
    (--install-completion, --show-completion), and usage errors on one line."""
    group = type(f"{program.title()}Group", (LazyGroup,), {"lazy": {c.name: c for c in commands}})
    app = command_group(
        summary,
        cls=group,
        no_args_is_help=True,
        add_completion=True,
        epilog=f"{examples(*shown)}\n\n{SUMMARY}" if shown else SUMMARY,
    )

    def show_version(value: bool) -> None:
        if value:
            from importlib import metadata

            print(f"mlx-fleet {program} {metadata.version('mlx-fleet')}")
            raise typer.Exit()

    @app.callback()
    def options(  # the option's default names a local: it cannot be a string annotation
        version: bool = typer.Option(
            False,
            "--version",
            callback=show_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ) -> None:
        pass

    return app
