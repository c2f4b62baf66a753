"""`agent keys`: this agent's CURVE key and the coordinator keys it obeys."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from shared.exit_codes import EXIT_PARTIAL
from shared.io.app import TakesAKey, examples
from shared.io.cli import err, usage_error
from shared.io.keys_group import keys_group
from shared.io.options import TABLE_OR_JSON, TAKES_A_KEY, output_format
from shared.io.trust import TrustError, list_trusted, revoke, trust

keys_app = keys_group(
    "This agent's CURVE key and the coordinator keys it trusts.",
    "Print this agent's public key alone (give it to `coordinator keys add`).",
    ("agent keys show", 'coordinator keys add mac1 "$(ssh mac1 agent keys show)"'),
)

KeysFormat = output_format(
    TABLE_OR_JSON, "table (a line per key: name, key and a peer's address, tab-separated) or json."
)


@keys_app.command(
    "trust",
    context_settings=TAKES_A_KEY,
    cls=TakesAKey,
    epilog=examples(
        'agent keys trust "$(coordinator keys show)" --name laptop',
        'agent keys trust "$(ssh mac2 agent keys show)" --name mac2 --peer 10.0.0.2',
    ),
)
def keys_trust(
    key: Annotated[
        str, typer.Argument(help="A coordinator's public key (`coordinator keys show`).")
    ],
    name: Annotated[str | None, typer.Option("--name", help="A label for the key.")] = None,
    peer: Annotated[
        str | None,
        typer.Option(
            "--peer",
            metavar="HOST[:PORT]",
            help="KEY is the agent serving at HOST: ranks of a distributed job on both Macs "
            "tell each other's agents of pauses and stops (port: this agent's by default).",
        ),
    ] = None,
) -> None:
    """Let the coordinator holding KEY drive this agent, or, with --peer, the agent of
    another Mac of the lab exchange gang states with it (a running agent sees it at once)."""
    try:
        entry = trust(key, name, peer=peer)
    except TrustError as exc:
        raise usage_error(str(exc)) from None
    as_peer = f", the agent at {entry.peer}" if entry.peer else ""
    err.print(f"trusted {entry.key} as {entry.name}{as_peer}", highlight=False, markup=False)


@keys_app.command("list", epilog=examples("agent keys list", "agent keys list -o json"))
def keys_list(fmt: KeysFormat = "table") -> None:
    """The trusted keys: name and key, one per line (and the address of a peer agent's)."""
    entries = list_trusted()
    if not entries:
        err.print("no coordinator key is trusted yet: `agent keys trust KEY`", highlight=False)
    if fmt == "json":
        shown = [{"name": e.name, "key": e.key, "peer": e.peer} for e in entries]
        sys.stdout.write(json.dumps(shown, indent=2) + "\n")
        return
    for entry in entries:
        print(f"{entry.name}\t{entry.key}" + (f"\t{entry.peer}" if entry.peer else ""))


@keys_app.command(
    "revoke",
    context_settings=TAKES_A_KEY,
    cls=TakesAKey,
    epilog=examples("agent keys revoke laptop", 'agent keys revoke "$(coordinator keys show)"'),
)
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
