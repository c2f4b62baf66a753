"""The local client session: this machine's processes talk to its `agent serve` with the
agent's own keypair, which the daemon trusts by itself (docs/protocol.md §12)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import zmq

from agent.cooling.accounting import sample_energy
from agent.cooling.local_feed import Observation
from agent.daemon_address import DaemonAddress, find_daemon, pid_alive
from agent.sensors.base import SourceInfo
from agent.thermal.base import reading_from_wire
from agent.thermal.monitor import StopFlag
from shared.cooling.calibration import SET_BY_COORDINATOR
from shared.cooling.clocks import ClockReading
from shared.cooling.policy import ThermalPolicy
from shared.io.keys import own_keypair
from shared.io.transport import AgentClient, HostError
from shared.wire import protocol as p

log = logging.getLogger("agent.remote")

CONNECT_TIMEOUT_S = 2.0
"""How long a local client waits for the daemon before supervising itself."""


SLICE_S = 0.1
"""How often a client waiting for a sample looks whether it was closed or the daemon died."""


CLOSE_WAIT_S = 2.0


class DaemonUnavailable(RuntimeError):
    """The daemon's state file is there but the daemon did not answer."""


class DaemonLost(RuntimeError):
    """The daemon stopped publishing or its process is gone; the message says which."""


class DaemonSession:
    """Requests on a DEALER and samples on a SUB, both with this data directory's keypair.
    Built on one thread, then used by one thread at a time."""

    def __init__(self, address: DaemonAddress, timeout: float = CONNECT_TIMEOUT_S) -> None:
        self.address = address
        self.ctx = zmq.Context()
        keypair = own_keypair() if address.public_key else None
        self.client = AgentClient(self.ctx, address.endpoint, address.public_key, keypair, timeout)
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.linger = 0
        self.sub.maxmsgsize = p.MAX_MESSAGE_SIZE
        if keypair is not None and address.public_key:
            self.sub.curve_secretkey = keypair.secret.encode("ascii")
            self.sub.curve_publickey = keypair.public.encode("ascii")
            self.sub.curve_serverkey = address.public_key.encode("ascii")
        self.sub.subscribe(b"")
        try:
            self.sub.connect(f"tcp://{address.telemetry}")
            self.client.connect()
            info = self.client.request("info", timeout=timeout)
        except (HostError, zmq.ZMQError) as exc:
            self.close()
            raise DaemonUnavailable(
                f"agent serve (pid {address.pid}) did not answer: {exc}"
            ) from None
        thermal = info["thermal"]
        self.source = SourceInfo(thermal["source"], thermal["simulated"])
        self.first = reading_from_wire(thermal["reading"])
        self.poll_interval: float = info["poll_interval"]
        self.policy = ThermalPolicy.from_dict(info["policy"])
        self.policy_origin: str = info.get("policy_origin") or "origin unknown: an older agent"
        self.silence_s = 3 * self.poll_interval + 1.0
        self._heard = time.monotonic()

    def next_sample(self, stop: StopFlag | threading.Event) -> Observation | None:
        """The daemon's next reading with the policy to judge it by (a `policy` event carries the
        new one); None once `stop` is set. Raises DaemonLost."""
        while not stop.is_set():
            if self.sub.poll(SLICE_S * 1000):
                try:
                    message = p.decode_telemetry(self.sub.recv_multipart())
                except p.ProtocolError as exc:
                    log.warning("ignored a telemetry message: %s", exc.message)
                    continue
                self._heard = time.monotonic()
                if message.type == "telemetry.sample":
                    body = message.body
                    return Observation(
                        reading_from_wire(body),
                        self.policy,
                        energy=sample_energy(body),
                        clock=sample_clock(body),
                    )
                if message.body["policy"] is not None:
                    self.policy = ThermalPolicy.from_dict(message.body["policy"])
                    self.policy_origin = SET_BY_COORDINATOR
                continue
            if not pid_alive(self.address.pid):
                raise DaemonLost(f"agent serve (pid {self.address.pid}) is gone")
            silent = time.monotonic() - self._heard
            if silent > self.silence_s:
                raise DaemonLost(
                    f"agent serve (pid {self.address.pid}) sent nothing for {silent:.1f} s"
                )
        return None

    def close(self) -> None:
        self.sub.close(linger=0)
        self.client.close()
        self.ctx.term()


def sample_clock(body: Mapping[str, Any]) -> ClockReading | None:
    """The clocks a telemetry.sample carries (docs/protocol.md §10, validated on decoding), so
    that a job under the daemon paces on temperature and clock like one reading its own
    source; None from a daemon that reads no clock (`clock_source` nil or `none`, or an older
    agent without the fields)."""
    source = body.get("clock_source")
    if source is None or source == "none":
        return None
    return ClockReading(
        time=body["time"],
        gpu_hz=body.get("gpu_hz"),
        gpu_active=body.get("gpu_active"),
        cpu_p_hz=body.get("cpu_p_hz"),
        cpu_e_hz=body.get("cpu_e_hz"),
        source=source,
        simulated=bool(body.get("clock_simulated")),
        note=body.get("clock_note"),
    )


def connect_daemon(timeout: float = CONNECT_TIMEOUT_S, warn: bool = True) -> DaemonSession | None:
    """A session with this machine's daemon, or None (none runs, or it does not answer: why is
    logged when `warn`)."""
    address = find_daemon()
    if address is None:
        return None
    try:
        return DaemonSession(address, timeout)
    except DaemonUnavailable as exc:
        if warn:
            log.warning("%s; going on without it", exc)
        return None
