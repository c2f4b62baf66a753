"""`agent doctor` / `coordinator doctor` end with a verdict, the ✗ that matter first
(shared.reports.doctor_verdict): pure, fed reports as the agent makes them."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from shared.reports.doctor_verdict import doctor_view, ranked, verdict


def check(name: str, ok: bool, required: bool = False) -> dict[str, Any]:
    return {"name": name, "ok": ok, "detail": f"{name} found", "fix": None, "required": required}


LINUX = [
    check("python", True, required=True),
    check("metal", False),
    check("mlx", True, required=True),
    check("thermal: smc", False),
    check("data dir", False, required=True),
    check("filevault", False),
    check("port 5555", False, required=True),
]


def text(renderable: Any) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_a_machine_that_can_run_counts_the_optional_checks_not_met() -> None:
    checks = [c for c in LINUX if c["required"] is False or c["ok"]]
    assert verdict(checks) == "✓ this machine can run the agent (3 optional checks not met)"
    assert verdict(checks[:2]) == "✓ this machine can run the agent (1 optional check not met)"
    assert verdict([LINUX[0]]) == "✓ this machine can run the agent (0 optional checks not met)"


def test_a_failed_required_check_names_what_to_fix_first() -> None:
    assert verdict(LINUX) == "✗ fix these first: data dir, port 5555"


def test_the_failed_required_checks_come_first_then_the_optional_then_the_passes() -> None:
    assert [c["name"] for c in ranked(LINUX)] == [
        "data dir",
        "port 5555",
        "metal",
        "thermal: smc",
        "filevault",
        "python",
        "mlx",
    ]


def test_an_old_agents_check_without_required_is_optional() -> None:
    old = {"name": "metal", "ok": False, "detail": "", "fix": None}
    assert verdict([old]) == "✓ this machine can run the agent (1 optional check not met)"


def test_the_table_ends_with_the_verdict_and_lists_what_matters_first() -> None:
    shown = text(doctor_view([{"host": "mac1", "report": {"checks": LINUX}}]))
    lines = shown.strip().splitlines()
    assert lines[-1] == "✗ fix these first: data dir, port 5555"
    assert shown.index("data dir") < shown.index("metal") < shown.index("python")


def test_each_host_gets_its_verdict_and_a_silent_host_says_so() -> None:
    hosts = [
        {"host": "mac1:5555", "report": {"checks": LINUX[:2]}},
        {"host": "mac2:5555", "report": None, "error": "timed out"},
    ]
    lines = text(doctor_view(hosts, named=True)).strip().splitlines()
    assert lines[-2:] == [
        "mac1:5555: ✓ this machine can run the agent (1 optional check not met)",
        "mac2:5555: ✗ no report from its agent",
    ]


def test_a_hostile_check_name_is_escaped_in_the_verdict() -> None:
    bad = check("\x1b]52;c;aGk=\x07clip", False, required=True)
    line = text(doctor_view([{"host": "h", "report": {"checks": [bad]}}])).strip().splitlines()[-1]
    assert "\x1b" not in line and "\x07" not in line and line.startswith("✗ fix these first: ")
