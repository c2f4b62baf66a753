"""Whether a rank could listen where its group says it will, asked before its process starts.

MLX's ring listens with SO_REUSEADDR and SO_REUSEPORT (mlx/distributed/utils.cpp,
TCPSocket::listen), so a second ring on an address and port already held (an `mlx.launch` job
on its default 32323, another group) binds without an error, and the kernel then hands each
incoming connection to either: the two rings join each other's ranks and fail, or hang, with
no word of why. A bind without SO_REUSEPORT is refused where any socket listens, which is the
question asked here; SO_REUSEADDR keeps a port an earlier rank left in TIME_WAIT usable, as it
is for MLX."""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence


def listen_problem(addresses: Sequence[tuple[str, int]]) -> str | None:
    """Why a rank cannot listen on every one of `addresses` (ip, port) now, in one line, or
    None. Held by another process, or an address this machine does not have."""
    for ip, port in addresses:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        shown = f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((ip, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return (
                        f"port {shown} is in use on this machine (another ring, such as an "
                        "mlx.launch job on its default port): choose another --port"
                    )
                if exc.errno == errno.EADDRNOTAVAIL:
                    return (
                        f"{ip} is not an address of this machine, so its rank cannot listen on it"
                    )
                return f"cannot listen on {shown}: {exc.strerror or exc}"
    return None
