"""`coordinator netbench`: how fast the links between the hosts are, through MLX's own
distributed backend (the one a distributed fine-tune or model uses), with the slow link named."""

from __future__ import annotations

import math
import threading
import time
from typing import Annotated, Any

import typer
from rich.text import Text

from coordinator.commands.hosts import ConnectTimeout, Hostfile, Insecure, settings_for
from coordinator.commands.hosts import targets_from as hosts_named
from coordinator.netbench import (
    BackendMissing,
    NetbenchFailed,
    NetbenchPlan,
    RankWatch,
    run_netbench,
)
from shared.exit_codes import EXIT_INTERRUPTED, EXIT_PARTIAL
from shared.io.cli import data_home, emit, err, usage_error
from shared.io.options import TableFormat
from shared.netbench import (
    ALL_SUM,
    DEFAULT_SIZES,
    NetbenchError,
    format_bytes,
    parse_sizes,
    report_of,
)
from shared.rank_env import AUTO, BACKENDS, DEFAULT_STARTING_PORT, JACCL
from shared.rank_shapes import MAX_NETBENCH_REPETITIONS, MAX_NETBENCH_WARMUP
from shared.safe_text import shown
from shared.tables import WHOLE, FitTable

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
RingPort = Annotated[
    int,
    typer.Option(
        "--port",
        min=1024,
        max=65534,
        help="The ring's first port (mlx.launch's --starting-port): host i listens on PORT+i.",
    ),
]
Backend = Annotated[
    str,
    typer.Option(
        "--backend",
        metavar="|".join(BACKENDS).upper(),
        help="MLX's distributed backend: ring (TCP: Ethernet, Wi-Fi, Thunderbolt bridge), "
        "jaccl (RDMA over Thunderbolt 5, macOS 26.2+), auto (ring unless JACCL is set up).",
    ),
]
DEFAULT_SIZES_TEXT = ",".join(format_bytes(size).replace(" ", "")[:-2] for size in DEFAULT_SIZES)
"""1K,4K,…,256M."""
NETBENCH_FOLDS = ("algbw GB/s", "time µs")
"""What a narrow terminal drops first: bus bandwidth, the wire's scale, stays."""


def netbench(
    hosts: NetbenchHosts = None,
    hostfile: Hostfile = None,
    sizes: Sizes = DEFAULT_SIZES_TEXT,
    repetitions: NetRepetitions = 5,
    warmup: NetWarmup = 1,
    port: RingPort = DEFAULT_STARTING_PORT,
    backend: Backend = AUTO,
    fmt: TableFormat = "table",
    connect_timeout: ConnectTimeout = 5.0,
    insecure: Insecure = False,
) -> None:
    """Link benchmark: MLX all_sum over the ring and send/recv over each link, slow link named.

    Every host's agent starts one rank (no ssh); the ring's ports PORT… must be open between
    the hosts. Latency, algorithm and bus bandwidth per size as nccl-tests prints them; a link
    whose best repetition at the largest size is 30 % or more below its siblings' is flagged
    (docs/distributed.md). Exit 0 measured, 1 a host
    or rank failed (named in one line), 2 bad input, 130 interrupted.
    """
    data_home()
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
    plan = NetbenchPlan(plan_sizes, repetitions, warmup, port, backend)
    settings = settings_for(insecure, connect_timeout)
    stop = threading.Event()
    started = time.monotonic()

    def progress(watches: list[RankWatch]) -> None:
        states = ", ".join(f"{shown(w.target.name)} {w.state}" for w in watches)
        err.print(f"netbench {plan.job}: {states} ({time.monotonic() - started:.0f} s)")

    try:
        with err.status(f"netbench over {len(targets)} hosts ({plan.backend} backend)…"):
            used, found = run_netbench(targets, settings, plan, stop, progress_every(progress))
    except KeyboardInterrupt:
        stop.set()
        err.print("netbench: interrupted; every rank was asked to stop")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BackendMissing as exc:
        raise usage_error(shown(str(exc))) from None
    except NetbenchFailed as exc:
        err.print(Text("error: ", style="red") + Text(shown(str(exc))))
        raise typer.Exit(EXIT_PARTIAL) from None
    report = {
        "job": plan.job,
        "hosts": [target.name for target in targets],
        "backend": used,
        "port": plan.port,
        **report_of(found),
    }
    emit(report, fmt, netbench_table)


def progress_every(say: Any, every_s: float = 10.0) -> Any:
    """`say`, at most once per `every_s`: a long run shows it is alive without flooding."""
    last = [0.0]

    def maybe(watches: list[RankWatch]) -> None:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            say(watches)

    return maybe


def figure(mean: float | None, std: float | None) -> str:
    """Three significant figures, the ± to the same decimals."""
    if mean is None:
        return "N/A"
    decimals = max(0, 2 - math.floor(math.log10(abs(mean)))) if mean else 0
    return f"{mean:.{decimals}f}" + ("" if std is None else f" ± {std:.{decimals}f}")


def netbench_table(report: dict[str, Any]) -> FitTable:
    """One row per operation, link and size; the slow links named in the caption."""
    table = FitTable(title=f"mlx-fleet netbench ({report['backend']})", folds=NETBENCH_FOLDS)
    for name in ("operation", "over", "size", "time µs", "algbw GB/s", "busbw GB/s"):
        table.add_column(
            name, wrap=WHOLE, justify="left" if name in ("operation", "over") else "right"
        )
    slow = report["slow_links"]
    for row in report["results"]:
        flagged = row["operation"] != ALL_SUM and row["where"] in slow
        table.add_row(
            Text(row["operation"]),
            Text(shown(row["where"]) + (" SLOW" if flagged else "")),
            Text(format_bytes(row["size"])),
            Text(figure(row["time_us"], row["time_us_std"])),
            Text(figure(row["algbw_gbps"], row["algbw_gbps_std"])),
            Text(figure(row["busbw_gbps"], row["busbw_gbps_std"])),
            style="red" if flagged else None,
        )
    if slow:
        table.caption = "; ".join(f"slow link {shown(link)}: {why}" for link, why in slow.items())
    elif len(report["links_best_busbw_gbps"]) < 2:
        table.caption = "one link: no sibling to compare it with"
    else:
        table.caption = "no link 30 % or more below its siblings"
    return table
