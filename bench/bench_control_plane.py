"""What does our control plane cost next to bare ZeroMQ?

Measured side by side in one run, printed as ratios (1.00 = as fast as bare pyzmq):
  1. round-trip time (p50, p99) of our `ping` through AgentClient against a real AgentDaemon,
     with CURVE (the default) and without (--insecure), vs a bare DEALER/ROUTER echo without
     CURVE carrying the same bytes;
  2. the coordinator's cost per cell with many agents: run_fleet (decode and validate each
     bench.cell, hand it across threads, commit it to the RunStore) against K replay agents
     streaming M cells each, vs K bare DEALERs receiving the same bytes and doing nothing;
     plus the decode and store parts alone.

    python bench/bench_control_plane.py [--pings 2000] [--agents 8] [--cells 300]

Servers run in their own processes (spawn) so they never share the client's GIL. Everything
stays on 127.0.0.1 and in a temporary MLX_FLEET_HOME. Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from coordinator.fleet import Settings, Target, run_fleet
from coordinator.store import RunStore
from shared import protocol as p
from shared.io.keys import own_keypair
from shared.io.transport import AgentClient
from shared.matrix import PREFILL, Cell
from shared.results import cell_record

Server = Callable[["mp.Queue[Any]", dict[str, Any]], None]


# --- servers (each in its own process) ---------------------------------------------------------


def agent_server(ready: mp.Queue[Any], options: dict[str, Any]) -> None:
    """A real AgentDaemon, trusting the benchmark's coordinator key when CURVE is on."""
    from agent.serve import AgentDaemon
    from shared.io.trust import trust, trusted_dir

    if options["secure"]:
        trust(options["client_key"], "bench", directory=trusted_dir())
    daemon = AgentDaemon("127.0.0.1:0", secure=options["secure"], thermal_source="none")
    signal.signal(signal.SIGTERM, daemon.stop)
    endpoint = daemon.start()
    ready.put((endpoint.removeprefix("tcp://"), daemon.public_key))
    daemon.serve_forever()


def echo_server(ready: mp.Queue[Any], options: dict[str, Any]) -> None:
    """Bare ROUTER: every message straight back, no CURVE, no decoding."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    ready.put((f"127.0.0.1:{port}", None))
    while True:
        router.send_multipart(router.recv_multipart())


def replay_agent(ready: mp.Queue[Any], options: dict[str, Any]) -> None:
    """Speaks the agent side of the protocol, answering bench.start with `cells` recorded
    bench.cell messages at full speed: the coordinator's cost is all that is left to measure."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    ready.put((f"127.0.0.1:{port}", None))
    record, cells = options["record"], options["cells"]
    while True:
        identity, data = router.recv_multipart()
        request = p.decode(data)
        replies: list[p.Message] = []
        if request.type == "hello":
            replies = [
                p.make(
                    "hello.ok",
                    {
                        "agent": "replay",
                        "protocol": p.PROTOCOL_VERSION,
                        "hostname": "replay",
                        "secure": False,
                    },
                    request.id,
                )
            ]
        elif request.type == "info":
            replies = [
                p.make(
                    "info.ok",
                    {
                        "agent": "replay",
                        "protocol": p.PROTOCOL_VERSION,
                        "name": "replay",
                        "machine": {"hostname": "replay"},
                        "thermal": {},
                        "job": None,
                    },
                    request.id,
                )
            ]
        elif request.type == "ping":
            replies = [p.make("ping.ok", {"job": None, "time": time.time()}, request.id)]
        elif request.type == "bench.start":
            job = {"job": "j-replay"}
            replies = [p.make("bench.start.ok", job | {"cells": ["c"] * cells}, request.id)]
            replies += [
                p.make("bench.cell", job | {"index": i, "record": record}, request.id)
                for i in range(cells)
            ]
            replies.append(
                p.make(
                    "bench.done", job | {"status": "ok", "error": None, "cells": cells}, request.id
                )
            )
        for reply in replies:
            router.send_multipart([identity, p.encode(reply)])


def blaster(ready: mp.Queue[Any], options: dict[str, Any]) -> None:
    """Bare ROUTER: on any message, sends back `cells` copies of the same encoded bench.cell."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    ready.put((f"127.0.0.1:{port}", None))
    data = p.encode(p.make("bench.cell", {"job": "j", "index": 0, "record": options["record"]}))
    while True:
        identity, _ = router.recv_multipart()
        for _ in range(options["cells"]):
            router.send_multipart([identity, data])


def start(server: Server, **options: Any) -> tuple[mp.Process, str, str | None]:
    context = mp.get_context("spawn")
    ready: mp.Queue[Any] = context.Queue()
    process = context.Process(target=server, args=(ready, options), daemon=True)
    process.start()
    address, key = ready.get(timeout=60)
    return process, address, key


# --- 1. round trips ------------------------------------------------------------------------------


def percentiles(samples: list[float]) -> tuple[float, float]:
    """(p50, p99) in microseconds."""
    ordered = sorted(samples)
    return (
        statistics.median(ordered) * 1e6,
        ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6,
    )


def ours_rtt(ctx: zmq.Context, address: str, key: str | None, pings: int) -> list[float]:
    client = AgentClient(ctx, address, key, own_keypair() if key else None)
    client.connect()
    samples = []
    for _ in range(pings):
        began = time.perf_counter()
        client.request("ping")
        samples.append(time.perf_counter() - began)
    client.close()
    return samples


def raw_rtt(ctx: zmq.Context, address: str, pings: int) -> list[float]:
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(f"tcp://{address}")
    payload = p.encode(p.make("ping"))
    sock.send(payload)
    sock.recv()
    samples = []
    for _ in range(pings):
        began = time.perf_counter()
        sock.send(payload)
        sock.recv()
        samples.append(time.perf_counter() - began)
    sock.close()
    return samples


def round_trips(pings: int) -> None:
    ctx = zmq.Context()
    servers = {
        "raw": start(echo_server),
        "insecure": start(agent_server, secure=False),
        "curve": start(agent_server, secure=True, client_key=own_keypair().public),
    }
    results: dict[str, list[float]] = {name: [] for name in servers}
    rounds = 4  # interleaved, so drift hits every contender alike
    for _ in range(rounds):
        results["raw"] += raw_rtt(ctx, servers["raw"][1], pings // rounds)
        results["insecure"] += ours_rtt(ctx, servers["insecure"][1], None, pings // rounds)
        results["curve"] += ours_rtt(ctx, servers["curve"][1], servers["curve"][2], pings // rounds)
    base50, base99 = percentiles(results["raw"])
    print(f"1. ping round trip over loopback, {len(results['raw'])} pings each")
    print(f"   {'':32} {'p50 µs':>9} {'p99 µs':>9} {'p50 ×':>7} {'p99 ×':>7}")
    labels = {
        "raw": "bare DEALER/ROUTER echo, NULL",
        "insecure": "our ping, --insecure",
        "curve": "our ping, CURVE (default)",
    }
    for name, samples in results.items():
        p50, p99 = percentiles(samples)
        print(f"   {labels[name]:32} {p50:9.1f} {p99:9.1f} {p50 / base50:7.2f} {p99 / base99:7.2f}")
    for process, _, _ in servers.values():
        process.terminate()
        process.join(10)
    ctx.destroy(linger=0)


# --- 2. coordinator cost per cell ---------------------------------------------------------------


def sample_record() -> dict[str, Any]:
    """A cell record as the runner makes it (5 timed iterations)."""
    samples = [41.2, 40.9, 41.5, 40.8, 41.1]
    mean = statistics.fmean(samples)
    return cell_record(
        Cell("small", 16, PREFILL, 128, 1),
        {
            "tokens_per_sec": 128 / mean * 1000,
            "std_tokens_per_sec": 12.3,
            "latency_ms": mean,
            "std_latency_ms": statistics.stdev(samples),
            "min_latency_ms": min(samples),
            "median_latency_ms": statistics.median(samples),
            "samples_ms": samples,
            "peak_memory_gb": 0.0123,
            "active_memory_gb": 0.0101,
            "activation_memory_gb": 0.002,
        },
    )


def raw_receive_s(addresses: list[str], cells: int) -> float:
    ctx = zmq.Context()
    socks = []
    for address in addresses:
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(f"tcp://{address}")
        socks.append(sock)
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    began = time.perf_counter()
    for sock in socks:
        sock.send(b"go")
    left = cells * len(socks)
    while left:
        for sock, _ in poller.poll():
            while left and sock.poll(0):
                sock.recv()
                left -= 1
    elapsed = time.perf_counter() - began
    ctx.destroy(linger=0)
    return elapsed


def per_cell(agents: int, cells: int, home: Path) -> None:
    record = sample_record()
    total = agents * cells
    replays = [start(replay_agent, record=record, cells=cells) for _ in range(agents)]
    blasters = [start(blaster, record=record, cells=cells) for _ in range(agents)]
    targets = [Target(address, address, None) for _, address, _ in replays]
    with RunStore(home / "bench.sqlite") as store:
        began = time.perf_counter()
        result = run_fleet(targets, {"bench": True}, store, Settings(None))
        ours = (time.perf_counter() - began) / total
        stored = len(store.load_report(result.run_id)["cells"])
    raw = raw_receive_s([address for _, address, _ in blasters], cells) / total

    data = p.encode(p.make("bench.cell", {"job": "j", "index": 0, "record": record}))
    began = time.perf_counter()
    for _ in range(total):
        p.decode(data)
    decode = (time.perf_counter() - began) / total
    with RunStore(home / "alone.sqlite") as store:
        run_id = store.create_run({}, ["h"])
        began = time.perf_counter()
        for _ in range(total):
            store.add_cell(run_id, "h", record)
        store_cost = (time.perf_counter() - began) / total

    print(
        f"\n2. coordinator cost per cell: {agents} agents x {cells} cells "
        f"({len(data)} bytes per bench.cell; {stored} stored)"
    )
    print(f"   {'':44} {'µs/cell':>9} {'× raw':>7}")
    for label, cost in (
        ("bare DEALERs, receive only", raw),
        ("run_fleet: decode + threads + store", ours),
        ("  of which decode + validate", decode),
        ("  of which RunStore.add_cell (commit)", store_cost),
    ):
        print(f"   {label:44} {cost * 1e6:9.1f} {cost / raw:7.2f}")
    for process, _, _ in replays + blasters:
        process.terminate()
        process.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pings", type=int, default=2000)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--cells", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlx-fleet-bench-") as home:
        os.environ["MLX_FLEET_HOME"] = home  # inherited by the spawned servers
        round_trips(args.pings)
        per_cell(args.agents, args.cells, Path(home))


if __name__ == "__main__":
    main()
