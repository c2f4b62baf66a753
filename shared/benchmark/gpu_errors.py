"""Metal's command-buffer errors, as a job process's output says them (pure text).

When a Metal command buffer fails, MLX throws std::runtime_error("[METAL] Command buffer
execution failed: ...") from Metal's completion handler, on a thread of its own; nothing
catches it there, so the process ends with libc++abi's "terminating due to uncaught exception"
and SIGABRT. The line names the IOGPU error code, kIOGPUCommandBufferCallbackError<KIND>: the
lines below are quoted from ml-explore/mlx#3267 and #3186 (Timeout) and of the same form for the
other kinds (tests/fixtures/gpu_errors.txt keeps them with their origin).
"""

from __future__ import annotations

import re

KINDS = ("Timeout", "PageFault", "ImpactingInteractivity")
"""The kinds shared.benchmark.faults injects; gpu_error() names any
kIOGPUCommandBufferCallbackError."""
PREFIX = (
    "libc++abi: terminating due to uncaught exception of type std::runtime_error: "
    "[METAL] Command buffer execution failed: "
)
LINES = {
    "Timeout": PREFIX
    + "Caused GPU Timeout Error (00000002:kIOGPUCommandBufferCallbackErrorTimeout)",
    "PageFault": PREFIX
    + "Caused GPU Address Fault Error (0000000b:kIOGPUCommandBufferCallbackErrorPageFault)",
    "ImpactingInteractivity": PREFIX
    + "Impacting Interactivity (0000000e:kIOGPUCommandBufferCallbackErrorImpactingInteractivity)",
}
"""The exact line a job process prints for each kind (what MLX_FLEET_INJECT=gpu-error injects)."""
ERROR_CHARS = 300
"""How much of the line a cell's error quotes."""

_CODE = re.compile(r"kIOGPUCommandBufferCallbackError([A-Za-z]+)")


def gpu_error(line: str) -> str | None:
    """The kind of Metal command-buffer error `line` reports (Timeout, PageFault, ...), or
    None when it reports none."""
    found = _CODE.search(line)
    return found[1] if found else None


def find(text: str) -> tuple[str, str] | None:
    """The last line of `text` (a process's output) that reports a Metal command-buffer error:
    (kind, line stripped); None when none does."""
    for line in reversed(text.splitlines()):
        kind = gpu_error(line)
        if kind is not None:
            return kind, line.strip()
    return None


def error_text(kind: str, line: str) -> str:
    """A failed cell's error for a GPU error: `gpu-error: KIND: LINE` (shared.benchmark.verdict's
    reason `gpu-error` reads the prefix), the line cut to ERROR_CHARS."""
    cut = line if len(line) <= ERROR_CHARS else line[: ERROR_CHARS - 1] + "…"
    return f"gpu-error: {kind}: {cut}"
