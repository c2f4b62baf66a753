"""HOST:PORT as every listening option takes it (`agent serve --bind`, `--prometheus`): one rule
for what is well formed; each caller names its own option when it is not."""

from __future__ import annotations


def split_host_port(text: str) -> tuple[str, int] | None:
    """'HOST:PORT' -> (HOST as written, an IPv6 one in brackets, PORT); None without a host, or
    with a port that is not 0 to 65535."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        return None
    return host, int(port)
