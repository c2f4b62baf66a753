"""`agent keys`: this agent's CURVE key and the coordinator keys it obeys."""

from __future__ import annotations

from typing import Annotated

import typer

from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import err, usage_error
from shared.io.keys import own_keypair
from shared.io.options import TAKES_A_KEY
from shared.io.trust import TrustError, list_trusted, revoke, trust

keys_app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    help="This agent's CURVE key and the coordinator keys it trusts.",
)


@keys_app.command("show")
def keys_show() -> None:
    """Print this agent's public key alone (give it to `coordinator keys add`)."""
    print(own_keypair().public)


@keys_app.command("trust", context_settings=TAKES_A_KEY)
def keys_trust(
    key: Annotated[
        str, typer.Argument(help="A coordinator's public key (`coordinator keys show`).")
    ],
    name: Annotated[str | None, typer.Option("--name", help="A label for the key.")] = None,
) -> None:
    """Let the coordinator holding KEY drive this agent (a running agent sees it at once)."""
    try:
        entry = trust(key, name)
    except TrustError as exc:
        raise usage_error(str(exc)) from None
    err.print(f"trusted {entry.key} as {entry.name}", highlight=False, markup=False)


@keys_app.command("list")
def keys_list() -> None:
    """The trusted coordinator keys: name and key, one per line."""
    entries = list_trusted()
    if not entries:
        err.print("no coordinator key is trusted yet: `agent keys trust KEY`", highlight=False)
    for entry in entries:
        print(f"{entry.name}\t{entry.key}")


@keys_app.command("revoke", context_settings=TAKES_A_KEY)
def keys_revoke(
    key: Annotated[str, typer.Argument(help="The key, or the name it was trusted under.")],
) -> None:
    """Stop trusting a coordinator key: its next connection is refused (one already open
    lasts until it reconnects)."""
    removed = revoke(key)
    if not removed:
        err.print(f"no trusted key or name {key!r}", highlight=False, markup=False)
        raise typer.Exit(EXIT_PARTIAL)
    for entry in removed:
        err.print(f"revoked {entry.name} ({entry.key})", highlight=False, markup=False)
