"""The agents' CURVE server keys this coordinator expects, by HOST:PORT.

Kept in `data_dir()/keys/hosts.json` (`{"mac1:5555": "<40 Z85 characters>"}`), written by
`coordinator keys add` and `coordinator keys remove`. A hostfile's `key` field takes precedence
for its host. Knowing the server key is what stops a coordinator from talking to an impostor.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from coordinator.hosts.hostfile import DEFAULT_AGENT_PORT, HostEntry, split_address
from shared.io.files import replace_atomically
from shared.io.keys import check_key, keys_dir


def hosts_path() -> Path:
    return keys_dir() / "hosts.json"


HOST_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,252}[A-Za-z0-9_])?")
"""A host name or an IPv4 address: letters, digits, '.', '-', '_' (as resolvers take them)."""


def normalize(address: str) -> str:
    """'mac1' -> 'mac1:5555': the one spelling keys are stored under. ValueError if bad."""
    host, port = split_address(address)
    if not HOST_NAME.fullmatch(host) and ":" not in host:  # an IPv6 address was checked
        raise ValueError(
            f"bad host {host!r}: a key is stored for one host (a name or an address), "
            "never a group or a pattern"
        )
    return HostEntry(host, DEFAULT_AGENT_PORT if port is None else port).address


def known_hosts() -> dict[str, str]:
    path = hosts_path()
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc}); fix or remove it") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of HOST:PORT -> key")
    return data


def add_host_key(address: str, key: str) -> str:
    """Remember `key` as the server key of `address`; returns the normalized address."""
    address = normalize(address)
    hosts = known_hosts() | {address: check_key(key)}
    replace_atomically(hosts_path(), json.dumps(hosts, indent=2, sort_keys=True) + "\n")
    return address


def remove_host_key(address: str) -> str | None:
    """Forget the key stored for `address`; returns the normalized address, or None when no
    key was stored for it. ValueError for an address that does not parse."""
    address = normalize(address)
    hosts = known_hosts()
    if hosts.pop(address, None) is None:
        return None
    replace_atomically(hosts_path(), json.dumps(hosts, indent=2, sort_keys=True) + "\n")
    return address


def server_key(entry: HostEntry) -> str | None:
    """The key to expect from `entry`: its own (hostfile), else the stored one."""
    return entry.key or known_hosts().get(entry.address)
