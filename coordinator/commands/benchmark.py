"""`coordinator benchmark`, `coordinator resume` and `coordinator cancel`: one matrix on every
host, a run finished after its coordinator stopped, and jobs stopped from here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from coordinator.commands.hosts import (
    ConnectTimeout,
    Hostfile,
    HostRow,
    Hosts,
    HostTimeout,
    Insecure,
    KnownHosts,
    ask_each,
    settings_for,
    targets_from,
    targets_or_known,
)
from coordinator.embedded import EmbeddedAgent, EmbeddedAgentError
from coordinator.fleet import (
    CELL,
    COOLING,
    DEFAULT_HOST_TIMEOUT_S,
    DONE,
    HOST_OK,
    MACHINE,
    RECONNECTED,
    STARTED,
    UNREACHABLE,
    FleetResult,
    HostEvent,
    Settings,
    Target,
    resume_fleet,
    run_fleet,
)
from coordinator.store import RunStore, UnknownRunError
from shared import protocol as p
from shared.cool_start import CoolWait, cool_wait_line
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import check_output, data_home, emit, err, fail, show_report, usage_error
from shared.io.keys import own_keypair
from shared.io.options import (
    PLOT_EXTRA,
    MatrixOptions,
    Output,
    ReportFormat,
    RunId,
    SustainOptions,
    SustainPlot,
    TableFormat,
    check_sustained_repetitions,
    with_options,
)
from shared.io.signals import interrupted_exit_code, sigterm_as_interrupt
from shared.io.sqlite import StoreError
from shared.io.transport import AgentClient, AgentError
from shared.matrix import MatrixError
from shared.results import failed_cells
from shared.safe_text import DETAIL_CAP, shown


class FleetProgress:
    """One Rich progress bar per host on stderr, fed by the fleet's events."""

    def __init__(self, names: list[str]) -> None:
        self.unreachable: set[str] = set()
        self.devices: dict[str, str] = {}
        self.progress = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            console=err,
            transient=True,
        )
        self.tasks: dict[str, TaskID] = {
            name: self.progress.add_task(f"{name}: connecting", total=None) for name in names
        }

    def __call__(self, event: HostEvent) -> None:
        task = self.tasks[event.host]
        if event.kind == MACHINE:
            self.devices[event.host] = shown(event.data.get("device") or "?")
            self.progress.update(task, description=f"{event.host}: {self.devices[event.host]}")
        elif event.kind == STARTED:
            self.progress.update(task, total=len(event.data["cells"]))
        elif event.kind == COOLING:
            self._cooling(event.host, task, CoolWait.from_dict(event.data))
        elif event.kind == CELL:
            self.progress.advance(task)
        elif event.kind == UNREACHABLE:
            self.progress.update(task, description=f"{event.host}: unreachable, reconnecting")
            if event.host not in self.unreachable:  # a line per loss, not per attempt
                self.unreachable.add(event.host)
                err.print(
                    f"{event.host}: unreachable ({shown(event.data['error'], DETAIL_CAP)}); "
                    "reconnecting",
                    highlight=False,
                    markup=False,
                )
        elif event.kind == RECONNECTED:
            self.unreachable.discard(event.host)
            self.progress.update(task, description=f"{event.host}: reconnected")
            err.print(f"{event.host}: reconnected", highlight=False, markup=False)
        elif event.kind == DONE:
            outcome = event.data["status"] if event.data["status"] == HOST_OK else "FAILED"
            self.progress.update(task, description=f"{event.host}: {outcome}")
            if event.data["error"]:
                err.print(
                    f"{event.host}: {shown(event.data['error'], DETAIL_CAP)}",
                    highlight=False,
                    markup=False,
                )

    def _cooling(self, host: str, task: TaskID, wait: CoolWait) -> None:
        """The bar says the host waits to cool; a wait that ends hot gets a line of its own."""
        line = cool_wait_line(wait)
        if not wait.done:
            self.progress.update(task, description=f"{host}: {line}")
            return
        self.progress.update(task, description=f"{host}: {self.devices.get(host, '?')}")
        if wait.hot:
            err.print(f"{host}: {line}", highlight=False, markup=False)


@with_options
def benchmark(
    matrix: MatrixOptions,
    sustained: SustainOptions,
    fmt: ReportFormat = "table",
    output: Output = None,
    plot: SustainPlot = None,
    hosts: Hosts = None,
    hostfile: Hostfile = None,
    connect_timeout: ConnectTimeout = 5.0,
    host_timeout: HostTimeout = DEFAULT_HOST_TIMEOUT_S,
    insecure: Insecure = False,
) -> None:
    """Run one benchmark matrix on every host at once; one table, the fastest host marked.

    --model paths are directories on each agent's own disk. A host that goes silent mid-run
    is reconnected for --host-timeout seconds; a run cut short (Ctrl-C, SIGTERM, a host lost)
    prints the `coordinator resume` command that completes it from the agents' journals.
    With --sustain every host runs each cell for the duration at once, window by window, and
    --plot draws tok/s, °C and watts over time per host.
    """
    check_output(output)
    plan = sustained.plan()
    check_plot(plot, plan is not None)
    try:
        matrix_spec = matrix.spec()
    except MatrixError as exc:
        raise usage_error(str(exc)) from None
    check_sustained_repetitions(matrix_spec, plan)
    spec = matrix_spec.to_dict()
    sustain = plan.to_dict() if plan else None
    targets = targets_from(hosts, hostfile)
    with open_store() as store:
        if targets is None:
            keypair = own_keypair()
            try:
                with EmbeddedAgent(keypair) as local:
                    local_target = Target("local", local.address, local.server_key)
                    settings = Settings(keypair, connect_timeout, host_timeout)
                    result = drive(
                        [local_target.name],
                        lambda watch: run_fleet(
                            [local_target], spec, store, settings, watch, sustain
                        ),
                    )
            except EmbeddedAgentError as exc:
                raise fail(str(exc), EXIT_PARTIAL) from None
        else:
            settings = settings_for(insecure, connect_timeout, host_timeout)
            result = drive(
                [t.name for t in targets],
                lambda watch: run_fleet(targets, spec, store, settings, watch, sustain),
            )
        report = store.load_report(result.run_id)
    if plot is not None:
        draw_sustain(report, plot)
    finish(result, report, fmt, output, resumable=targets is not None)


def check_plot(plot: Path | None, sustained: bool) -> None:
    """Refuse a --plot that cannot be drawn before any host runs anything."""
    if plot is None:
        return
    if not sustained:
        raise usage_error("--plot draws a sustained run: give --sustain DURATION too")
    check_output(plot, "--plot")
    try:
        import coordinator.sustain_plot  # noqa: F401 - only checking that matplotlib is there
    except ImportError as exc:
        if not (exc.name or "").startswith("matplotlib"):
            raise
        raise usage_error(f"--plot needs matplotlib, the `plot` extra: {PLOT_EXTRA}") from None


def draw_sustain(report: dict[str, Any], plot: Path) -> None:
    """The plot of what the hosts measured; a run without one window says so instead."""
    from coordinator.sustain_plot import write_sustain_plot

    try:
        write_sustain_plot(report, plot)
    except ValueError as exc:
        err.print(f"--plot: nothing drawn: {exc}", highlight=False, markup=False)
        return
    err.print(f"wrote {plot}", highlight=False)


@with_options
def resume(
    run: RunId,
    fmt: ReportFormat = "table",
    output: Output = None,
    connect_timeout: ConnectTimeout = 5.0,
    host_timeout: HostTimeout = DEFAULT_HOST_TIMEOUT_S,
    insecure: Insecure = False,
) -> None:
    """Finish a run whose coordinator stopped (killed, asleep, Ctrl-C): reconnect to every
    host whose job it recorded, fetch every cell the run lacks from the agent's journal, follow
    a job still running to its end, and print the completed table. No cell is kept twice.

    A host whose job never started cannot be resumed; the embedded local agent of a run
    without --hosts is gone with its coordinator."""
    check_output(output)
    settings = settings_for(insecure, connect_timeout, host_timeout)
    with open_store() as store:
        try:
            stored = store.resumable(run)
        except UnknownRunError as exc:
            raise usage_error(str(exc)) from None
        names = [host.name for host in stored.hosts if host.job is not None]
        if not names:
            raise usage_error(f"run {stored.id}: no host's job started, nothing to resume")
        result = drive(names, lambda watch: resume_fleet(stored.id, store, settings, watch))
        report = store.load_report(result.run_id)
    finish(result, report, fmt, output, resumable=True)


def open_store() -> RunStore:
    """The run store, after the data dir's one check: a bad one is one line before any host runs."""
    data_home()
    try:
        return RunStore()
    except StoreError as exc:
        raise usage_error(str(exc)) from None


def drive(names: list[str], run: Any) -> FleetResult:
    """`run(observer)` with a progress bar per host, SIGTERM taken as Ctrl-C (the jobs are
    cancelled and what arrived is kept)."""
    progress = FleetProgress(names)
    with sigterm_as_interrupt(), progress.progress:
        return run(progress)


def finish(
    result: FleetResult, report: dict[str, Any], fmt: str, output: Any, resumable: bool
) -> None:
    """The report, where it is kept, how to finish it if it can be, and the exit code."""
    show_report(report, fmt, output)
    err.print(f"run {result.run_id} stored: `coordinator show {result.run_id}`", highlight=False)
    if resumable and result.resumable:
        err.print(
            f"some cells may still be on the agents: `coordinator resume {result.run_id}` "
            f"fetches them (`coordinator cancel {result.run_id}` stops the jobs)",
            highlight=False,
            markup=False,
        )
    if result.interrupted:
        raise typer.Exit(interrupted_exit_code())
    if not result.hosts_ok or failed_cells(report["cells"]):
        raise typer.Exit(EXIT_PARTIAL)


# --- cancel -------------------------------------------------------------------------------------

CANCELLED, NOT_RUNNING, UNREACHABLE_HOST, NO_JOB = "cancelled", "not running", "unreachable", "none"


def cancel(
    run: Annotated[
        str | None,
        typer.Argument(help="A run id or unique prefix: cancel its hosts' jobs."),
    ] = None,
    hosts: KnownHosts = None,
    hostfile: Hostfile = None,
    fmt: TableFormat = "table",
    connect_timeout: ConnectTimeout = 5.0,
    insecure: Insecure = False,
) -> None:
    """Cancel benchmark jobs: those of RUN on each of its hosts, or whatever job runs on
    --hosts. Each host is reported cancelled, not running (the job had ended), none (no job
    ran) or unreachable. The cells finished so far stay in the agents' journals.

    Exit 0 when every host answered, 1 otherwise."""
    if (run is None) == (hosts is None and hostfile is None):
        raise usage_error("give a run id, or --hosts / --hostfile, to cancel")
    settings = settings_for(insecure, connect_timeout)
    if run is not None:
        with open_store() as store:
            try:
                stored = store.resumable(run)
            except UnknownRunError as exc:
                raise usage_error(str(exc)) from None
        jobs = [(Target(h.name, h.address, h.server_key), h.job) for h in stored.hosts if h.job]
        if not jobs:
            raise usage_error(f"run {stored.id}: no host's job started, nothing to cancel")
    else:
        jobs = [(target, None) for target in targets_or_known(hosts, hostfile)]
    job_of = {target.name: job for target, job in jobs}
    rows = ask_each(
        [target for target, _ in jobs],
        settings,
        lambda target: {"job": job_of[target.name], "result": UNREACHABLE_HOST},
        cancel_on,
        cancel_refused,
    )
    emit(rows, fmt, cancel_table)
    if any(row["result"] == UNREACHABLE_HOST for row in rows):
        raise typer.Exit(EXIT_PARTIAL)


def cancel_on(client: AgentClient, row: HostRow) -> None:
    """Cancel the row's job (the host's running job when None) and say how it went."""
    if row["job"] is None:
        row["job"] = client.request("ping", timeout=client.connect_timeout)["job"]
    if row["job"] is None:
        row["result"] = NO_JOB
        return
    client.request("bench.cancel", {"job": row["job"]})
    row["result"] = CANCELLED


def cancel_refused(exc: AgentError, row: HostRow) -> None:
    row.update(result=NOT_RUNNING if exc.code == p.NOT_RUNNING else "refused", error=str(exc))


def cancel_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="mlx-fleet cancel", title_justify="left")
    for name in ("host", "job", "result", "why"):
        table.add_column(name, overflow="fold")
    for row in rows:
        style = "red" if row["result"] in (UNREACHABLE_HOST, "refused") else None
        why = Text(shown(row["error"] or "", DETAIL_CAP))
        table.add_row(row["host"], Text(shown(row["job"] or "")), row["result"], why, style=style)
    return table
