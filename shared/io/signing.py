"""This coordinator's signing key for published runs (`coordinator publish`): Ed25519, kept
beside its CURVE key in data_dir()/keys, made on first use, the secret never readable by anyone
else (`publish.ed25519`, PEM, 0600). The `cryptography` package does the signing."""

from __future__ import annotations

import base64
import contextlib

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from shared.io.files import write_private
from shared.io.keys import keys_dir

SIGNING_KEY_NAME = "publish.ed25519"


def own_signing_key() -> Ed25519PrivateKey:
    """The signing key, created on first use; two processes racing to create it end up with
    the same one (write_private links the file into place exclusively; the loser reads it)."""
    path = keys_dir() / SIGNING_KEY_NAME
    if not path.exists():
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        with contextlib.suppress(FileExistsError):
            write_private(path, pem.decode("ascii"))
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} holds no Ed25519 key")
    return key


def public_text(key: Ed25519PrivateKey) -> str:
    """The public half as base64 of its 32 raw bytes, as a bundle names its signer."""
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")
