"""How many telemetry samples a second does `coordinator monitor` record from many agents, next
to a bare pyzmq SUB loop?

K publisher processes each speak the agent's side of the protocol (hello, info, history.get,
ping on a ROUTER; telemetry.sample on a CURVE PUB, one job listed, like a fine-tune's host) and
publish at a fixed rate, each sample encoded once and patched (SampleFrames), so the load costs
the machine as little as it can. Against the same publishers, one after the other:
  1. raw: one CURVE SUB per publisher in a poll loop, receive and count, nothing else;
  2. ours: the monitor's own Monitor (one thread reading every host's CURVE SUB, decoding and
     validating each envelope, writing each batch to the telemetry SQLite in one transaction and
     updating the dashboard model; a HostLink thread per host for its requests), counting the
     samples newly recorded.
Printed as samples/s and the ratio ours / raw (1.00 = records all a bare SUB receives), and
the receiving process's CPU time per sample (all its threads, ZeroMQ's CURVE I/O included):
what a sample costs the coordinator whatever else the machine runs, where the rates follow the
machine's load. The rounds interleave the two sides; figures are median (min–max) over the
rounds. The default
offers 50,000 samples/s (8 x 6250); a lower --rate shows where the monitor still keeps up.
An agent publishes one sample a second by default, so N samples/s is N agents' worth.

    python bench/bench_telemetry_coordinator.py [--agents 8] [--rate 6250] [--seconds 5]
        [--repeats 5] [--quick]

Publishers run in their own processes (spawn) so they never share the coordinator's GIL;
everything stays on 127.0.0.1 and in a temporary MLX_FLEET_HOME. Numbers are printed, never
asserted.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq
from support import (
    BenchError,
    interleave,
    machine,
    no_power_source,
    parser,
    round_count,
    run,
    spread,
)

from coordinator.hosts.link import Settings, Target
from coordinator.telemetry.dashboard import UP
from coordinator.telemetry.monitor import Monitor
from coordinator.telemetry.store import TelemetryStore
from shared.cooling.policy import ThermalPolicy
from shared.io.keys import own_keypair
from shared.wire import protocol as p

BURST_S = 0.01
"""Publishers send their rate in bursts this often: steady, without a sleep per sample."""
WARMUP_S = 1.0


class SampleFrames:
    """One fake agent's telemetry.sample frames, encoded once and patched per sample (its time,
    seq and id). Making and encoding each sample would cost the load generator ~20 µs a sample,
    over a core at 50,000/s on the very machine whose other core is being measured; patching costs
    a few µs. Every patched sample is valid: the first is checked with the protocol's own decoder.
    """

    TIME = 1234567.0625
    """Placeholders, found in the encoded bytes: a float is packed as 0xcb + 8 bytes, an int of
    32 bits as 0xce + 4 (msgpack's spec), so any time and any seq below 2**32 fit in place."""
    SEQ = 0xFFFFFFFF
    ID = "f" * 16

    def __init__(self, body: dict[str, Any]) -> None:
        message = p.make("telemetry.sample", {**body, "time": self.TIME, "seq": self.SEQ})
        self.topic, encoded = p.telemetry_frames(message._replace(id=self.ID))
        self.data = bytearray(encoded)
        self.time_at = self._offset(b"\xcb" + struct.pack(">d", self.TIME))
        self.seq_at = self._offset(b"\xce" + struct.pack(">I", self.SEQ))
        self.id_at = self._offset(b"\xb0" + self.ID.encode("ascii"))
        check = p.decode_telemetry(self.frames(1, 1e9))
        if check.body != {**message.body, "time": 1e9, "seq": 1} or check.id != f"{1:016x}":
            raise BenchError("the patched telemetry.sample does not decode to what was patched")

    def _offset(self, placeholder: bytes) -> int:
        if self.data.count(placeholder) != 1:
            raise BenchError(f"placeholder {placeholder!r} is not once in the encoded sample")
        return self.data.index(placeholder) + 1

    def frames(self, seq: int, time_: float) -> list[bytes]:
        struct.pack_into(">d", self.data, self.time_at, time_)
        struct.pack_into(">I", self.data, self.seq_at, seq)
        self.data[self.id_at : self.id_at + 16] = b"%016x" % seq
        return [self.topic, bytes(self.data)]


def publisher(ready: mp.Queue[Any], name: str, rate: float) -> None:
    """One fake agent: answers the requests the monitor makes, publishes `rate` samples/s."""
    public, secret = zmq.curve_keypair()
    ctx = zmq.Context()
    router, pub = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PUB)
    for sock in (router, pub):
        sock.curve_server = True
        sock.curve_publickey, sock.curve_secretkey = public, secret
    port = router.bind_to_random_port("tcp://127.0.0.1")
    telemetry_port = pub.bind_to_random_port("tcp://127.0.0.1")
    ready.put((f"127.0.0.1:{port}", public.decode("ascii")))
    replies = {
        "hello": (
            "hello.ok",
            {"agent": "bench", "protocol": p.PROTOCOL_VERSION, "hostname": name, "secure": True},
        ),
        "info": (
            "info.ok",
            {
                "agent": "bench",
                "protocol": p.PROTOCOL_VERSION,
                "name": name,
                "machine": {"hostname": name},
                "thermal": {"source": "bench", "simulated": True, "reading": None, "error": None},
                "power": no_power_source("a bench publisher has no power source"),
                "job": None,
                "telemetry_port": telemetry_port,
                "poll_interval": 1.0,
                "policy": ThermalPolicy().to_dict(),
                "jobs": [],
                "history": f"bench-{name}",
                "storage": {"ok": True, "failing": []},
            },
        ),
        "history.get": (
            "history.get.ok",
            {"history": f"bench-{name}", "samples": [], "events": [], "truncated": False},
        ),
    }
    samples = SampleFrames(
        {
            "host": name,
            "celsius": 71.5,
            "pressure": None,
            "source": "bench",
            "sensor": None,
            "simulated": True,
            "state": "ok",
            "trend_c_per_min": 0.4,
            "pause_s_total": 0.0,
            "jobs": [
                {
                    "job": "j-bench",
                    "pid": 4242,
                    "command": "python -m mlx_lm lora --train",
                    "state": "running",
                    "kind": "run",
                }
            ],
            "storage_error": None,
            "power_w": None,
            "energy_j": None,
            "power": None,
        }
    )
    sent, began = 0, time.monotonic()
    while True:
        while router.poll(0):
            identity, data = router.recv_multipart()
            request = p.decode(data)
            type_, body = replies.get(request.type, ("ping.ok", {"job": None, "time": time.time()}))
            router.send_multipart([identity, p.encode(p.make(type_, body, request.id))])
        due = int((time.monotonic() - began) * rate)
        for _ in range(due - sent):
            sent += 1
            # a distinct time per sample: the store keeps one sample per host and time
            pub.send_multipart(samples.frames(sent, began + sent / rate + 1e9))
        time.sleep(BURST_S)


def raw_rate(pubs: list[tuple[str, str]], seconds: float) -> tuple[float, float]:
    """Samples/s a bare CURVE SUB loop receives from every publisher's PUB address, and the CPU
    seconds per sample it took."""
    ctx = zmq.Context()
    public, secret = zmq.curve_keypair()
    poller = zmq.Poller()
    for address, key in pubs:
        sub = ctx.socket(zmq.SUB)
        sub.curve_publickey, sub.curve_secretkey = public, secret
        sub.curve_serverkey = key.encode("ascii")
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://{address}")
        poller.register(sub, zmq.POLLIN)
    _receive(poller, WARMUP_S)  # past the slow joiner and what queued meanwhile
    began, cpu = time.monotonic(), time.process_time()
    received = _receive(poller, seconds)
    elapsed, cpu = time.monotonic() - began, time.process_time() - cpu
    ctx.destroy(linger=0)
    if not received:
        raise BenchError("the bare SUB loop received nothing in a round")
    return received / elapsed, cpu / received


def _receive(poller: zmq.Poller, seconds: float) -> int:
    received, began = 0, time.monotonic()
    while time.monotonic() - began < seconds:
        for sock, _ in poller.poll(100):
            while True:
                try:
                    sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                received += 1
    return received


def ours_rate(
    agents: list[tuple[str, str]], seconds: float, home: Path
) -> tuple[float, float, int]:
    """Samples/s the monitor records (new rows in its store), the CPU seconds per sample, and
    the rows stored in all."""
    targets = [Target(address, address, key) for address, key in agents]
    with (
        TelemetryStore(home / "telemetry.sqlite") as store,
        Monitor(targets, Settings(own_keypair()), store) as running,
    ):
        while not all(view.status == UP and view.live for view in running.board.hosts.values()):
            running.step(0.1)
        warm = time.monotonic()
        while time.monotonic() - warm < WARMUP_S:  # as for raw: only the steady state counts
            running.step(0.05)
        start, began, cpu = running.recorded, time.monotonic(), time.process_time()
        while time.monotonic() - began < seconds:
            running.step(0.05)
        recorded = running.recorded - start
        elapsed, cpu = time.monotonic() - began, time.process_time() - cpu
        return recorded / elapsed, cpu / max(recorded, 1), running.recorded


def main() -> None:
    args = parser(__doc__.split("\n\n")[0])
    args.add_argument("--agents", type=int, default=8)
    args.add_argument("--rate", type=float, default=6250.0, help="samples/s each publisher sends")
    args.add_argument("--seconds", type=float, default=5.0)
    opts = args.parse_args()
    if opts.quick:
        opts.agents, opts.rate, opts.seconds = 2, 500.0, 1.0
    repeats = round_count(opts)
    with tempfile.TemporaryDirectory() as home:
        os.environ["MLX_FLEET_HOME"] = home
        context = mp.get_context("spawn")
        ready: mp.Queue[Any] = context.Queue()
        processes = [
            context.Process(target=publisher, args=(ready, f"pub{i}", opts.rate), daemon=True)
            for i in range(opts.agents)
        ]
        for process in processes:
            process.start()
        agents = [ready.get(timeout=60) for _ in processes]
        pubs = telemetry_addresses(agents)
        stored: list[int] = []

        def ours() -> tuple[float, float]:
            rate, cpu, count = ours_rate(agents, opts.seconds, Path(home) / f"round{len(stored)}")
            stored.append(count)
            return rate, cpu

        rounds = interleave({"raw": lambda: raw_rate(pubs, opts.seconds), "ours": ours}, repeats)
        for process in processes:
            process.terminate()
            process.join(10)
    if not all(stored):
        raise BenchError("the monitor recorded nothing in a round")
    offered = opts.agents * opts.rate
    print(f"machine: {machine()}; {repeats} interleaved rounds")
    print(
        f"telemetry recorded from {opts.agents} publishers at {opts.rate:g} samples/s each "
        f"({offered:g}/s offered, {opts.seconds:g} s a side a round)"
    )
    print(f"   {'':52} {'samples/s':>22} {'× raw':>20} {'CPU µs/sample':>20}")
    raw, ours = rounds.figures("raw", 0), rounds.figures("ours", 0)
    print(
        f"   {'bare pyzmq SUB loop, receive only':52} {spread(raw, 1, 0):>22} {'':>20} "
        f"{spread(rounds.figures('raw', 1), 1e6, 1):>20}"
    )
    print(
        f"   {'coordinator monitor: decode, SQLite, dashboard':52} {spread(ours, 1, 0):>22} "
        f"{spread(rounds.ratios('ours', 'raw', 0)):>20} "
        f"{spread(rounds.figures('ours', 1), 1e6, 1):>20}"
    )


def telemetry_addresses(agents: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Each fake agent's PUB address (not its ROUTER's): asked with info, as the monitor does."""
    ctx = zmq.Context()
    pubs = []
    for address, key in agents:
        dealer = ctx.socket(zmq.DEALER)
        dealer.curve_publickey, dealer.curve_secretkey = zmq.curve_keypair()
        dealer.curve_serverkey = key.encode("ascii")
        dealer.connect(f"tcp://{address}")
        dealer.send(p.encode(p.make("info")))
        port = p.decode(dealer.recv()).body["telemetry_port"]
        pubs.append((f"{address.rsplit(':', 1)[0]}:{port}", key))
        dealer.close(linger=0)
    ctx.destroy(linger=0)
    return pubs


if __name__ == "__main__":
    run(main)
