"""HOST:PORT as every listening option takes it (`agent serve --bind`, `--prometheus`): one rule
for what is well formed, and one way of saying what is not."""

from __future__ import annotations


def host_port(text: str, what: str, example: str) -> tuple[str, int]:
    """'HOST:PORT' -> (HOST as written, an IPv6 one in brackets, PORT); ValueError without a
    host, or with a port that is not 0 to 65535: `bad WHAT 'TEXT': expected HOST:PORT, e.g.
    EXAMPLE`."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"bad {what} {text!r}: expected HOST:PORT, e.g. {example}")
    return host, int(port)
