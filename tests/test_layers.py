"""The import rules of the layout (README, Development): agent/ and coordinator/ meet only in
shared/, and shared/'s pure modules touch no socket, database, thread, process or signal.

Imports are read with `ast`, so one inside a function counts as much as one at the top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IO_MODULES = frozenset(
    {
        "asyncio",
        "concurrent",
        "http",
        "multiprocessing",
        "prometheus_client",
        "psutil",
        "select",
        "selectors",
        "shared.io",
        "signal",
        "socket",
        "socketserver",
        "sqlite3",
        "subprocess",
        "threading",
        "urllib",
        "wsgiref",
        "zmq",
    }
)
"""What a pure module of shared/ may not import (a module or any of its submodules)."""


def modules(package: str) -> list[Path]:
    found = sorted((ROOT / package).rglob("*.py"))
    assert found, f"no modules under {package}/"
    return found


def imported(path: Path) -> set[str]:
    """Every module `path` imports, absolute names (relative imports are not used here)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            assert node.module is not None
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def within(name: str, roots: frozenset[str] | set[str]) -> bool:
    return any(name == root or name.startswith(f"{root}.") for root in roots)


def offending(path: Path, forbidden: frozenset[str] | set[str]) -> list[str]:
    return sorted(name for name in imported(path) if within(name, forbidden))


def pure_shared_modules() -> list[Path]:
    """shared/ but its I/O helpers in shared/io/."""
    return [
        path for path in modules("shared") if path.relative_to(ROOT / "shared").parts[0] != "io"
    ]


@pytest.mark.parametrize(("package", "other"), [("agent", "coordinator"), ("coordinator", "agent")])
def test_agent_and_coordinator_never_import_each_other(package: str, other: str) -> None:
    crossing = {
        str(path.relative_to(ROOT)): found
        for path in modules(package)
        if (found := offending(path, {other}))
    }
    assert crossing == {}


def test_shared_imports_neither_side() -> None:
    crossing = {
        str(path.relative_to(ROOT)): found
        for path in modules("shared")
        if (found := offending(path, {"agent", "coordinator"}))
    }
    assert crossing == {}


def test_pure_shared_modules_import_no_io() -> None:
    pure = pure_shared_modules()
    assert {path.stem for path in pure} >= {"protocol", "matrix", "policy", "results", "report"}
    impure = {
        str(path.relative_to(ROOT)): found
        for path in pure
        if (found := offending(path, IO_MODULES))
    }
    assert impure == {}


def test_the_rules_catch_a_violation(tmp_path: Path) -> None:
    """The checker itself: an import inside a function, and a submodule of a forbidden one."""
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    import zmq.auth\n    from shared.io.keys import own_keypair\n")
    assert offending(sample, IO_MODULES) == [
        "shared.io.keys",
        "shared.io.keys.own_keypair",
        "zmq.auth",
    ]
