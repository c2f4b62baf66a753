"""The import rules of the layout (README, Development): agent/ and coordinator/ meet only in
shared/, and shared/'s pure modules touch no socket, database, thread, process or signal. Inside
agent/, each room imports only the rooms below it: the sensors (sensors/, thermal/, power/) no
room that uses them, service/ nothing of the agent's but itself, cooling/ neither the daemon, the
service nor a command, and only agent/cli.py the commands, which alone speak Typer.

Imports are read with `ast`, so one inside a function counts as much as one at the top."""

from __future__ import annotations

import ast
import importlib
import sys
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
    assert {path.stem for path in pure} >= {"protocol", "matrix", "policy", "results", "benchmark"}
    impure = {
        str(path.relative_to(ROOT)): found
        for path in pure
        if (found := offending(path, IO_MODULES))
    }
    assert impure == {}


AGENT = ROOT / "agent"
CLI_KIT = frozenset({"typer", "click", "shared.io.options", "shared.io.app", "shared.io.cli"})
"""What only a command module (and agent/cli.py, which names them) may import."""
USERS_OF_SENSORS = frozenset(
    {
        "agent.commands",
        "agent.daemon",
        "agent.cooling",
        "agent.service",
        "agent.profiling",
        "agent.doctor",
        "agent.daemon_address",
    }
)
AGENT_RULES: dict[str, frozenset[str]] = {
    "sensors": USERS_OF_SENSORS | {"agent.thermal", "agent.power", "agent.awake"},
    "awake": USERS_OF_SENSORS | {"agent.thermal", "agent.power"},
    "thermal": USERS_OF_SENSORS | {"agent.power"},
    "power": USERS_OF_SENSORS | {"agent.thermal"},
    "cooling": frozenset({"agent.commands", "agent.daemon", "agent.service"}),
    "doctor": frozenset({"agent.commands"}),
    "daemon": frozenset({"agent.commands"}),
    "profiling": frozenset({"agent.commands", "agent.daemon", "agent.service"}),
    "cluster": frozenset({"agent.commands", "agent.daemon", "agent.service"}),
}
"""agent/'s rooms and what each may not import (a module or any of its submodules)."""
TOP_LEVEL_LIMIT = 12


def agent_room(path: Path) -> str | None:
    """The folder of agent/ that `path` sits in; None for a module at agent/'s top level."""
    parts = path.relative_to(AGENT).parts
    return parts[0] if len(parts) > 1 else None


def agent_breaks(path: Path) -> list[str]:
    """Every import of `path` (a module of agent/) that the rules of its room forbid."""
    room = agent_room(path)
    found = set(offending(path, AGENT_RULES.get(room or "", frozenset())))
    if room == "service":
        found |= {
            name
            for name in imported(path)
            if within(name, {"agent"}) and not within(name, {"agent.service"})
        }
    found |= set(cli_breaks(path, AGENT, "agent"))
    return sorted(found)


def cli_breaks(path: Path, package_dir: Path, package: str) -> list[str]:
    """What `path` (a module of `package`) imports of the CLI kit or of the commands while being
    neither a command module nor the package's cli.py."""
    parts = path.relative_to(package_dir).parts
    if parts[0] == "commands" or parts == ("cli.py",):
        return []
    return offending(path, CLI_KIT | {f"{package}.commands"})


def test_agent_rooms_import_only_what_their_rules_allow() -> None:
    breaks = {
        str(path.relative_to(ROOT)): found
        for path in modules("agent")
        if (found := agent_breaks(path))
    }
    assert breaks == {}


def test_agent_rooms_are_the_known_ones() -> None:
    """A new folder gets its rules here before it gets code."""
    rooms = {room for path in modules("agent") if (room := agent_room(path))}
    assert rooms == set(AGENT_RULES) | {"commands", "service"}


def test_agent_top_level_stays_small() -> None:
    top = sorted(path.name for path in modules("agent") if agent_room(path) is None)
    assert len(top) <= TOP_LEVEL_LIMIT, top


def test_only_coordinator_commands_speak_typer() -> None:
    breaks = {
        str(path.relative_to(ROOT)): found
        for path in modules("coordinator")
        if (found := cli_breaks(path, ROOT / "coordinator", "coordinator"))
    }
    assert breaks == {}


@pytest.mark.parametrize("package", ["agent", "coordinator"])
def test_cli_names_only_command_modules(package: str) -> None:
    """Each cli.py names its command modules by string (lazy loading): each is in commands/."""
    commands = importlib.import_module(f"{package}.cli").COMMANDS
    for command in commands:
        module = command.target.partition(":")[0]
        assert module.startswith(f"{package}.commands."), command.target
        assert (ROOT / Path(*module.split("."))).with_suffix(".py").exists(), command.target


def test_the_agent_rules_catch_a_violation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kind of rule, on a module written into a room for the test."""
    cases = {
        "thermal/scratch.py": "from agent.power.meter import EnergyMeter\n",
        "power/scratch.py": "def f():\n    import agent.thermal.smc\n",
        "sensors/scratch.py": "from agent.cooling.guard import CellGuard\n",
        "service/scratch.py": "from agent.daemon.endpoints import endpoint_for\n",
        "cooling/scratch.py": "from agent.daemon.hub import TelemetryHub\n",
        "daemon/scratch.py": "import typer\nfrom agent.commands.temp import temp_command\n",
    }
    monkeypatch.setattr(sys.modules[__name__], "AGENT", tmp_path)
    found = {}
    for name, text in cases.items():
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        found[name] = agent_breaks(path)
    assert found == {
        "thermal/scratch.py": ["agent.power.meter", "agent.power.meter.EnergyMeter"],
        "power/scratch.py": ["agent.thermal.smc"],
        "sensors/scratch.py": ["agent.cooling.guard", "agent.cooling.guard.CellGuard"],
        "service/scratch.py": ["agent.daemon.endpoints", "agent.daemon.endpoints.endpoint_for"],
        "cooling/scratch.py": ["agent.daemon.hub", "agent.daemon.hub.TelemetryHub"],
        "daemon/scratch.py": [
            "agent.commands.temp",
            "agent.commands.temp.temp_command",
            "typer",
        ],
    }


def test_the_rules_catch_a_violation(tmp_path: Path) -> None:
    """The checker itself: an import inside a function, and a submodule of a forbidden one."""
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    import zmq.auth\n    from shared.io.keys import own_keypair\n")
    assert offending(sample, IO_MODULES) == [
        "shared.io.keys",
        "shared.io.keys.own_keypair",
        "zmq.auth",
    ]
