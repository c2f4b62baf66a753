"""Which coordinators an agent obeys: one public certificate per trusted key in
`data_dir()/keys/trusted/<name>.key`.

The directory is the whole truth: `agent keys trust/revoke` edit it from another process and a
running daemon reads it on every handshake (agent.daemon.zap). Shared because the coordinator writes
its own key into the embedded agent's trust list before starting it.
"""

from __future__ import annotations

import hashlib
import logging
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq.auth

from shared.io.files import write_private
from shared.io.keys import certificate_text, check_key, keys_dir

log = logging.getLogger("mlx_fleet.trust")
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class TrustError(ValueError):
    """A key or name that cannot be trusted or revoked; the message says why."""


PEER_PATTERN = re.compile(r"[A-Za-z0-9.:\[\]-]{1,64}")
"""A peer agent's address: a host name or IP, with an optional :PORT."""
_PEER_LINE = re.compile(r'^\s*peer\s*=\s*"([^"]*)"\s*$', re.MULTILINE)


@dataclass(frozen=True)
class TrustedKey:
    name: str
    key: str
    path: Path
    peer: str | None = None
    """For another agent of the lab: the address it serves at (HOST or HOST:PORT), where this
    agent's ranks of a distributed job find it (shared.cooling.gang); None for a coordinator."""


def trusted_dir() -> Path:
    path = keys_dir() / "trusted"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def default_name(key: str) -> str:
    """A stable file name for a key given without --name (Z85 has '/' and '.' in it)."""
    return "coordinator-" + hashlib.sha256(key.encode("ascii")).hexdigest()[:10]


def list_trusted(directory: Path | None = None) -> list[TrustedKey]:
    """Every trusted key by name; a certificate that cannot be read is logged and skipped."""
    directory = directory or trusted_dir()
    keys = []
    for path in sorted(directory.glob("*.key")):
        try:  # a revoke racing a handshake removes the file between the two reads
            public, _ = zmq.auth.load_certificate(path)
            peer = _PEER_LINE.search(path.read_text(encoding="utf-8", errors="replace"))
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable certificate %s: %s", path, exc)
            continue
        found = peer.group(1) if peer and PEER_PATTERN.fullmatch(peer.group(1)) else None
        keys.append(TrustedKey(path.stem, public.decode("ascii", "replace"), path, found))
    return keys


def peer_key(
    host: str, directory: Path | None = None, port: int | None = None
) -> TrustedKey | None:
    """The trusted agent key serving at `host` (and `port`, when given), if one was trusted as
    a peer: its HOST part is `host`, or, for a name (`coordinator deploy --hosts mac2` trusts
    `mac2:5555`), resolves to it (mlx.launch's hostfiles hold IPs); a PORT both name must be
    the same, so two agents of one Mac (or two namespaces behind one name) stay apart."""
    peers = [entry for entry in list_trusted(directory) if entry.peer is not None]

    def serves(entry: TrustedKey, same: Callable[[str], bool]) -> bool:
        entry_host, entry_port = split_peer(entry.peer or "")
        return same(entry_host) and (port is None or entry_port in (None, port))

    for same in (lambda name: name == host, lambda name: host in _addresses(name)):
        found = [entry for entry in peers if serves(entry, same)]
        if found:  # an entry naming the very port before one naming none
            return min(found, key=lambda entry: split_peer(entry.peer or "")[1] is None)
    return None


def _addresses(name: str) -> set[str]:
    try:
        return {info[4][0] for info in socket.getaddrinfo(name, None)}
    except (OSError, UnicodeError):
        return set()


def split_peer(peer: str) -> tuple[str, int | None]:
    """`10.0.0.2:6000` -> ("10.0.0.2", 6000); `[fe80::1]` -> ("fe80::1", None)."""
    if peer.startswith("["):
        host, _, rest = peer[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    host, sep, port = peer.rpartition(":")
    if sep and port.isdigit() and ":" not in host:
        return host, int(port)
    return peer, None


def trust(
    key: str, name: str | None = None, directory: Path | None = None, peer: str | None = None
) -> TrustedKey:
    """Trust `key` under `name` (in `directory`, by default this agent's), as the key of the
    peer agent at `peer` when given; trusting a key again renames it. Raises TrustError."""
    if peer is not None and not PEER_PATTERN.fullmatch(peer):
        raise TrustError(f"bad peer address {peer!r}: HOST or HOST:PORT")
    try:
        check_key(key)
    except ValueError as exc:
        raise TrustError(str(exc)) from None
    name = name or default_name(key)
    if not NAME_PATTERN.fullmatch(name):
        raise TrustError(
            f"bad name {name!r}: use letters, digits, '.', '_' and '-' "
            "(up to 64, starting with a letter or digit)"
        )
    directory = directory or trusted_dir()
    existing = list_trusted(directory)
    for entry in existing:
        if entry.name == name and entry.key != key:
            raise TrustError(
                f"name {name!r} is already used for key {entry.key}; revoke it "
                "first or choose another --name"
            )
    for entry in existing:
        if entry.key == key:
            entry.path.unlink()
    path = directory / f"{name}.key"
    write_private(path, certificate_text(key, name=name, peer=peer))
    return TrustedKey(name, key, path, peer)


def revoke(key_or_name: str) -> list[TrustedKey]:
    """Stop trusting a key (given as the key or its name); returns what was removed."""
    removed = [entry for entry in list_trusted() if key_or_name in (entry.key, entry.name)]
    for entry in removed:
        entry.path.unlink()
    return removed
