"""`coordinator netbench`: how fast the links between the hosts are, through MLX's own
distributed backend (the one a distributed fine-tune or model uses), with the slow link named."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Annotated

import typer
from rich.text import Text

from coordinator.commands.benchmark import open_store
from coordinator.commands.hosts import (
    Backend,
    ConnectTimeout,
    Hostfile,
    Insecure,
    RingPort,
    settings_for,
)
from coordinator.commands.hosts import targets_from as hosts_named
from coordinator.hosts.link import DEFAULT_HOST_TIMEOUT_S
from coordinator.reports.netbench import netbench_table, netbench_text
from coordinator.runs.netbench import (
    BackendMissing,
    NetbenchFailed,
    NetbenchPlan,
    NetbenchRun,
    RankWatch,
    progress_text,
    run_netbench,
    save_run,
)
from coordinator.runs.store import RunStore
from shared.bounds import MAX_HOST_TIMEOUT_S, duration_text
from shared.distributed.netbench import DEFAULT_SIZES, NetbenchError, format_bytes, parse_sizes
from shared.distributed.rank_env import AUTO, BACKENDS, DEFAULT_STARTING_PORT, JACCL
from shared.distributed.rank_shapes import MAX_NETBENCH_REPETITIONS, MAX_NETBENCH_WARMUP
from shared.exit_codes import EXIT_INTERRUPTED, EXIT_PARTIAL
from shared.io.cli import check_output, err, print_rich, usage_error, write_text
from shared.io.options import LinkReportFormat, Output, bounded_option
from shared.safe_text import shown

NetbenchHosts = Annotated[
    str | None,
    typer.Option("--hosts", help="Comma list of HOST[:PORT] running `agent serve`, 2 or more."),
]
Sizes = Annotated[
    str,
    typer.Option(
        "--sizes",
        metavar="SIZES",
        help="Comma list of message sizes (4096, 64K, 1M, 1G), increasing, 4 B to 1 GiB.",
    ),
]
NetRepetitions = Annotated[
    int,
    typer.Option(
        "-r",
        "--repetitions",
        min=1,
        max=MAX_NETBENCH_REPETITIONS,
        help="Timed repetitions per size and link (the ± is theirs).",
    ),
]
NetWarmup = Annotated[
    int, typer.Option("-w", "--warmup", min=0, max=MAX_NETBENCH_WARMUP, help="Untimed first.")
]
RankTimeout = bounded_option(
    "--host-timeout",
    "Seconds the ranks may all go without progress (a cut link, a Mac asleep) before the run "
    "fails, naming the host and the step, and every rank is stopped. At most "
    f"{duration_text(MAX_HOST_TIMEOUT_S)}.",
    "seconds",
    MAX_HOST_TIMEOUT_S,
)
DEFAULT_SIZES_TEXT = ",".join(format_bytes(size).replace(" ", "")[:-2] for size in DEFAULT_SIZES)
"""1K,4K,…,256M."""


def netbench(
    hosts: NetbenchHosts = None,
    hostfile: Hostfile = None,
    sizes: Sizes = DEFAULT_SIZES_TEXT,
    repetitions: NetRepetitions = 5,
    warmup: NetWarmup = 1,
    port: RingPort = DEFAULT_STARTING_PORT,
    backend: Backend = AUTO,
    fmt: LinkReportFormat = "table",
    output: Output = None,
    connect_timeout: ConnectTimeout = 5.0,
    host_timeout: RankTimeout = DEFAULT_HOST_TIMEOUT_S,
    insecure: Insecure = False,
) -> None:
    """Link benchmark: MLX all_sum over the ring and send/recv over each link, slow link named.

    Every host's agent starts one rank (no ssh); the ring's ports PORT… must be open between
    the hosts. Latency, algorithm and bus bandwidth per size as nccl-tests prints them; a link
    whose best repetition at the largest size is 30 % or more below its siblings' is flagged
    (docs/distributed.md). The run is stored, however it ends (`coordinator runs`, `show`,
    `compare`). Exit 0 measured, 1 a host or rank failed or none progressed for
    --host-timeout (named in one line), 2 bad input, 130 interrupted.
    """
    check_output(output)
    try:
        plan_sizes = parse_sizes(sizes)
    except NetbenchError as exc:
        raise usage_error(f"--sizes: {exc}") from None
    if backend not in BACKENDS:
        raise usage_error(f"--backend {backend!r}: choose from {', '.join(BACKENDS)}")
    targets = hosts_named(hosts, hostfile)
    if targets is None or len(targets) < 2:
        raise usage_error("netbench needs two or more hosts: --hosts A,B[,C…] or --hostfile")
    if port + len(targets) - 1 > 65535:
        raise usage_error(f"--port {port}: {len(targets)} hosts would run past port 65535")
    if backend == JACCL:
        lacking = [target.name for target in targets or [] if target.rdma is None]
        if lacking:
            raise usage_error(
                f"--backend jaccl: no RDMA devices given for {', '.join(lacking)}: use a "
                "hostfile in mlx.launch's form with `rdma` for every host (docs/distributed.md)"
            )
    store = open_store()  # a data dir or store it cannot use: one line, before any host
    plan = NetbenchPlan(plan_sizes, repetitions, warmup, port, backend)
    run = NetbenchRun(plan, [RankWatch(target) for target in targets])
    settings = settings_for(insecure, connect_timeout, host_timeout)
    stop = threading.Event()
    try:
        with err.status(f"netbench over {len(targets)} hosts ({plan.backend} backend)…"):
            run_netbench(run, settings, stop, progress_lines(plan))
        report = store.load_report(stored(store, run))
    except KeyboardInterrupt:
        stop.set()
        stored(store, run)
        err.print("netbench: interrupted; every rank was asked to stop")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BackendMissing as exc:
        raise usage_error(shown(str(exc))) from None
    except NetbenchFailed as exc:
        stored(store, run)
        err.print(Text("error: ", style="red") + Text(shown(str(exc))))
        raise typer.Exit(EXIT_PARTIAL) from None
    finally:
        store.close()
    if fmt == "table" and output is None:
        print_rich(netbench_table(report))
    else:
        write_text(netbench_text(report, fmt), output)


def stored(store: RunStore, run: NetbenchRun) -> str:
    """Keep the run and say where (before any error line: that one ends the output)."""
    run_id = save_run(store, run)
    err.print(f"run {run_id} stored: `coordinator show {run_id}`", highlight=False)
    return run_id


def progress_lines(plan: NetbenchPlan, every_s: float = 10.0) -> Callable[[list[RankWatch]], None]:
    """The ranks' progress line (time counted from now) on stderr, at most once per `every_s`: a
    long run shows it is alive without flooding. `coordinator netbench` and doctor's links."""
    started, last = time.monotonic(), [0.0]

    def maybe(watches: list[RankWatch]) -> None:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            text = progress_text(watches, plan, time.monotonic() - started)
            err.print(text, highlight=False, markup=False)

    return maybe
