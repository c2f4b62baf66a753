"""`agent keys` and `coordinator keys` made one way: both sides keep a CURVE keypair and show its
public half alike; what each keeps of its peers' keys differs, so each side adds those commands
itself (agent/commands/keys.py, coordinator/commands/keys.py)."""

from __future__ import annotations

import typer

from shared.io.app import command_group, examples
from shared.io.cli import data_home


def keys_group(summary: str, show_help: str, show_examples: tuple[str, ...]) -> typer.Typer:
    """`agent keys` and `coordinator keys`: the group, the data dir checked once before any of
    its commands, and `show`, this side's public key alone; each side adds the commands on the
    keys it keeps (an agent's trusted coordinators, a coordinator's known agents)."""
    group = command_group(summary, no_args_is_help=True)

    @group.callback()
    def keys_entry() -> None:
        """Every keys command reads or writes the data dir: checked once, before any."""
        data_home()

    @group.command("show", help=show_help, epilog=examples(*show_examples))
    def keys_show() -> None:
        from shared.io.keys import own_keypair  # ZeroMQ, for this command alone

        print(own_keypair().public)

    return group
