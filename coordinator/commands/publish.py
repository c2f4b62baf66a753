"""`coordinator publish` and `verify`: a stored run as a signed bundle others can check, and
the check (coordinator.reports.bundle)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from coordinator.commands.runs import load_reports
from coordinator.reports.bundle import (
    BundleError,
    bundle_markdown,
    bundle_problems,
    bundle_table,
    host_lines,
    make_bundle,
    read_bundle,
    summary,
)
from shared.clock import now_iso
from shared.distributed.rank_shapes import KIND_NETBENCH
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import emit, err, fail, print_rich, usage_error
from shared.io.options import RunId, TableFormat
from shared.io.signing import own_signing_key, public_text
from shared.reports.rows import strict_json
from shared.safe_text import DETAIL_CAP, shown

OutDir = Annotated[
    Path,
    typer.Option("--out", help="The folder the bundle and its Markdown are written to."),
]
Bundle = Annotated[Path, typer.Argument(help="A bundle `coordinator publish` wrote.")]
SignerKey = Annotated[
    str | None,
    typer.Option(
        "--key",
        help="The publisher's public key (base64, as its Markdown and `publish` print it): "
        "the bundle must be signed by it.",
    ),
]


EveryCell = Annotated[
    bool,
    typer.Option(
        "--all", help="Every cell with samples, each with its verdict, not only the valid ones."
    ),
]


def publish(run: RunId, out: OutDir = Path("."), every: EveryCell = False) -> None:
    """A stored run as one signed, self-describing bundle and its Markdown.

    RUN.bundle.json and RUN.md: every valid cell with its settings and samples, the hosts'
    facts, and an Ed25519 signature by this coordinator's key (made on first use, beside its
    CURVE key)."""
    if not out.is_dir():
        raise usage_error(f"--out {out}: no such folder")
    report = load_reports(run)[0]
    if report.get("kind") == KIND_NETBENCH:
        raise usage_error(f"run {run} is a netbench run: only benchmark runs are published")
    key = own_signing_key()
    bundle = make_bundle(report, key, now_iso(), every)
    if not bundle["cells"]:
        which = "cell with samples" if every else "valid cell (--all publishes every cell)"
        raise fail(f"run {report['run_id']}: no {which} to publish", EXIT_PARTIAL)
    path = out / f"{report['run_id']}.bundle.json"
    markdown = out / f"{report['run_id']}.md"
    try:
        path.write_text(strict_json(bundle, indent=1) + "\n", encoding="utf-8")
        markdown.write_text(bundle_markdown(bundle, path.name), encoding="utf-8")
    except OSError as exc:
        raise fail(f"cannot write in {out}: {exc.strerror or exc}", EXIT_PARTIAL) from None
    left = len(report["cells"]) - len(bundle["cells"])
    err.print(
        f"wrote {path} ({len(bundle['cells'])} cells; {left} left out) and {markdown}; "
        f"signed by {public_text(key)}",
        highlight=False,
        markup=False,
    )


def verify(bundle: Bundle, key: SignerKey = None, fmt: TableFormat = "table") -> None:
    """Check a published bundle: its signature and every figure from its samples.

    The signature by --key if given; every figure recomputed from its samples; then its
    table. Exit 1 naming what does not verify."""
    try:
        read = read_bundle(bundle.read_text(encoding="utf-8"))
    except OSError as exc:
        raise usage_error(f"cannot read {bundle}: {exc.strerror or exc}") from None
    except (BundleError, UnicodeDecodeError) as exc:
        raise usage_error(f"{bundle}: {exc}") from None
    problems = bundle_problems(read, key)
    if problems:
        raise fail(shown(summary(problems), DETAIL_CAP * 4), EXIT_PARTIAL)
    signer = shown(str(read["signature"].get("public_key")))
    if fmt == "json":
        emit({"verified": True, "signed_by": signer, "bundle": read}, fmt, bundle_table)
        return
    for line in host_lines(read):
        err.print(shown(line, DETAIL_CAP), highlight=False, markup=False)
    print_rich(bundle_table(read))
    err.print(
        f"verifies: {len(read['cells'])} cells recomputed from their samples; signed by {signer}"
        + ("" if key else " (--key KEY checks it is the publisher's)"),
        highlight=False,
        markup=False,
    )
