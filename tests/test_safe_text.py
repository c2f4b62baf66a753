"""shown(): the one way an agent's string reaches a terminal (shared/safe_text.py)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.text import Text

from shared.reports.doctor import doctor_table
from shared.safe_text import SHOWN_CAP, shown

HOSTILE = {
    "osc 52, the clipboard": ("\x1b]52;c;ZWNobyBoaQ==\x07", "\\x1b]52;c;ZWNobyBoaQ==\\x07"),
    "osc 0, the window title": ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),
    "csi 6n, a reply typed into the tty": ("\x1b[6n", "\\x1b[6n"),
    "csi 2J, the screen cleared": ("\x1b[2J", "\\x1b[2J"),
    "c1 csi": ("\x9b31m", "\\x9b31m"),
    "a forged row": ("mac1\nmac2 ok", "mac1 mac2 ok"),
    "bidi override": ("abc\u202edcba", "abc\\u202edcba"),
    "zero width": ("ma\u200bc1", "ma\\u200bc1"),
    "nul and del": ("a\x00b\x7f", "a\\x00b\\x7f"),
    "rich markup stays text": ("[link=file:///etc/passwd]x[/link] [/]", None),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_a_hostile_string_is_shown_escaped_on_one_line(case: str) -> None:
    raw, expected = HOSTILE[case]
    safe = shown(raw)
    assert safe == (raw if expected is None else expected)
    assert "\n" not in safe and "\x1b" not in safe and not any(0x80 <= ord(c) <= 0x9F for c in safe)


def test_a_long_string_is_cut_and_counted() -> None:
    assert shown("x" * 4_000_000) == "x" * SHOWN_CAP + f"…(+{4_000_000 - SHOWN_CAP})"
    assert shown("ok") == "ok" and shown(None) == "None" and shown(3.5) == "3.5"
    assert shown("ünïcødé, 温度, °C") == "ünïcødé, 温度, °C"  # printable text is left alone


def test_a_doctor_report_with_markup_and_escapes_renders_as_text() -> None:
    """An agent's doctor report once crashed the table on `[/]` (Rich's MarkupError) and passed
    escape sequences through; now every field is shown()."""
    check = {"name": "x[/]", "ok": False, "detail": "\x1b]52;c;aGk=\x07[bold]b", "fix": "[/]"}
    report = {"checks": [{**check, "required": True}]}
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(
        doctor_table([{"host": "mac\x1b[2J1", "report": report}, {"host": "b", "error": "[/]"}])
    )
    text = out.getvalue()
    assert "\x1b" not in text and "x[/]" in text and "\\x1b]52;c;aGk=\\x07[bold]b" in text
    assert "mac\\x1b[2J1" in text and Text("[/]").plain in text


def test_coordinator_status_shows_a_hostile_agents_fields_as_escaped_text() -> None:
    from coordinator.commands.status import status_table

    row = {
        "host": "mac1:5555",
        "reachable": True,
        "agent": "0.1.0[/]",
        "device": "\x1b]52;c;aGk=\x07",
        "hardware": "[link=file:///etc/passwd]x[/link]",
        "memory_gb": None,
        "thermal_source": "smc",
        "sensor": "TCMz\nmac2 yes",
        "celsius": 50.0,
        "pressure": "\x9b6n",
        "simulated": False,
        "job": None,
    }
    down = {"host": "mac2:5555", "reachable": False, "error": "[/] refused"}
    out = io.StringIO()
    Console(file=out, width=400, color_system=None).print(status_table([row, down]))
    text = out.getvalue()
    assert "\x1b" not in text and "\x9b" not in text and "0.1.0[/]" in text
    assert "[link=file:///etc/passwd]x[/link]" in text and "no: [/] refused" in text
    assert not [line for line in text.splitlines() if "mac2 yes" in line and "TCMz" not in line]
