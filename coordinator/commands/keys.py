"""`coordinator keys`: this coordinator's CURVE key, and the agents' keys it expects."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from coordinator.hosts.keys import add_host_key, known_hosts, remove_host_key
from shared.io.app import TakesAKey, examples
from shared.io.cli import err, usage_error
from shared.io.keys_group import keys_group
from shared.io.options import TABLE_OR_JSON, TAKES_A_KEY, output_format

keys_app = keys_group(
    "This coordinator's CURVE key and the agents' keys it expects.",
    "Print this coordinator's public key alone (give it to `agent keys trust`).",
    ("coordinator keys show", 'ssh mac1 agent keys trust "$(coordinator keys show)" --name laptop'),
)

KeysFormat = output_format(
    TABLE_OR_JSON, "table (a line per agent: HOST:PORT and key, tab-separated) or json."
)


@keys_app.command(
    "add",
    context_settings=TAKES_A_KEY,
    cls=TakesAKey,
    epilog=examples(
        'coordinator keys add mac1 "$(ssh mac1 agent keys show)"',
        'coordinator keys add 10.0.0.2:6000 "$(ssh mac2 agent keys show)"',
    ),
)
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


def stored_keys() -> dict[str, str]:
    """The agents' keys stored by `coordinator keys add`, or exit 2 naming what is wrong."""
    try:
        return known_hosts()
    except ValueError as exc:
        raise usage_error(str(exc)) from None


@keys_app.command(
    "list",
    epilog=examples("coordinator keys list", "coordinator keys list -o json"),
)
def keys_list(fmt: KeysFormat = "table") -> None:
    """The agents' keys this coordinator expects: HOST:PORT and key, one per line (a
    hostfile's `key` field, not listed here, wins for its host)."""
    hosts = stored_keys()
    if not hosts:
        err.print(
            "no agent key is stored yet: `coordinator keys add HOST[:PORT] KEY`",
            highlight=False,
            markup=False,
        )
    if fmt == "json":
        entries = [{"host": host, "key": key} for host, key in sorted(hosts.items())]
        sys.stdout.write(json.dumps(entries, indent=2) + "\n")
        return
    for host, key in sorted(hosts.items()):
        print(f"{host}\t{key}")


@keys_app.command(
    "remove",
    epilog=examples("coordinator keys remove mac1", "coordinator keys remove 10.0.0.2:6000"),
)
def keys_remove(
    address: Annotated[
        str, typer.Argument(help="HOST[:PORT] of the agent (port 5555 by default).")
    ],
) -> None:
    """Forget the key expected from the agent at HOST[:PORT]: the coordinator then refuses
    to talk to it (without --insecure) until `coordinator keys add` stores one again."""
    stored_keys()  # a hosts.json that cannot be read is one line, as for `list`
    try:
        removed = remove_host_key(address)
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    if removed is None:
        raise usage_error(
            f"no agent key is stored for {address!r} (`coordinator keys list` lists them)"
        )
    err.print(f"removed the key of {removed}", highlight=False, markup=False)
