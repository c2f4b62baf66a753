"""`coordinator deploy`: set up agents on many Macs over ssh in one command."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Annotated

import typer

from coordinator.hosts.deploy import (
    DEFAULT_REMOTE_DIR,
    MIN_REMOTE_PYTHON,
    NO_SOURCE_TREE,
    DeployError,
    RemoteLayout,
    Rollout,
    SshSettings,
    Step,
    deploy,
    skipped_text,
    source_tree,
    wheel_command,
    wheel_name,
)
from coordinator.hosts.hostfile import HostEntry, HostfileError, parse_hostfile, parse_hosts
from shared.cooling.sources import SourceSpecError, parse_source_name
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import emit, err, usage_error
from shared.io.keys import existing_keypair, own_keypair
from shared.io.options import TableFormat, ThermalSourceName
from shared.safe_text import DETAIL_CAP, shown
from shared.tables import TEXT, WHOLE, WORDS, FitTable


def coordinator_name() -> str:
    """The name agents file this coordinator's key under: coordinator-<hostname>."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:40] or "unknown"
    return f"coordinator-{host}"


def entries_from(hosts: str | None, hostfile: Path | None) -> list[HostEntry]:
    if bool(hosts) == bool(hostfile):
        raise usage_error("give the hosts to deploy to: --hosts H1,H2 or --hostfile FILE")
    try:
        return parse_hosts(hosts) if hosts else parse_hostfile(hostfile)  # type: ignore[arg-type]
    except HostfileError as exc:
        raise usage_error(str(exc)) from None


def check_layout(wheel: Path | None, remote_python: str | None, remote_dir: str) -> None:
    """Refuse what no host could use, before anything runs (a dry run too): one line, exit 2."""
    if wheel is not None:
        if not wheel.is_file():
            raise usage_error(f"--wheel {wheel}: no such file (build one: pip wheel --no-deps .)")
        if wheel.suffix != ".whl":
            raise usage_error(f"--wheel {wheel} is not a wheel (*.whl)")
    if remote_python is not None and not remote_python.strip():
        raise usage_error(
            "--remote-python is empty: name the Python that makes the remote virtual "
            "environment, e.g. /opt/homebrew/bin/python3.12"
        )
    if not remote_dir.strip():
        raise usage_error("--remote-dir is empty: name a folder on the hosts")


def check_ssh_files(ssh_config: Path | None, identity: Path | None) -> None:
    """Refuse an --ssh-config or --identity that ssh could not read, before any host is asked
    (a dry run too): one line, exit 2, where ssh would fail on every host alike."""
    for flag, path in (("--ssh-config", ssh_config), ("--identity", identity)):
        if path is None:
            continue
        if not path.exists():
            raise usage_error(f"{flag} {path}: no such file")
        if not path.is_file():
            raise usage_error(f"{flag} {path} is not a file")
        if not os.access(path, os.R_OK):
            raise usage_error(f"{flag} {path} is not readable")


def dry_run_wheel(wheel: Path | None) -> tuple[Path, Step | None]:
    """The wheel a dry run's steps ship, and the local step that builds it when --wheel gives
    none (as the real run builds one from this checkout; without one, refused as it is)."""
    if wheel is not None:
        return wheel, None
    tree = source_tree()
    if tree is None:
        raise usage_error(NO_SOURCE_TREE)
    built = tree / "dist"
    return built / wheel_name(), Step("build wheel", wheel_command(tree, built))


DEPLOY_FOLDS = ("steps done", "service")
"""The columns a narrow terminal drops, the first first (shared.tables); host, result and the
error always stay."""


def results_table(results: list[dict[str, object]]) -> FitTable:
    table = FitTable(title="mlx-fleet deploy", folds=DEPLOY_FOLDS)
    for column in ("host", "result", "steps done", "service", "error"):
        wrap = TEXT if column == "error" else WORDS if column in ("result", "steps done") else WHOLE
        table.add_column(column, wrap=wrap)
    for row in results:
        table.add_row(
            str(row["host"]),
            "ok" if row["ok"] else f"FAILED at {row['failed']}",
            ", ".join(row["done"]),  # type: ignore[arg-type]
            str(row.get("service") or ""),
            str(row["error"] or ""),
            style=None if row["ok"] else "red",
        )
    return table


AFTER_FIND_PYTHON = (
    "the steps after `find python` run with the Python it finds: give --remote-python PATH "
    "to see them"
)
"""What a dry run without --remote-python says in place of the steps it cannot know."""


def dry_run_plans(entries: list[HostEntry], wheel: Path | None, rollout: Rollout, fmt: str) -> None:
    """Print each host's commands, as a script to paste (the wheel's build first, when
    --wheel names none), or as JSON, touching no host (issue 42: a dry run asked each host for
    its Pythons, and failed on a name that does not resolve). Without --remote-python each
    host's plan is its `find python` question, and a line saying why the rest is not shown."""
    shown, build = dry_run_wheel(wheel)
    python = rollout.layout.python
    plans: list[dict[str, object]] = []
    for entry in entries:
        steps = rollout.steps(entry, shown) if python is not None else [rollout.probe_step(entry)]
        plans.append(
            {
                "host": entry.address,
                "python": python,
                "after": None if python is not None else AFTER_FIND_PYTHON,
                "steps": [{"name": step.name, "command": step.shell()} for step in steps],
            }
        )
    if fmt == "json":
        print(json.dumps(plans, indent=2))
        return
    if build is not None:  # a script to paste: every line a comment or a command
        print(f"# {build.name}\n{build.shell()}")
    for plan in plans:
        print(f"# {plan['host']}")
        if plan["python"]:
            print(f"# python: {plan['python']}")
        for step in plan["steps"]:  # type: ignore[attr-defined]
            print(f"# {step['name']}\n{step['command']}")
        if plan["after"]:
            print(f"# {plan['after']}")


def say(line: str) -> None:
    err.print(line, highlight=False, markup=False)


def deploy_command(
    hosts: Annotated[
        str | None,
        typer.Option(
            "--hosts", help="H1,H2[:PORT]: ssh host names (PORT is the agent's, default 5555)."
        ),
    ] = None,
    hostfile: Annotated[
        Path | None, typer.Option("--hostfile", help="TOML or JSON hostfile.")
    ] = None,
    ssh_user: Annotated[str | None, typer.Option("--ssh-user", help="ssh login name.")] = None,
    ssh_config: Annotated[
        Path | None, typer.Option("--ssh-config", help="An ssh config file (ssh -F).")
    ] = None,
    identity: Annotated[
        Path | None, typer.Option("--identity", help="An ssh private key (ssh -i).")
    ] = None,
    wheel: Annotated[
        Path | None,
        typer.Option(
            "--wheel", help="The mlx-fleet wheel to ship (default: built from this checkout)."
        ),
    ] = None,
    remote_dir: Annotated[
        str,
        typer.Option(
            "--remote-dir", help="Where the virtual environment and wheel go on each host."
        ),
    ] = DEFAULT_REMOTE_DIR,
    remote_python: Annotated[
        str | None,
        typer.Option(
            "--remote-python",
            help=f"The Python (>= {MIN_REMOTE_PYTHON}; on a Mac native arm64) that creates "
            "the remote virtual environment. Default: each host's first usable one of Homebrew's "
            "(/opt/homebrew/bin/python3.13 ... 3.10, python3), python.org's (newest first), "
            "/usr/local/bin/python3, MacPorts', pyenv's, uv's, a conda base's, python3 on "
            "PATH, and Apple's /usr/bin/python3 only where the Command Line Tools are "
            "installed (never their install dialog); those passed over are named, with why.",
        ),
    ] = None,
    system: Annotated[
        bool,
        typer.Option(
            "--system",
            help="A system service on every host (a LaunchDaemon running as the login user, "
            "up at boot): `agent install --system --sudo`, so the login needs passwordless "
            "sudo for the agent. Without it each Mac gets `agent install --auto`: the system "
            "service where nobody is logged in at the screen, a user service elsewhere.",
        ),
    ] = False,
    thermal_source: ThermalSourceName = "auto",
    fmt: TableFormat = "table",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the commands for each host; run nothing.")
    ] = False,
) -> None:
    """Install agents on many hosts over ssh: virtualenv, package, trust, service, keys.

    Idempotent: run it again to upgrade. Each host reports what succeeded; an unreachable host
    is reported and the others continue. Exit 0 when every host succeeded, 1 otherwise.
    """
    try:
        parse_source_name(thermal_source)  # the hosts' `agent install` would refuse it
    except SourceSpecError as exc:
        raise usage_error(str(exc)) from None
    check_layout(wheel, remote_python, remote_dir)
    check_ssh_files(ssh_config, identity)
    entries = entries_from(hosts, hostfile)
    # The key a real run passes, so a dry run's `trust coordinator` line can be pasted: a
    # coordinator without one yet makes it, as the real run's first step would.
    made = dry_run and existing_keypair() is None
    key = own_keypair().public
    if made:
        say("made this coordinator's key (as a real run would): the script trusts it")
    rollout = Rollout(
        key,
        coordinator_name(),
        RemoteLayout(remote_dir, remote_python),
        SshSettings(ssh_user, ssh_config, identity),
        system,
        thermal_source,
    )
    if dry_run:
        dry_run_plans(entries, wheel, rollout, fmt)
        return
    try:
        results = deploy(
            entries,
            wheel,
            rollout,
            on_step=lambda host, step: say(f"{host}: {step} ok"),
        )
    except DeployError as exc:
        raise usage_error(str(exc)) from None
    for result in results:
        if result.python_skipped or result.python_not_found:
            skipped = skipped_text(result.python_skipped or [], result.python_not_found or [])
            say(f"{result.host}: find python skipped: {shown(skipped, DETAIL_CAP)}")
    rows = [r.to_dict() for r in results]
    emit(rows, fmt, results_table)
    if not all(r.ok for r in results):
        say("some hosts failed: fix them and run the same command again")
        raise typer.Exit(EXIT_PARTIAL)
