"""`coordinator keys`: this coordinator's CURVE key, and the agents' keys it expects."""

from __future__ import annotations

from typing import Annotated

import typer

from coordinator.keys import add_host_key
from shared.io.cli import data_home, err, usage_error
from shared.io.keys import own_keypair
from shared.io.options import TAKES_A_KEY

keys_app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    help="This coordinator's CURVE key and the agents' keys it expects.",
)


@keys_app.callback()
def keys_entry() -> None:
    """Every keys command reads or writes the data dir: checked once, before any."""
    data_home()


@keys_app.command("show")
def keys_show() -> None:
    """Print this coordinator's public key alone (give it to `agent keys trust`)."""
    print(own_keypair().public)


@keys_app.command("add", context_settings=TAKES_A_KEY)
def keys_add(
    address: Annotated[
        str, typer.Argument(help="HOST[:PORT] of the agent (port 5555 by default).")
    ],
    key: Annotated[str, typer.Argument(help="The agent's public key (`agent keys show`).")],
) -> None:
    """Expect KEY from the agent at HOST[:PORT]: the coordinator refuses any other."""
    try:
        stored = add_host_key(address, key)
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    err.print(f"{stored}: server key {key}", highlight=False, markup=False)
