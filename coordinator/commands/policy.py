"""`coordinator policy`: show every host's cooling policy, or push new thresholds to all.

Only the thresholds given are sent; each agent keeps its other values (docs/protocol.md §11), so
`--pause-temp 88` raises the pause threshold everywhere without flattening per-host choices.
What the command line alone decides (the order of the thresholds it names) is checked here; the
whole policy is the agent's to accept, and its refusal is reported with its reason.
"""

from __future__ import annotations

import time
from typing import Any

import typer
from rich.text import Text

from coordinator.commands.hosts import FleetOptions, HostRow
from coordinator.telemetry.dashboard import NA
from coordinator.telemetry.store import TelemetryStore
from shared.cooling.calibration import check_given, origin_told
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import emit, usage_error
from shared.io.options import PolicyChanges, TableFormat, with_options
from shared.io.sqlite import StoreError
from shared.io.transport import AgentClient, AgentError
from shared.safe_text import shown
from shared.tables import TEXT, FitTable

APPLIED, REFUSED, UNREACHABLE, SHOWN = "applied", "refused", "unreachable", "shown"
COLUMNS = (
    ("max_speed_temp", "reduce ≥ °C"),
    ("pause_temp", "pause ≥ °C"),
    ("stop_temp", "stop ≥ °C"),
    ("pace_temp", "pace < °C"),
    ("hysteresis", "hysteresis °C"),
    ("pause_duration", "pause step s"),
)


def apply_to(client: AgentClient, row: HostRow, given: dict[str, float]) -> None:
    """One host's policy set (or shown, without `given`)."""
    if given:
        reply = client.request("policy.set", {"policy": given})
    else:
        reply = client.request("policy.get", timeout=client.connect_timeout)
    row["policy"], row["origin"] = reply["policy"], origin_told(reply.get("origin"))
    row["result"] = APPLIED if given else SHOWN


def _number(policy: dict[str, Any], key: str) -> str:
    """A policy's number as shown; a pace cap the policy has not is `off` (its default: no
    pace tier), another key it has not n/a (a peer's map without it)."""
    if key in policy:
        return f"{policy[key]:g}"
    return "off" if key == "pace_temp" and policy else NA


def policy_refused(exc: AgentError, row: HostRow) -> None:
    row.update(result=REFUSED, error=str(exc))


POLICY_FOLDS = ("pause step s", "hysteresis °C", "pace < °C", "reduce ≥ °C", "stop ≥ °C")
"""The columns a narrow terminal drops, the first first (shared.tables); host, result, the
pause threshold and why always stay."""


def policy_table(rows: list[dict[str, Any]]) -> FitTable:
    """The hosts' policies; the caption says where each one's numbers came from (`defaults
    for smc`, `set by coordinator policy`, ...), hosts of one origin together."""
    table = FitTable(title="mlx-fleet cooling policy", title_justify="left", folds=POLICY_FOLDS)
    table.add_column("host")
    table.add_column("result")
    for _, title in COLUMNS:
        table.add_column(title, justify="right")
    table.add_column("why", wrap=TEXT)
    styles = {APPLIED: "green", SHOWN: "", REFUSED: "bold red", UNREACHABLE: "red"}
    origins: dict[str, list[str]] = {}
    for row in rows:
        policy = row["policy"] or {}
        table.add_row(
            Text(shown(row["host"])),
            Text(row["result"], style=styles[row["result"]]),
            *(_number(policy, key) for key, _ in COLUMNS),
            Text(shown(row["error"] or "")),
        )  # Text: an agent's words are never markup
        if row["policy"] is not None:
            origins.setdefault(row["origin"] or "origin unknown (an older agent)", []).append(
                row["host"]
            )
    caption = [shown(f"{origin}: {', '.join(hosts)}", 1000) for origin, hosts in origins.items()]
    if caption:
        table.caption = Text("\n".join(caption))
        table.caption_justify = "left"
    return table


@with_options
def policy(changes: PolicyChanges, fleet: FleetOptions, fmt: TableFormat = "table") -> None:
    """Show each host's cooling policy, or push thresholds to every host.

    With thresholds, each agent validates, persists and applies them at once (to its own
    samples and every supervised job); thresholds not given keep each host's value. Each host
    is reported applied, refused (with the agent's reason, the old policy kept) or unreachable.
    Exit 1 when any host did not apply or show its policy.
    """
    given = changes.given()
    try:
        check_given(given)
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    rows = fleet.ask_each(
        lambda _: {"result": UNREACHABLE, "policy": None, "origin": None},
        lambda client, row: apply_to(client, row, given),
        policy_refused,
    )
    try:
        with TelemetryStore() as store:  # what `coordinator history` measures against
            for row in rows:
                if row["policy"] is not None:
                    store.record_policy(row["host"], row["policy"], time.time(), row["origin"])
    except StoreError as exc:
        raise usage_error(str(exc)) from None
    emit(rows, fmt, policy_table)
    if not all(row["result"] in (APPLIED, SHOWN) for row in rows):
        raise typer.Exit(EXIT_PARTIAL)
