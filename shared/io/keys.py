"""This side's CURVE keypair: one per data directory, made on first use, the secret never
readable by anyone else.

Files are ZeroMQ certificates (the format `zmq.auth.load_certificate` reads) under
`data_dir()/keys`: `self.key` (public, PUBLIC_MODE: it may be read, never written, by others,
whatever the umask) and `self.key_secret` (mode 0600, written that way from the start, never
chmod-ed after the fact). Trusted keys (shared.io.trust) are 0600 too.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

from shared.io.files import replace_atomically, write_private
from shared.io.paths import data_dir

SELF_NAME = "self"
CURVE_KEY_LENGTH = 40
PUBLIC_MODE = 0o644
"""`self.key`'s mode (less what the umask takes): README, "Data": a public key may be read."""


@dataclass(frozen=True)
class Keypair:
    """Z85 text, as `zmq.curve_keypair()` makes and `curve_*key` socket options accept."""

    public: str
    secret: str


def keys_dir() -> Path:
    """data_dir()/keys, private to this user (0700)."""
    path = data_dir() / "keys"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def certificate_text(
    public: str, secret: str | None = None, name: str | None = None, peer: str | None = None
) -> str:
    kind = "**Secret**" if secret else "Public"
    lines = [
        f"#   ****  Generated on {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC by "
        "mlx-fleet  ****",
        f"#   ZeroMQ CURVE {kind} Certificate",
        "",
        "metadata",
    ]
    if name:
        lines.append(f'    name = "{name}"')
    if peer:
        lines.append(f'    peer = "{peer}"')
    lines += ["curve", f'    public-key = "{public}"']
    if secret:
        lines.append(f'    secret-key = "{secret}"')
    return "\n".join(lines) + "\n"


def new_keypair() -> tuple[str, str]:
    """A fresh CURVE keypair whose public key never starts with '-' (a Z85 character), so it
    can be passed to `agent keys trust KEY` without being read as an option."""
    while True:
        public, secret = (k.decode("ascii") for k in zmq.curve_keypair())
        if not public.startswith("-"):
            return public, secret


def existing_keypair() -> Keypair | None:
    """This side's keypair if one was ever made, without making one (for dry runs)."""
    directory = data_dir(create=False) / "keys"
    return own_keypair(directory) if (directory / f"{SELF_NAME}.key_secret").exists() else None


def own_keypair(directory: Path | None = None) -> Keypair:
    """This side's keypair, created on first use. Two processes racing to create it end up
    with the same one: the secret file is linked into place exclusively; the loser reads it."""
    directory = directory or keys_dir()
    secret_path = directory / f"{SELF_NAME}.key_secret"
    if not secret_path.exists():
        public, secret = new_keypair()
        try:
            write_private(secret_path, certificate_text(public, secret))
        except FileExistsError:
            pass
        else:
            public_path = directory / f"{SELF_NAME}.key"
            replace_atomically(public_path, certificate_text(public), PUBLIC_MODE)
    public_b, secret_b = zmq.auth.load_certificate(secret_path)
    if secret_b is None:
        raise ValueError(f"{secret_path} holds no secret key")
    return Keypair(public_b.decode("ascii"), secret_b.decode("ascii"))


def check_key(key: object) -> str:
    """A CURVE public key in Z85 text: 40 characters that decode to 32 bytes; ValueError
    saying what is wrong otherwise."""
    if not isinstance(key, str) or len(key) != CURVE_KEY_LENGTH:
        length = f"{len(key)} characters" if isinstance(key, str) else type(key).__name__
        raise ValueError(
            f"bad key length ({length}): a CURVE public key is {CURVE_KEY_LENGTH} Z85 characters"
        )
    try:
        z85.decode(key)
    except (KeyError, struct.error, ValueError) as exc:
        raise ValueError(f"bad key {key!r}: not Z85 text") from exc
    return key
