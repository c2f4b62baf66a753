"""What `agent` and `coordinator` exit with: one set for every command (README, Exit codes)."""

EXIT_OK = 0
EXIT_PARTIAL = 1
"""A host or a cell failed (what succeeded is still printed and kept); for `agent temp`, the
source is unavailable here."""
EXIT_USAGE = 2
"""Bad input: one line on stderr names the problem; nothing was done."""
EXIT_THERMAL_STOP = 75
"""`agent run`: the cooling policy stopped the command (EX_TEMPFAIL from sysexits.h: a
temporary condition, try again later)."""
EXIT_SUPERVISOR_FAILED = 125
"""`agent run` itself failed, not its command (as timeout(1) and env(1) say)."""
EXIT_CANNOT_EXECUTE = 126
"""`agent run`: the command exists but cannot run (as shells say)."""
EXIT_NOT_FOUND = 127
"""`agent run`: the command does not exist (as shells say)."""
EXIT_INTERRUPTED = 130
"""Ctrl-C: what finished is still printed and kept."""
EXIT_TERMINATED = 143
"""SIGTERM to `agent bench` or `coordinator benchmark` (timeout(1), a CI cancel): taken as
Ctrl-C, what finished is still printed and kept; 128 + 15, as a shell reports it."""

SUMMARY = (
    "Exit codes: 0 ok, 1 partial failure (a host or cell failed), 2 usage error, "
    "130 interrupted (143 after SIGTERM). `agent run` passes on its command's code "
    "(see its --help)."
)
