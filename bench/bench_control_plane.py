"""What does our control plane cost next to bare ZeroMQ? Every comparison is measured side by
side: rounds that interleave the two sides, repeated, each figure printed as median (min–max)
over the rounds and each ratio taken round by round (1.00 = as fast as bare pyzmq).

  1. a request's round trip (p50, p99): our `ping` through AgentClient to a real AgentDaemon,
     against a bare pyzmq DEALER/ROUTER echo of the same bytes with the same security: CURVE
     against CURVE (the default), and --insecure against NULL;
  2. the coordinator's cost per cell: run_fleet (decode and validate each bench.cell, hand it
     across threads, commit it to the RunStore) against K protocol-level agents streaming M
     cells each (bench/replay.py), against K bare DEALERs receiving as many bench.cell
     messages and doing nothing with them;
  3. an idle `agent serve --thermal-source sim` (1 Hz: read, judge, store, publish) against a
     bare daemon: a process polling a ROUTER and a pipe, woken by a 1 Hz thread that
     publishes one message; CPU share over the same windows, first with nobody subscribed
     (the agent then encodes and sends nothing, and its loop takes its readings ten at a
     time), then with one CURVE SUB on each.

    .venv/bin/python bench/bench_control_plane.py [--pings 2000] [--agents 8] [--cells 300]
        [--idle-seconds 20] [--repeats 5] [--quick] [--only ping|cells|idle ...]

--only runs the parts named (each as it runs in the whole script); part 3 also prints each
process's share split between its main thread and its other threads (Linux: from
/proc/PID/task/TID/schedstat), so what is left shows where it is.

Servers run in their own processes (spawn) so they never share the client's GIL. Everything
stays on 127.0.0.1 and in a temporary MLX_FLEET_HOME. Numbers are printed, never asserted.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import zmq
from replay import measured_here, replay_agents
from support import (
    BenchError,
    drain,
    interleave,
    machine,
    parser,
    round_count,
    run,
    spread,
    subscribe,
    thread_cpu_seconds,
)

from coordinator.hosts.link import Settings, Target
from coordinator.runs.fleet import run_fleet
from coordinator.runs.store import RunStore
from shared.benchmark.matrix import MatrixSpec, expand
from shared.benchmark.results import cell_record
from shared.io.keys import own_keypair
from shared.io.transport import AgentClient
from shared.wire import protocol as p

Server = Callable[["mp.Queue[Any]", dict[str, Any]], None]
BARE_DAEMON = """
import os, sys, threading, zmq
ctx = zmq.Context()
router, pub = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PUB)
public, secret = zmq.curve_keypair()
for sock in (router, pub):
    sock.curve_secretkey, sock.curve_publickey, sock.curve_server = secret, public, True
    sock.bind("tcp://127.0.0.1:*")
wake_read, wake_write = os.pipe()
def tick():
    while True:
        threading.Event().wait(1.0)
        os.write(wake_write, b"r")
threading.Thread(target=tick, daemon=True).start()
poller = zmq.Poller()
poller.register(router, zmq.POLLIN)
poller.register(wake_read, zmq.POLLIN)
print("ready", pub.last_endpoint.decode(), public.decode(), flush=True)
while True:
    ready = dict(poller.poll())
    if ready.get(wake_read):
        os.read(wake_read, 64)
        pub.send_multipart([b"sample", b"x" * 300])
    if ready.get(router):
        router.send_multipart(router.recv_multipart())
"""
"""The floor of an idle daemon: what any 1 Hz publisher with a command socket costs, both
sockets CURVE servers as the agent's are (no ZAP: any client key will do)."""
PARTS = ("ping", "cells", "idle")


# --- servers (each in its own process) ---------------------------------------------------------


def agent_server(ready: mp.Queue[Any], options: dict[str, Any]) -> None:
    """A real AgentDaemon in its own data directory, trusting the benchmark's coordinator key
    when CURVE is on."""
    import signal

    os.environ["MLX_FLEET_HOME"] = options["home"]

    from agent.daemon.loop import AgentDaemon
    from shared.io.trust import trust, trusted_dir

    if options["secure"]:
        trust(options["client_key"], "bench", directory=trusted_dir())
    daemon = AgentDaemon("127.0.0.1:0", secure=options["secure"], thermal_source="none")
    signal.signal(signal.SIGTERM, daemon.stop)
    endpoint = daemon.start()
    ready.put((endpoint.removeprefix("tcp://"), daemon.public_key))
    daemon.serve_forever()


def echo_server(ready: mp.Queue[Any], options: dict[str, Any]) -> None:
    """Bare ROUTER: every message straight back, no decoding; a CURVE server when asked."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    public = None
    if options["secure"]:
        public, secret = zmq.curve_keypair()
        router.curve_server = True
        router.curve_publickey, router.curve_secretkey = public, secret
    port = router.bind_to_random_port("tcp://127.0.0.1")
    ready.put((f"127.0.0.1:{port}", public.decode("ascii") if public else None))
    while True:
        router.send_multipart(router.recv_multipart())


def blaster(ready: mp.Queue[Any], options: dict[str, Any]) -> None:
    """Bare CURVE ROUTER: on any message, sends back `cells` copies of one encoded bench.cell."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    public, secret = zmq.curve_keypair()
    router.curve_server = True
    router.curve_publickey, router.curve_secretkey = public, secret
    port = router.bind_to_random_port("tcp://127.0.0.1")
    ready.put((f"127.0.0.1:{port}", public.decode("ascii")))
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


def stop(processes: list[mp.Process]) -> None:
    for process in processes:
        process.terminate()
        process.join(10)


# --- 1. round trips ------------------------------------------------------------------------------


def p50_p99(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def ours_rtt(ctx: zmq.Context, address: str, key: str | None, pings: int) -> list[float]:
    client = AgentClient(ctx, address, key, own_keypair() if key else None)
    client.connect()
    client.request("ping")
    samples = []
    for _ in range(pings):
        began = time.perf_counter()
        client.request("ping")
        samples.append(time.perf_counter() - began)
    client.close()
    return samples


def raw_rtt(ctx: zmq.Context, address: str, key: str | None, pings: int) -> list[float]:
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    if key is not None:
        public, secret = zmq.curve_keypair()
        sock.curve_publickey, sock.curve_secretkey = public, secret
        sock.curve_serverkey = key.encode("ascii")
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


def round_trips(pings: int, repeats: int, home: Path) -> None:
    ctx = zmq.Context()
    servers = {
        "raw NULL": start(echo_server, secure=False),
        "raw CURVE": start(echo_server, secure=True),
        "ours --insecure": start(agent_server, secure=False, home=f"{home}/insecure"),
        "ours CURVE": start(
            agent_server, secure=True, client_key=own_keypair().public, home=f"{home}/curve"
        ),
    }
    p50s: dict[str, list[float]] = {name: [] for name in servers}
    p99s: dict[str, list[float]] = {name: [] for name in servers}

    def side(name: str) -> Callable[[], float]:
        _, address, key = servers[name]
        rtt = ours_rtt if name.startswith("ours") else raw_rtt

        def measure() -> float:
            p50, p99 = p50_p99(rtt(ctx, address, key, pings))
            p50s[name].append(p50)
            p99s[name].append(p99)
            return p50

        return measure

    interleave({name: side(name) for name in servers}, repeats)
    print(f"1. a request's round trip over loopback, {pings} per side per round")
    print(f"   {'':26} {'p50 µs':>22} {'p99 µs':>22} {'p50 × bare':>20} {'p99 × bare':>20}")
    for name, bare in (
        ("raw NULL", "raw NULL"),
        ("ours --insecure", "raw NULL"),
        ("raw CURVE", "raw CURVE"),
        ("ours CURVE", "raw CURVE"),
    ):
        ratio50 = [a / b for a, b in zip(p50s[name], p50s[bare], strict=True)]
        ratio99 = [a / b for a, b in zip(p99s[name], p99s[bare], strict=True)]
        print(
            f"   {name:26} {spread(p50s[name], 1e6, 1):>22} {spread(p99s[name], 1e6, 1):>22} "
            f"{spread(ratio50):>20} {spread(ratio99):>20}"
        )
    stop([process for process, _, _ in servers.values()])
    ctx.destroy(linger=0)


# --- 2. coordinator cost per cell ---------------------------------------------------------------

MATRIX = MatrixSpec(n_prompt=(8,), n_gen=(0,), models=("small",), warmup=0, iterations=1)


def raw_receive_s(addresses: list[tuple[str, str]], cells: int) -> float:
    ctx = zmq.Context()
    socks = []
    for address, key in addresses:
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        sock.curve_serverkey = key.encode("ascii")
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
        for sock, _ in poller.poll(10_000) or [(None, None)]:
            if sock is None:
                raise BenchError(f"bare DEALERs: {left} bench.cell messages never arrived")
            while left and sock.poll(0):
                sock.recv()
                left -= 1
    elapsed = time.perf_counter() - began
    ctx.destroy(linger=0)
    return elapsed


def ours_receive_s(agents: list[tuple[str, str]], cells: int, home: Path) -> float:
    """run_fleet against the replay agents; BenchError unless every cell was stored."""
    targets = [Target(address, address, key) for address, key in agents]
    spec = {**MATRIX.to_dict(), "n_prompt": list(range(1, cells + 1))}
    with RunStore(home / "bench.sqlite") as store:
        began = time.perf_counter()
        result = run_fleet(targets, spec, store, Settings(own_keypair()))
        elapsed = time.perf_counter() - began
        stored = [c for c in store.load_report(result.run_id)["cells"] if c["status"] == "ok"]
    if not result.hosts_ok or len(stored) != cells * len(agents):
        raise BenchError(f"run_fleet stored {len(stored)} of {cells * len(agents)} cells")
    return elapsed


def per_cell(agents: int, cells: int, repeats: int, home: Path) -> None:
    recorded = measured_here(pace_s=0.0)
    record = cell_record(expand(MATRIX)[0], recorded.metrics)
    total = agents * cells
    blasters = [start(blaster, record=record, cells=cells) for _ in range(agents)]
    with replay_agents(agents, recorded) as replays:
        rounds = interleave(
            {
                "raw": lambda: raw_receive_s([(a, k) for _, a, k in blasters], cells) / total,
                "ours": lambda: ours_receive_s(replays, cells, home) / total,
            },
            repeats,
        )
    stop([process for process, _, _ in blasters])
    data = p.encode(p.make("bench.cell", {"job": "j", "index": 0, "record": record}))
    print(
        f"\n2. coordinator cost per cell: {agents} agents x {cells} cells "
        f"({len(data)} bytes per bench.cell, CURVE), every cell stored, checked"
    )
    print(f"   {'':44} {'µs/cell':>22} {'× bare':>20}")
    print(f"   {'bare DEALERs, receive only':44} {spread(rounds.values['raw'], 1e6, 1):>22}")
    print(
        f"   {'run_fleet: decode, threads, RunStore':44} "
        f"{spread(rounds.values['ours'], 1e6, 1):>22} {spread(rounds.ratios('ours', 'raw')):>20}"
    )


# --- 3. the idle daemon ---------------------------------------------------------------------------


Shares = dict[str, list[float]]
"""Per process ("ours", "bare"): its share of one CPU in each window."""


def idle(seconds: float, repeats: int, home: Path) -> None:
    """Both processes run at once, and each round is one window over which both are measured:
    first with nobody subscribed to either's telemetry (an idle lab), then with one SUB on
    each (a coordinator's monitor watching), as the agent encodes and sends a sample only
    while someone subscribes."""
    agent_home = home / "idle-agent"
    agent = subprocess.Popen(
        [str(Path(sys.executable).parent / "agent"), "serve", "--bind", "127.0.0.1:0"]
        + ["--thermal-source", "sim"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "MLX_FLEET_HOME": str(agent_home)},
    )
    bare = subprocess.Popen([sys.executable, "-c", BARE_DAEMON], stdout=subprocess.PIPE, text=True)
    processes = {"ours": agent, "bare": bare}
    ctx = zmq.Context()
    try:
        started = {}
        for name, process in processes.items():
            assert process.stdout is not None
            started[name] = process.stdout.readline()
            if not started[name]:
                raise BenchError(f"{process.args[:2]} did not start")
        time.sleep(2.0)  # past start-up
        alone = cpu_windows(processes, seconds, repeats)
        ours = dict(re.findall(r"(curve-key|telemetry)=(\S+)", started["ours"]))
        subscribers = {
            "ours": subscribe(
                ctx, ours["telemetry"], ours["curve-key"], own_keypair(agent_home / "keys")
            ),
            "bare": subscribe(ctx, *started["bare"].split()[1:3]),
        }
        with receiving(subscribers) as received:
            watched = cpu_windows(processes, seconds, repeats)
        if min(received.values()) < repeats * seconds / 2:
            raise BenchError(f"a subscriber missed most of the 1 Hz messages: {received}")
    finally:
        ctx.destroy(linger=0)
        for process in processes.values():
            process.terminate()
            process.wait(10)
    print(f"\n3. idle daemon, share of one CPU, {repeats} windows of {seconds:g} s (both at once)")
    print_shares("nobody subscribed", alone)
    print_shares("one subscriber each", watched)


def cpu_windows(
    processes: dict[str, subprocess.Popen[str]], seconds: float, repeats: int
) -> tuple[Shares, Shares]:
    """Each process's share of one CPU over `repeats` windows: all its threads, its main one."""
    shares: Shares = {name: [] for name in processes}
    main_shares: Shares = {name: [] for name in processes}
    for _ in range(repeats):
        began = {name: thread_cpu_seconds(p.pid) for name, p in processes.items()}
        wall = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - wall
        for name, process in processes.items():
            if process.poll() is not None:
                raise BenchError(f"{process.args[:2]} exited during the window")
            ended = thread_cpu_seconds(process.pid)
            if began[name] is None or ended is None:
                raise BenchError("no per-thread CPU counters here (/proc/PID/task)")
            used = {tid: ended[tid] - began[name].get(tid, 0.0) for tid in ended}
            shares[name].append(sum(used.values()) / elapsed)
            main_shares[name].append(used.get(process.pid, 0.0) / elapsed)
    return shares, main_shares


@contextlib.contextmanager
def receiving(subscribers: dict[str, zmq.Socket]) -> Iterator[dict[str, int]]:
    """Each subscriber drained on its own thread, from its first message (waited for: a
    subscription takes a moment to reach the publisher) until the block ends; yields the
    counts of what each received, final once the block is over."""
    counts = {name: [0] for name in subscribers}
    stop = threading.Event()
    threads = [
        threading.Thread(target=drain, args=(sub, counts[name], stop), daemon=True)
        for name, sub in subscribers.items()
    ]
    for thread in threads:
        thread.start()
    received: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 30.0
        while min(count[0] for count in counts.values()) == 0:
            if time.monotonic() > deadline:
                raise BenchError("a subscriber received nothing in 30 s")
            time.sleep(0.05)
        yield received
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        received.update({name: count[0] for name, count in counts.items()})


def print_shares(title: str, measured: tuple[Shares, Shares]) -> None:
    shares, main_shares = measured
    ratios = [a / b for a, b in zip(shares["ours"], shares["bare"], strict=True)]
    print(f"   {title + ':':44} {'% of a CPU':>22} {'× bare':>20}")
    rows = (
        ("bare", "bare: ROUTER + 1 Hz thread + PUB, CURVE", None),
        ("ours", "agent serve --thermal-source sim", ratios),
    )
    for name, label, ratio in rows:
        print(
            f"   {label:44} {spread(shares[name], 100, 3):>22} {spread(ratio) if ratio else '':>20}"
        )
        others = [a - b for a, b in zip(shares[name], main_shares[name], strict=True)]
        print(f"   {'  its main thread':44} {spread(main_shares[name], 100, 3):>22}")
        print(f"   {'  its other threads':44} {spread(others, 100, 3):>22}")


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--pings", type=int, default=2000)
    args.add_argument("--agents", type=int, default=8)
    args.add_argument("--cells", type=int, default=300)
    args.add_argument("--idle-seconds", type=float, default=20.0)
    args.add_argument(
        "--only", nargs="+", choices=PARTS, default=list(PARTS), help="the parts to run"
    )
    opts = args.parse_args()
    if opts.quick:
        opts.pings, opts.agents, opts.cells, opts.idle_seconds = 200, 2, 20, 2.0
    repeats = round_count(opts)
    print(f"machine: {machine()}; {repeats} interleaved rounds")
    with tempfile.TemporaryDirectory(prefix="mlx-fleet-bench-") as home:
        os.environ["MLX_FLEET_HOME"] = home  # inherited by the spawned servers
        if "ping" in opts.only:
            round_trips(opts.pings, repeats, Path(home))
        if "cells" in opts.only:
            per_cell(opts.agents, opts.cells, repeats, Path(home))
        if "idle" in opts.only:
            idle(opts.idle_seconds, repeats, Path(home))


if __name__ == "__main__":
    run(main)
