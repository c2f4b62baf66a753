"""`coordinator`: drives the fleet and keeps every run in its store.

Exit codes: 0 ok, 1 partial failure (a host or cell failed), 2 usage error, 130 interrupted.
"""

from __future__ import annotations

from importlib import metadata

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False)


def print_version(value: bool) -> None:
    if value:
        print(f"mlx-fleet coordinator {metadata.version('mlx-fleet')}")
        raise typer.Exit()


@app.callback()
def coordinator_options(
    version: bool = typer.Option(False, "--version", callback=print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """mlx-fleet coordinator: one benchmark across many Macs, one table, every run kept."""


def main() -> None:
    app()
