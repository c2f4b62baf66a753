"""`agent models`: the models this Mac holds in its store (docs/protocol.md §19, The store),
whole, partly staged or differing from what was staged, and removing them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from shared.exit_codes import EXIT_PARTIAL
from shared.io.app import command_group, examples
from shared.io.cli import emit, err, usage_error
from shared.io.given import path_given
from shared.io.options import TABLE_OR_JSON, output_format
from shared.safe_text import shown
from shared.staging.shapes import MISMATCH, PARTIAL
from shared.tables import TEXT, FitTable

models_app = command_group("The models this Mac holds: staged, downloaded, partly staged.")
ModelsDir = Annotated[
    Path | None,
    typer.Option(
        "--models-dir",
        metavar="DIR",
        help="The store staged models go to, in the Hugging Face cache's layout (`agent "
        "serve` gives its jobs HF_HUB_CACHE=DIR) [default: the Hugging Face cache].",
        parser=path_given("--models-dir"),
    ),
]
"""Where an agent keeps staged models (agent.staging.store): `agent serve` and `agent models`."""
ModelsFormat = output_format(TABLE_OR_JSON, "table (for people) or json (for scripts).")


def open_store(models_dir: Any) -> Any:
    from agent.staging.store import ModelStore  # huggingface_hub, for these commands alone

    return ModelStore(models_dir)


@models_app.callback(invoke_without_command=True)
def models_entry(ctx: typer.Context) -> None:
    """List by default: `agent models` is `agent models list`."""
    if ctx.invoked_subcommand is None:
        models_list(None, "table", False)


@models_app.command(
    "list",
    epilog=examples("agent models list", "agent models list --verify -o json"),
)
def models_list(
    models_dir: ModelsDir = None,
    fmt: ModelsFormat = "table",
    verify: Annotated[
        bool,
        typer.Option("--verify", help="Hash every file again (else only those that changed)."),
    ] = False,
) -> None:
    """Each model held, by revision: `present` (whole; its files match what was staged),
    `partial` (a transfer not finished, with the share held) or `mismatch` (a file differs
    from what was staged: the first is named). Exit 1 when any is a mismatch."""
    store = open_store(models_dir)
    if store.root.exists() and not store.root.is_dir():
        raise usage_error(f"the models directory {store.root} is a file")
    try:
        from agent.staging.listing import held_models

        models = held_models(store, verify)
    except OSError as exc:
        raise usage_error(f"the models directory {store.root}: {exc.strerror or exc}") from None
    if not models and fmt == "table":
        err.print(f"no models in {store.root}", highlight=False, markup=False)
    emit({"store": str(store.root), "models": models}, fmt, models_table)
    if any(model["state"] == MISMATCH for model in models):
        raise typer.Exit(EXIT_PARTIAL)


def models_table(data: dict[str, Any]) -> FitTable:
    """A row per revision held; the error column only when a model has one, and the digest,
    the refs and the revision fold away in that order on a narrow terminal."""
    from agent.staging.store import gb

    table = FitTable(title=f"models in {data['store']}", folds=("digest", "refs", "revision"))
    errors = any(model["error"] for model in data["models"])
    for header in ("model", "revision", "refs", "state", "size", "digest"):
        table.add_column(header, justify="right" if header == "size" else "left")
    if errors:
        table.add_column("error", wrap=TEXT)
    for model in data["models"]:
        state = model["state"]
        if state == PARTIAL and model["size"]:
            state = f"partial {100 * model['bytes'] / model['size']:.0f} %"
        row = [
            Text(shown(model["model"])),
            model["revision"][:12],
            Text(shown(", ".join(model["refs"]) or "-")),
            state,
            gb(model["size"]),
            (model["digest"] or "not hashed")[:12],
        ]
        table.add_row(*row, *([Text(shown(model["error"] or ""))] if errors else []))
    return table


@models_app.command(
    "remove",
    epilog=examples(
        "agent models remove mlx-community/Llama-3.2-1B-Instruct-4bit",
        "agent models remove mlx-community/Llama-3.2-1B-Instruct-4bit@main --partial",
    ),
)
def models_remove(
    model: Annotated[str, typer.Argument(help="ORG/NAME, or ORG/NAME@REV for one revision.")],
    models_dir: ModelsDir = None,
    partial: Annotated[
        bool, typer.Option("--partial", help="Only the unfinished transfer, none of the rest.")
    ] = False,
) -> None:
    """Remove a model: its snapshot, the refs naming it, its record and any partial transfer.
    Refused while the agent stages it."""
    from agent.staging.store import StoreError
    from agent.staging.tasks import parse_model

    store = open_store(models_dir)
    try:
        model_id = parse_model(model)
        removed = store.remove(model_id.repo, model_id.revision, partial)
    except StoreError as exc:
        raise usage_error(exc.message) from None
    for name in removed:
        err.print(f"removed {name}", highlight=False, markup=False)
