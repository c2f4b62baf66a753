"""`coordinator stage` (a model downloaded once, fanned out agent to agent as a tree, verified,
resumable) and `coordinator models` (what every host holds): docs/staging.md."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.text import Text

from coordinator.commands.hosts import FleetOptions, HostRow, ask_each
from coordinator.hosts.link import Settings, Target
from coordinator.runs.staging import (
    HELD,
    ORIGIN,
    STAGED,
    StageEvent,
    StageRefused,
    StageResult,
    StageRun,
)
from coordinator.runs.staging_origin import origin_for, resolve_model
from shared.benchmark.matrix import hf_model_id
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import emit, err, usage_error
from shared.io.options import TableFormat, at_least_zero, with_options
from shared.io.signals import interrupted_exit_code, sigterm_as_interrupt
from shared.io.transport import AgentClient
from shared.safe_text import DETAIL_CAP, shown
from shared.staging.fleet import (
    MISSING,
    byte_text,
    differing_copy,
    models_matrix,
    named_copy,
    rate_text,
    state_text,
)
from shared.staging.tree import Tree, TreeError
from shared.tables import TEXT, WHOLE, FitTable

DEFAULT_STAGE_HOST_TIMEOUT_S = 30.0
"""A host silent this long during a stage is lost: its receivers take another source."""
VERIFY_TIMEOUT_S = 3600.0
"""`models --verify` hashes every file of every model a host holds."""

ModelArgument = Annotated[
    str,
    typer.Argument(
        metavar="MODEL",
        help="A Hugging Face id ORG/NAME[@REVISION], or a model directory on this machine.",
        show_default=False,
    ),
]
StagedAs = Annotated[
    str | None,
    typer.Option(
        "--as",
        help="The id a directory's copy is staged under (ORG/NAME; default local/FOLDER): "
        "what `--model` then names on the hosts.",
    ),
]
FromHost = Annotated[
    str | None,
    typer.Option(
        "--from",
        help="The host that downloads an id this machine's Hugging Face cache does not hold "
        "(default: the first of --hosts).",
    ),
]
Restage = Annotated[
    bool,
    typer.Option("--restage", help="Replace a host's copy that differs (mismatch) too."),
]
StageHostTimeout = Annotated[
    float,
    typer.Option(
        "--host-timeout",
        callback=at_least_zero("--host-timeout", "seconds", 3600.0),
        help="Seconds a silent host is reconnected before it is lost and the hosts it served "
        "take another source (at most 1 h).",
    ),
]
Verify = Annotated[
    bool,
    typer.Option("--verify", help="Hash every file again (else only files changed on disk)."),
]


class StageProgress:
    """A bar per host on stderr (bytes of the model, the rate, where it comes from); where
    stderr is not a terminal, a line as each host starts, fails and finishes instead."""

    def __init__(self, hosts: list[str]) -> None:
        description = TextColumn("{task.description}", markup=False)  # agents' words in it
        self.progress = Progress(BarColumn(), description, console=err, transient=True)
        self.tasks: dict[str, TaskID] = {
            host: self.progress.add_task(shown(host), total=None) for host in hosts
        }
        self.sources: dict[str, str | None] = {}

    def _say(self, text: str) -> None:
        err.print(Text(text), highlight=False, soft_wrap=True)

    def __call__(self, event: StageEvent) -> None:
        task = event.task or {}
        host = shown(event.host)
        if event.kind == "line":
            self._say(f"{host}: {shown(event.line or '', DETAIL_CAP)}")
            return
        if event.kind == "prepare":
            line = f"{host}: {state_text(task)} {shown(task['model'])}"
            if event.host not in self.tasks:
                self.tasks[event.host] = self.progress.add_task(host, total=None)
            self.progress.update(
                self.tasks[event.host],
                description=line,
                completed=task["bytes"],
                total=task["total"],
            )
            if task["state"] == "ready":
                digest = shown(task["digest"][:12])
                self._say(f"{line}: {byte_text(task['total'])}, digest {digest}")
            return
        source = shown(task.get("source") or "?")
        line = (
            f"{host} ← {source}: {byte_text(task['bytes'])} of {byte_text(task['total'])}"
            f", {rate_text(task['rate'])}{' (capped: a job runs)' if task['capped'] else ''}"
        )
        self.progress.update(
            self.tasks[event.host], description=line, completed=task["bytes"], total=task["total"]
        )
        if self.sources.get(event.host) != task.get("source") and not err.is_terminal:
            self._say(f"{host}: fetching from {source}")
        self.sources[event.host] = task.get("source")
        if event.kind == "done":
            resumed = f", {byte_text(task['resumed'])} resumed" if task["resumed"] else ""
            self._say(f"{host}: staged {byte_text(task['total'])} from {source}{resumed}")


def stage_table(result: dict[str, Any]) -> FitTable:
    """One row per host: its state, where its copy came from, bytes, time and rate."""
    revision = (result["revision"] or "?")[:12]
    table = FitTable(
        title=f"mlx-fleet stage {shown(result['model'])} @ {shown(revision)}", title_justify="left"
    )
    for name in ("host", "state", "from", "bytes", "resumed", "seconds", "rate"):
        table.add_column(name, wrap=WHOLE, justify="left" if name in ("host", "state") else "right")
    table.add_column("why", wrap=TEXT)
    for row in result["hosts"]:
        good = row["state"] in (STAGED, HELD)
        table.add_row(
            Text(shown(row["host"])),
            Text(row["state"], style="green" if good else "bold red"),
            Text(shown(row["source"] or "")),
            byte_text(row["bytes"]),
            byte_text(row["resumed"]) if row["resumed"] else "",
            "" if row["seconds"] is None else f"{row['seconds']:.1f}",
            rate_text((row["bytes"] - row["resumed"]) / row["seconds"] if row["seconds"] else None)
            if row["state"] == STAGED
            else "",
            Text(shown(row["error"] or "", DETAIL_CAP)),
        )
    size = "?" if result["size"] is None else byte_text(result["size"])
    digest = shown((result["digest"] or "?")[:16])
    table.caption = Text(
        f"{size}, digest {digest}, from {shown(result['origin'])}, {result['seconds']:.1f} s"
    )
    table.caption_justify = "left"
    return table


@with_options
def stage(
    model: ModelArgument,
    fleet: FleetOptions,
    staged_as: StagedAs = None,
    source_host: FromHost = None,
    restage: Restage = False,
    fmt: TableFormat = "table",
    host_timeout: StageHostTimeout = DEFAULT_STAGE_HOST_TIMEOUT_S,
) -> None:
    """Copy a model to every host once, agent to agent as a tree (docs/staging.md).

    MODEL is resolved once: a directory or this machine's Hugging Face cache is served from
    here; any other id is downloaded by one host (--from). Each host that holds the model
    whole then serves the next, so N hosts take about log2(N+1) rounds of one copy each.
    Every file is verified chunk by chunk and whole before it is visible (in the Hugging Face
    cache layout: `HF_HUB_OFFLINE=1` and `--model ID` find it). Ctrl-C or a lost host leaves
    what arrived verified: running the same command again resumes it. Exit 0 when every host
    holds it, 1 when one does not, 2 for bad input (nothing moved).
    """
    targets = fleet.targets()
    try:
        Tree.start(ORIGIN, [target.name for target in targets])
    except TreeError as exc:
        raise usage_error(str(exc)) from None
    settings = fleet.settings(host_timeout)
    try:
        resolved = resolve_model(model, staged_as, from_cache=source_host is None)
        progress = StageProgress([t.name for t in targets])
        with origin_for(resolved, targets, settings, source_host) as origin:
            run = StageRun(
                resolved.model, resolved.name, targets, origin, settings, progress, restage
            )
            with sigterm_as_interrupt(), progress.progress:
                result = run.run()
    except StageRefused as exc:
        for line in exc.lines[:-1]:
            err.print(Text("error: ", style="red") + Text(shown(line, DETAIL_CAP)))
        raise usage_error(shown(exc.lines[-1], DETAIL_CAP)) from None
    finish_stage(result, fmt)


def finish_stage(result: StageResult, fmt: str) -> None:
    """The report (none for `none`: printed already), the resume hint and the exit code."""
    if fmt != "none":
        emit(result.to_dict(), fmt, stage_table)
    if result.interrupted:
        err.print(
            "interrupted: every fetch under way was cancelled and keeps what it verified; run "
            "the same command again to resume",
            highlight=False,
        )
        raise typer.Exit(interrupted_exit_code())
    if result.bad_input:
        for line in result.bad_input[:-1]:
            err.print(Text("error: ", style="red") + Text(shown(line, DETAIL_CAP)))
        raise usage_error(shown(result.bad_input[-1], DETAIL_CAP))
    if not result.ok:
        raise typer.Exit(EXIT_PARTIAL)


# --- models -------------------------------------------------------------------------------------


def models_table(data: dict[str, Any]) -> FitTable:
    """Model (with its revision) down, hosts across: present, partial (%), missing, mismatch;
    the caption names each host that could not be asked."""
    hosts = [host["host"] for host in data["hosts"]]
    table = FitTable(title="mlx-fleet models", title_justify="left")
    table.add_column("model", wrap=TEXT)
    for host in hosts:
        table.add_column(shown(host), wrap=WHOLE)
    for entry in data["models"]:
        cells = []
        for host in hosts:
            text = entry["hosts"][host]
            style = {"present": "green", MISSING: "dim", "partial": "yellow"}.get(
                text.split(" ")[0], "bold red"
            )
            cells.append(Text(text, style=style))
        table.add_row(Text(shown(entry["model"])), *cells)
    failed = [
        f"{shown(h['host'])}: {shown(h['error'], DETAIL_CAP)}" for h in data["hosts"] if h["error"]
    ]
    if failed:
        table.caption = Text("\n".join(failed))
        table.caption_justify = "left"
    return table


def list_on(client: AgentClient, row: HostRow, verify: bool) -> None:
    timeout = VERIFY_TIMEOUT_S if verify else 600.0
    listed = client.request("models.list", {"verify": verify}, timeout=timeout)
    row["store"], row["models"] = listed["store"], listed["models"]


@with_options
def models(fleet: FleetOptions, verify: Verify = False, fmt: TableFormat = "table") -> None:
    """The models every host holds, one table: present, partial (%), missing or mismatch.

    Model down, host across: `partial (N %)` is a transfer not finished (the next stage resumes
    it), `mismatch` a copy whose file differs from the manifest it was staged from. Exit 1 when
    a host could not be asked."""
    rows = fleet.ask_each(
        lambda _: {"store": None, "models": []}, lambda client, row: list_on(client, row, verify)
    )
    data = {"hosts": rows, "models": models_matrix(rows)}
    emit(data, fmt, models_table)
    if any(row["error"] for row in rows):
        raise typer.Exit(EXIT_PARTIAL)


# --- a benchmark's models -----------------------------------------------------------------------


def hub_models(models: list[str]) -> list[str]:
    """The matrix's models that are Hugging Face ids (not configs, not paths)."""
    return [model for model in dict.fromkeys(models) if hf_model_id(model) is not None]


def check_copies(models: list[str], targets: list[Target], settings: Settings) -> None:
    """Before a matrix or group starts any job: every host holding a copy of a --model id holds
    the same bytes (the same manifest digest) and a copy whose file changed since it was staged
    is found; else one line naming the host and the file, exit 2. A host that cannot say (an
    older agent, unreachable) is no difference: its run says what happens to it."""
    ids = hub_models(models)
    if not ids or not targets:
        return
    rows = ask_each(
        targets,
        settings,
        lambda _: {"store": None, "models": []},
        lambda client, row: list_on(client, row, False),
    )
    for model in ids:
        model_id = hf_model_id(model)
        assert model_id is not None
        held = {
            row["host"]: named_copy(row["models"], model_id.repo, model_id.revision)
            for row in rows
            if not row["error"]
        }
        refusal = differing_copy(model, held)
        if refusal is not None:
            raise usage_error(f"--model {shown(refusal, DETAIL_CAP)}")


def stage_for_run(models: list[str], targets: list[Target], settings: Settings) -> None:
    """`coordinator benchmark --stage`: each --model id staged to the run's hosts first (from
    this machine's cache, else downloaded by the first host), with the stage's progress and
    table on stderr; a stage that leaves a host without it ends the command there (its exit
    code). A directory is named by the id it is staged under: `coordinator stage DIR --as ID`."""
    staged = hub_models(models)
    if any(m.startswith(("/", ".", "~")) or Path(m).expanduser().is_dir() for m in models):
        raise usage_error(
            "--stage stages Hugging Face ids ORG/NAME[@REV]: stage a directory with "
            "`coordinator stage DIR --as ORG/NAME`, then run --model ORG/NAME"
        )
    if not staged:
        raise usage_error("--stage: no --model is a Hugging Face id ORG/NAME[@REV]")
    for model in staged:
        try:
            resolved = resolve_model(model, None)
            progress = StageProgress([t.name for t in targets])
            with origin_for(resolved, targets, settings, None) as origin:
                run = StageRun(resolved.model, resolved.name, targets, origin, settings, progress)
                with sigterm_as_interrupt(), progress.progress:
                    result = run.run()
        except StageRefused as exc:
            raise usage_error(shown(exc.lines[0], DETAIL_CAP)) from None
        err.print(stage_table(result.to_dict()))
        finish_stage(result, "none")
