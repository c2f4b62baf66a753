"""What a peer says, made safe to show: a remote string never reaches a terminal as it came.

Printing a peer's words raw is a known way in (kubectl's CVE-2021-25743: fields printed with
their escape sequences; Trojan Source, CVE-2021-42574: bidi overrides that make text read
otherwise). shown() is the one function every agent-supplied string passes before a table, a
line on stderr or a log shows it; its result is plain text, handed to Rich as `Text` so that
markup in it is never parsed."""

from __future__ import annotations

SHOWN_CAP = 200
"""Characters of one remote string shown; the rest is counted, `…(+N)`, never printed."""
DETAIL_CAP = 1000
"""For an error or a check's detail, which may quote a crashed process's last lines."""
EXPORT_CAP = 4096
"""For a value of a csv, sql or md export: whole for anything an agent honestly sends (a
crash's last lines, a long command line), bounded for a hostile one (JSON keeps it exact)."""

_INVISIBLE = frozenset(
    [0x061C, 0x180E, 0xFEFF, *range(0x200B, 0x2010), *range(0x202A, 0x202F)]
    + [*range(0x2060, 0x2065), *range(0x2066, 0x206A)]
)
"""Zero-width characters and bidi controls: each makes a string read otherwise than it is."""


def shown(value: object, cap: int | None = SHOWN_CAP) -> str:
    """`value` as one line of plain text: newlines and tabs become spaces; C0 and C1 control
    characters, DEL and ESC are shown as `\\xNN`; zero-width and bidi controls as `\\uNNNN`;
    past `cap` characters (None: no cap, for exports) the rest is `…(+N)`."""
    text = value if isinstance(value, str) else str(value)
    rest = 0 if cap is None else len(text) - cap
    if rest <= 0 and text.isprintable():  # no control or format character: the usual case
        return text
    out = []
    for char in text[:cap] if rest > 0 else text:
        code = ord(char)
        if char in "\n\r\t\v\f":
            out.append(" ")
        elif code < 0x20 or 0x7F <= code <= 0x9F:
            out.append(f"\\x{code:02x}")
        elif code in _INVISIBLE or 0xE0000 <= code <= 0xE007F:  # tag characters hide text too
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out) + (f"…(+{rest})" if rest > 0 else "")
