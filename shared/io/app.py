"""The top of `agent` and `coordinator`: a Typer app whose commands are imported only when one
is run (or its own --help is asked for), so `--help`, `--version` and every command pay for the
imports they use and no others: `coordinator status` never imports MLX, and `agent --help`
imports neither MLX nor ZeroMQ.

The list in `--help` comes from each command's summary, written beside its import path;
tests/test_lazy_cli.py keeps every summary equal to its command's docstring.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from difflib import get_close_matches
from typing import Any, ClassVar

import typer
from typer.core import TyperCommand, TyperGroup

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

    def load(self) -> Any:
        """The click command: the module is imported now."""
        module, attribute = self.target.split(":")
        found = getattr(importlib.import_module(module), attribute)
        if isinstance(found, typer.Typer):
            group = typer.main.get_group(found)
            group.name = self.name
            return group
        single = typer.Typer(add_completion=False, rich_markup_mode=None)
        single.command(self.name, context_settings=self.context_settings or None)(found)
        return typer.main.get_command(single)


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

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The command list from the summaries, importing nothing."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [
            (name, TyperCommand(name, help=self.lazy[name].summary).get_short_help_str(limit))
            if name in self.lazy and name not in self.commands
            else (name, self.commands[name].get_short_help_str(limit))
            for name in names
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def fleet_app(program: str, summary: str, commands: list[LazyCommand]) -> typer.Typer:
    """A top-level CLI of lazily imported `commands`: plain rewrapped --help ending with the
    exit codes, --version, and usage errors on one line."""
    group = type(f"{program.title()}Group", (LazyGroup,), {"lazy": {c.name: c for c in commands}})
    app = typer.Typer(
        cls=group,
        help=summary,
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
        epilog=SUMMARY,
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
