"""`coordinator benchmark`, `coordinator resume` and `coordinator cancel`: one matrix on every
host, a run finished after its coordinator stopped, and jobs stopped from here."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
)
from rich.text import Text

from coordinator.commands.group_check import GroupPlan, GroupRefused, prepare
from coordinator.commands.hosts import (
    Backend,
    ConnectTimeout,
    FleetOptions,
    Hostfile,
    HostRow,
    Hosts,
    HostTimeout,
    Insecure,
    RingPort,
    ask_each,
    settings_for,
    targets_and_groups,
)
from coordinator.commands.stage import check_copies, stage_for_run
from coordinator.hosts.link import DEFAULT_HOST_TIMEOUT_S, Settings, Target
from coordinator.runs.conditions import conditions, cordon_line
from coordinator.runs.driver import (
    CELL,
    COOLING,
    DONE,
    HOST_OK,
    MACHINE,
    MODEL,
    PAUSE,
    PHASE,
    RECONNECTED,
    STARTED,
    THERMAL,
    UNREACHABLE,
    HostEvent,
)
from coordinator.runs.embedded import EmbeddedAgent, EmbeddedAgentError
from coordinator.runs.fleet import FleetResult, resume_fleet, run_fleet
from coordinator.runs.group_driver import GroupTarget
from coordinator.runs.health import with_health
from coordinator.runs.store import RunHost, RunStore, UnknownRunError
from shared.benchmark.matrix import MatrixError, resolve_bits
from shared.benchmark.results import failed_cells
from shared.benchmark.status import (
    PauseView,
    activity_label,
    baseline_label,
    build_label,
    no_sensor_warning,
    pause_label,
    pause_line,
    quantized_cpu_warning,
)
from shared.cooling.cool_start import CoolWait, cool_wait_line
from shared.distributed.group import SHARDINGS, TENSOR
from shared.distributed.rank_env import AUTO, BACKENDS, DEFAULT_STARTING_PORT
from shared.distributed.stragglers import straggler_line
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import check_output, data_home, emit, err, fail, usage_error
from shared.io.given import path_given
from shared.io.keys import own_keypair
from shared.io.options import (
    PLOT_EXTRA,
    Label,
    MatrixOptions,
    Output,
    ReportFormat,
    RunId,
    ServingOptions,
    SustainOptions,
    TableFormat,
    check_sustained_repetitions,
    one_of,
    with_options,
)
from shared.io.report_output import show_report
from shared.io.signals import interrupted_exit_code, sigterm_as_interrupt
from shared.io.sqlite import StoreError
from shared.io.transport import AgentClient, AgentError
from shared.safe_text import DETAIL_CAP, shown
from shared.tables import TEXT, WHOLE, FitTable
from shared.wire import protocol as p

Sharding = Annotated[
    str,
    typer.Option(
        "--sharding",
        metavar="|".join(SHARDINGS).upper(),
        callback=one_of(SHARDINGS, "sharding"),
        help="How a group splits each model: tensor (every layer's heads and MLP across the "
        "ranks, as mlx-lm's shard()) or pipeline (each rank a run of whole layers).",
    ),
]
StageFirst = Annotated[
    bool,
    typer.Option(
        "--stage",
        help="Stage each --model id (or directory here) to the hosts first, as `coordinator "
        "stage` does, then run on the staged copies.",
    ),
]
IncludeCordoned = Annotated[
    bool,
    typer.Option(
        "--include-cordoned",
        help="Run hosts that carry a condition (`coordinator health`) too; without it each "
        "cordoned host, and each group with one, is skipped with one line.",
    ),
]
SustainPlot = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        help="With --sustain: also draw tok/s, °C and watts over time per host into this PNG "
        f"(needs matplotlib: {PLOT_EXTRA}).",
        parser=path_given("--plot", ".png"),
    ),
]


@dataclass
class HostStatus:
    """What one host's label says: what it does and since when, or the pause it is in."""

    name: str
    text: str = "connecting"
    since: float = field(default_factory=time.monotonic)
    timed: bool = False
    """Whether the label shows the time since `since` (a build, the baseline, a cell)."""
    pause: PauseView | None = None
    heard: float = 0.0
    """When `pause` was heard: its paused_s goes on counting from then."""

    def doing(self, text: str, timed: bool = True) -> None:
        self.text, self.timed, self.since = text, timed, time.monotonic()

    def label(self, now: float) -> str:
        if self.pause is not None:
            return f"{self.name}: {pause_label(self.pause, self.pause.paused_s + now - self.heard)}"
        if self.timed:
            return f"{self.name}: {activity_label(self.text, now - self.since)}"
        return f"{self.name}: {self.text}"


class StatusColumn(ProgressColumn):
    """A host's label, made at every refresh so its clock ticks (task field `status`)."""

    def render(self, task: Task) -> Text:
        status = task.fields.get("status")
        return Text(status.label(time.monotonic()) if status else task.description)


class FleetProgress:
    """One Rich progress bar per host on stderr, fed by the fleet's events: each label names the
    cell running (or the model building, the idle baseline, a cooling pause) and for how long.
    Where stderr is not a terminal each of those gets a line instead."""

    def __init__(self, names: list[str], bits: list[int | None] | None = None) -> None:
        self.unreachable: set[str] = set()
        self.devices: dict[str, str] = {}
        self.bits = list(bits or [])
        self.cells: dict[str, list[str]] = {}
        self.done: dict[str, int] = {name: 0 for name in names}
        self.status = {name: HostStatus(name) for name in names}
        self.progress = Progress(
            SpinnerColumn(),
            StatusColumn(),
            BarColumn(),
            MofNCompleteColumn(),
            console=err,
            transient=True,
        )
        self.tasks: dict[str, TaskID] = {
            name: self.progress.add_task(name, total=None, status=self.status[name])
            for name in names
        }

    def _say(self, host: str, line: str) -> None:
        err.print(f"{host}: {line}", highlight=False, markup=False)

    def _next_cell(self, host: str) -> None:
        cells, done = self.cells.get(host) or [], self.done[host]
        if done < len(cells):
            self.status[host].doing(shown(cells[done]))

    def __call__(self, event: HostEvent) -> None:
        task, host, status = self.tasks[event.host], event.host, self.status[event.host]
        if event.kind == MACHINE:
            self.devices[host] = shown(event.data.get("device") or "?")
            status.doing(self.devices[host], timed=False)
            slow = quantized_cpu_warning(self.bits, event.data.get("backend"))
            if slow:
                self._say(host, slow)
        elif event.kind == THERMAL:
            warning = no_sensor_warning(str(event.data.get("source")))
            if warning:
                self._say(host, warning)
        elif event.kind == STARTED:
            self.cells[host] = list(event.data["cells"])
            self.progress.update(task, total=len(event.data["cells"]))
            self._next_cell(host)
        elif event.kind == PHASE:
            self._phase(host, event.data)
        elif event.kind == MODEL:
            self._next_cell(host)
        elif event.kind == PAUSE:
            self._pause(host, PauseView.from_dict(event.data))
        elif event.kind == COOLING:
            self._cooling(host, CoolWait.from_dict(event.data))
        elif event.kind == CELL:
            self.done[host] += 1
            self.progress.advance(task)
            self._next_cell(host)
            straggler = straggler_line(event.data["record"])
            if straggler:  # named as the group runs, not only in the table after
                self._say(host, shown(straggler, DETAIL_CAP))
        elif event.kind == UNREACHABLE:
            status.doing("unreachable, reconnecting", timed=False)
            if host not in self.unreachable:  # a line per loss, not per attempt
                self.unreachable.add(host)
                self._say(
                    host,
                    f"unreachable ({shown(event.data['error'], DETAIL_CAP)}); reconnecting",
                )
        elif event.kind == RECONNECTED:
            self.unreachable.discard(host)
            status.doing("reconnected", timed=False)
            self._say(host, "reconnected")
        elif event.kind == DONE:
            status.pause = None
            outcome = event.data["status"] if event.data["status"] == HOST_OK else "FAILED"
            status.doing(outcome, timed=False)
            if event.data["error"]:
                self._say(host, shown(event.data["error"], DETAIL_CAP))

    def _phase(self, host: str, phase: dict[str, Any]) -> None:
        """A model build or the idle baseline starts: the label says which, and for how long."""
        if phase["kind"] == "build":
            text = build_label(shown(phase.get("label") or "?"), phase.get("param_count"))
        else:
            text = "idle baseline"
        self.status[host].doing(text)
        if not err.is_terminal:
            seconds = phase.get("seconds")
            planned = baseline_label(seconds) if seconds is not None else text
            self._say(host, f"{planned if phase['kind'] == 'baseline' else text}…")

    def _pause(self, host: str, pause: PauseView) -> None:
        """A cooling pause: in the label while it lasts, a `cooling:` line as it starts and ends."""
        status = self.status[host]
        if pause.done:
            if status.pause is not None:
                self._say(host, pause_line(pause))
            status.pause = None
            return
        if status.pause is None:
            self._say(host, pause_line(pause))
        status.pause, status.heard = pause, time.monotonic()

    def _cooling(self, host: str, wait: CoolWait) -> None:
        """The bar says the host waits to cool; a wait that ends hot gets a line of its own."""
        line = cool_wait_line(wait)
        if not wait.done:
            self.status[host].doing(line, timed=False)
            return
        self._next_cell(host)
        if wait.hot:
            self._say(host, line)


@with_options
def benchmark(
    matrix: MatrixOptions,
    serving: ServingOptions,
    sustained: SustainOptions,
    fmt: ReportFormat = "table",
    output: Output = None,
    label: Label = None,
    plot: SustainPlot = None,
    hosts: Hosts = None,
    hostfile: Hostfile = None,
    backend: Backend = AUTO,
    sharding: Sharding = TENSOR,
    port: RingPort = DEFAULT_STARTING_PORT,
    connect_timeout: ConnectTimeout = 5.0,
    host_timeout: HostTimeout = DEFAULT_HOST_TIMEOUT_S,
    insecure: Insecure = False,
    include_cordoned: IncludeCordoned = False,
    stage_first: StageFirst = False,
) -> None:
    """Run one benchmark matrix on every host at once; one table, the fastest host marked.

    --model paths are directories on each agent's own disk. A host that goes silent mid-run
    is reconnected for --host-timeout seconds; a run cut short (Ctrl-C, SIGTERM, a host lost)
    prints the `coordinator resume` command that completes it from the agents' journals.
    With --sustain every host runs each cell for the duration at once, window by window, and
    --plot draws tok/s, °C and watts over time per host.

    `mac1+mac2` in --hosts is a group: each cell runs as one job across both, over MLX's own
    distributed backend (--backend, --sharding; the ring listens on --port and up), its row
    beside each host's with its speed-up over the fastest member alone (docs/distributed.md).

    A --model id the hosts staged (`coordinator stage`, or --stage first) is read from their
    copies; a host whose copy differs from the others' is refused before any job starts.
    """
    check_output(output)
    plan = sustained.plan()
    check_plot(plot, plan is not None)
    try:
        matrix_spec = serving.apply(matrix.spec())
    except MatrixError as exc:
        raise usage_error(str(exc)) from None
    check_sustained_repetitions(matrix_spec, plan)
    spec = matrix_spec.to_dict()
    bits = [resolve_bits(m, b) for m in matrix_spec.models for b in matrix_spec.bits]
    sustain = plan.to_dict() if plan else None
    entries = targets_and_groups(hosts, hostfile)
    if entries is not None and not include_cordoned:
        entries = skip_cordoned(entries)
    targets = None
    if entries is None and stage_first:
        raise usage_error("--stage copies the models to --hosts: name them")
    if entries is not None:
        settings = settings_for(insecure, connect_timeout, host_timeout)
        members = list(
            {t.name: t for e in entries for t in (e if isinstance(e, tuple) else (e,))}.values()
        )
        if stage_first:
            stage_for_run(matrix_spec.models, members, settings)
        check_copies(matrix_spec.models, members, settings)
        targets = groups_checked(
            entries, spec, settings, GroupPlan(backend, sharding, port, host_timeout), plan
        )
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
                        bits,
                    )
            except EmbeddedAgentError as exc:
                raise fail(str(exc), EXIT_PARTIAL) from None
        else:
            result = drive(
                [t.name for t in targets],
                lambda watch: run_fleet(targets, spec, store, settings, watch, sustain),
                bits,
            )
        report = with_health(store, store.load_report(result.run_id))
    if plot is not None:
        draw_sustain(report, plot)
    finish(result, report, fmt, output, resumable=targets is not None, label=label)


def skip_cordoned(entries: list[Any]) -> list[Any]:
    """The hosts and groups named, less those with a cordoned host (one line each on stderr);
    exit 2 when nothing is left."""
    with open_store() as store:
        cordons = conditions(store)
    kept = []
    for entry in entries:
        members = entry if isinstance(entry, tuple) else (entry,)
        held = [member.name for member in members if member.name in cordons]
        if not held:
            kept.append(entry)
            continue
        label = shown("+".join(member.name for member in members))
        line = cordon_line(label, shown(held[0]), cordons[held[0]])
        err.print(line, highlight=False, markup=False)
    if not kept:
        raise usage_error("every host named is cordoned: `coordinator health` says why")
    return kept


def groups_checked(
    entries: list[Any], spec: dict[str, Any], settings: Settings, plan: GroupPlan, sustain: Any
) -> list[Any]:
    """The run's targets with every group checked with its members (group_check) and resolved:
    a group that cannot run is one line and exit 2 before any job starts."""
    groups = [entry for entry in entries if isinstance(entry, tuple)]
    if not groups:
        return entries
    if sustain is not None:
        raise usage_error("--sustain: a group's cells do not run sustained; list its hosts alone")
    serving = spec.get("serving")
    if serving is not None and serving.get("serve_url") is not None:
        raise usage_error("--serve-url is one server, not a group's: give --serve mlx_lm")
    if serving is not None and serving.get("serve") is None:
        raise usage_error(
            "a group serves through --serve mlx_lm only: the in-process engine does not "
            "run across ranks"
        )
    if plan.backend not in BACKENDS:
        raise usage_error(f"--backend {plan.backend!r}: choose from {', '.join(BACKENDS)}")
    largest = max(len(group) for group in groups)
    if plan.port + largest - 1 > 65535:
        raise usage_error(f"--port {plan.port}: {largest} ranks would run past port 65535")
    try:
        return prepare(entries, spec, settings, plan)
    except GroupRefused as exc:
        raise usage_error(str(exc)) from None


def check_plot(plot: Path | None, sustained: bool) -> None:
    """Refuse a --plot that cannot be drawn before any host runs anything."""
    if plot is None:
        return
    if not sustained:
        raise usage_error("--plot draws a sustained run: give --sustain DURATION too")
    check_output(plot, "--plot")
    try:
        import coordinator.reports.sustain_plot  # noqa: F401 - only checking that matplotlib is there
    except ImportError as exc:
        if not (exc.name or "").startswith("matplotlib"):
            raise
        raise usage_error(f"--plot needs matplotlib, the `plot` extra: {PLOT_EXTRA}") from None


def draw_sustain(report: dict[str, Any], plot: Path) -> None:
    """The plot of what the hosts measured; a run without one window says so instead."""
    from coordinator.reports.sustain_plot import write_sustain_plot

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
    label: Label = None,
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
        report = with_health(store, store.load_report(result.run_id))
    finish(result, report, fmt, output, resumable=True, label=label)


def open_store() -> RunStore:
    """The run store, after the data dir's one check: a bad one is one line before any host runs."""
    data_home()
    try:
        return RunStore()
    except StoreError as exc:
        raise usage_error(str(exc)) from None


def drive(names: list[str], run: Any, bits: list[int | None] | None = None) -> FleetResult:
    """`run(observer)` with a progress bar per host, SIGTERM taken as Ctrl-C (the jobs are
    cancelled and what arrived is kept)."""
    progress = FleetProgress(names, bits)
    with sigterm_as_interrupt(), progress.progress:
        return run(progress)


def resume_hint(result: FleetResult) -> str:
    """What is left on the agents and the commands for it. Interrupted, every job was asked to
    stop (bench.cancel): what is left is the cells finished before that which did not arrive,
    and a job whose agent did not hear the request (issue 42: the hint said "cancelled" and then
    "some cells may still be on the agents")."""
    run = result.run_id
    if result.interrupted:
        return (
            f"every job was asked to stop; `coordinator resume {run}` fetches the cells they "
            f"finished that did not arrive here, and `coordinator cancel {run}` stops a job "
            "whose agent did not hear (an unreachable host's)"
        )
    return (
        f"the jobs of the hosts that failed may still run: `coordinator resume {run}` fetches "
        f"their cells, `coordinator cancel {run}` stops them"
    )


def finish(
    result: FleetResult,
    report: dict[str, Any],
    fmt: str,
    output: Any,
    resumable: bool,
    label: str | None = None,
) -> None:
    """The report, where it is kept, how to finish it if it can be, and the exit code."""
    show_report(report, fmt, output, label)
    err.print(f"run {result.run_id} stored: `coordinator show {result.run_id}`", highlight=False)
    if resumable and result.resumable:
        err.print(resume_hint(result), highlight=False, markup=False)
    if result.interrupted:
        raise typer.Exit(interrupted_exit_code())
    if not result.hosts_ok or failed_cells(report["cells"]):
        raise typer.Exit(EXIT_PARTIAL)


# --- cancel -------------------------------------------------------------------------------------

CANCELLED, NOT_RUNNING, UNREACHABLE_HOST, NO_JOB = "cancelled", "not running", "unreachable", "none"


@with_options
def cancel(
    fleet: FleetOptions,
    run: Annotated[
        str | None,
        typer.Argument(help="A run id or unique prefix: cancel its hosts' jobs."),
    ] = None,
    fmt: TableFormat = "table",
) -> None:
    """Cancel benchmark jobs: those of RUN on each of its hosts, or whatever job runs on
    --hosts. Each host is reported cancelled, not running (the job had ended), none (no job
    ran) or unreachable. The cells finished so far stay in the agents' journals.

    Exit 0 when every host answered, 1 otherwise."""
    named = fleet.hosts is not None or fleet.hostfile is not None
    if run is not None and named:
        raise usage_error("give a run id or --hosts / --hostfile to cancel, not both")
    if run is None and not named:
        raise usage_error("give a run id, or --hosts / --hostfile, to cancel")
    settings = fleet.settings()
    if run is not None:
        with open_store() as store:
            try:
                stored = store.resumable(run)
            except UnknownRunError as exc:
                raise usage_error(str(exc)) from None
        jobs = [job for host in stored.hosts for job in stored_jobs(host)]
        if not jobs:
            raise usage_error(f"run {stored.id}: no host's job started, nothing to cancel")
    else:
        jobs = [(target, None) for target in fleet.targets()]
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


def stored_jobs(host: RunHost) -> list[tuple[Target, str]]:
    """The jobs a stored host ran: its own, or for a group each member's rank job, its row
    named `mac1 (rank 0 of mac1+mac2)`."""
    if host.group is None:
        return [(Target(host.name, host.address, host.server_key), host.job)] if host.job else []
    group, jobs = GroupTarget.from_stored(host.group)
    return [
        (replace(member, name=f"{member.name} (rank {rank} of {host.name})"), job)
        for rank, (member, job) in enumerate(zip(group.hosts, jobs, strict=True))
        if job is not None
    ]


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


def cancel_table(rows: list[dict[str, Any]]) -> FitTable:
    """Host, job id and result never wrap (shared.tables); why wraps in its cell."""
    table = FitTable(title="mlx-fleet cancel", title_justify="left")
    for name in ("host", "job", "result", "why"):
        table.add_column(name, wrap=TEXT if name == "why" else WHOLE)
    for row in rows:
        style = "red" if row["result"] in (UNREACHABLE_HOST, "refused") else None
        why = Text(shown(row["error"] or "", DETAIL_CAP))
        table.add_row(row["host"], Text(shown(row["job"] or "")), row["result"], why, style=style)
    return table
