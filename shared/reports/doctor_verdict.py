"""What a doctor report comes to: its table with the failures that stop the agent first, then
one verdict line per host. Pure, for `agent doctor` and `coordinator doctor` alike; the verdict
is judged from the checks themselves (as the exit code is from `ok`), so an agent's report and
a coordinator's view of it say the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group
from rich.text import Text

from shared.reports.doctor import FAIL, PASS, doctor_table
from shared.safe_text import shown

Check = Mapping[str, Any]


def blocking(check: Check) -> bool:
    """A required check that failed: the agent cannot run here until it is fixed."""
    return bool(check.get("required")) and not check["ok"]


def ranked(checks: Sequence[Check]) -> list[Check]:
    """The failed required checks, then the failed optional ones, then the passes: each group
    in the order a first run meets them, so the ✗ that matter are read first."""
    return sorted(checks, key=lambda check: 0 if blocking(check) else 1 if not check["ok"] else 2)


def verdict(checks: Sequence[Check]) -> str:
    """`✓ this machine can run the agent (N optional checks not met)`, or `✗ fix these first:`
    and the failed required checks by name."""
    must = [str(check["name"]) for check in checks if blocking(check)]
    if must:
        return f"{FAIL} fix these first: {', '.join(must)}"
    missed = sum(1 for check in checks if not check["ok"])
    plural = "" if missed == 1 else "s"
    return f"{PASS} this machine can run the agent ({missed} optional check{plural} not met)"


def host_verdict(host: Mapping[str, Any], named: bool) -> Text:
    """One host's verdict line (`host: ` first when `named`); a host that sent no report
    cannot be judged. An agent's words: shown() and Text, never markup."""
    report = host.get("report")
    line = "✗ no report from its agent" if report is None else verdict(report["checks"])
    where = f"{host['host']}: " if named else ""
    return Text(shown(f"{where}{line}"), style="red" if line.startswith(FAIL) else "green")


def doctor_view(hosts: list[dict[str, Any]], named: bool = False) -> Group:
    """doctor_table with each host's checks ranked, then each host's verdict line."""
    ordered = [
        host | {"report": report | {"checks": ranked(report["checks"])}}
        if (report := host.get("report")) is not None
        else host
        for host in hosts
    ]
    return Group(doctor_table(ordered), *(host_verdict(host, named) for host in hosts))
