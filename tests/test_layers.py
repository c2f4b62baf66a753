"""The import rules of the layout (README, Where things are): agent/ and coordinator/ meet only in
shared/, and shared/'s pure modules touch no socket, database, thread, process or signal. Inside
agent/, each room imports only the rooms below it: the sensors (sensors/, clocks/, thermal/, power/)
no room that uses them, service/ nothing of the agent's but itself, cooling/ neither the daemon, the
service nor a command, staging/ none of those nor cooling/, and only agent/cli.py the commands,
which alone speak Typer. Inside coordinator/, hosts/ imports no other room, runs/ and telemetry/
never each other, reports/ no run.
Inside shared/, the kit at the top imports no room, cooling/ no other concept room, benchmark/
and distributed/ never each other, wire/ no report, staging/ none of benchmark/, distributed/,
cooling/ or reports/. No package has an import circle, and no class
is longer than CLASS_LIMIT lines.

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
CLI_KIT = frozenset(
    {
        "typer",
        "click",
        "shared.io.options",
        "shared.io.app",
        "shared.io.cli",
        "shared.io.keys_group",
    }
)
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
        "agent.staging",
    }
)
AGENT_RULES: dict[str, frozenset[str]] = {
    "sensors": USERS_OF_SENSORS | {"agent.thermal", "agent.power", "agent.awake", "agent.clocks"},
    "clocks": USERS_OF_SENSORS | {"agent.thermal", "agent.power", "agent.awake"},
    "awake": USERS_OF_SENSORS | {"agent.thermal", "agent.power"},
    "thermal": USERS_OF_SENSORS | {"agent.power"},
    "power": USERS_OF_SENSORS | {"agent.thermal"},
    "cooling": frozenset({"agent.commands", "agent.daemon", "agent.service"}),
    "doctor": frozenset({"agent.commands", "agent.daemon"}),
    "daemon": frozenset({"agent.commands"}),
    "profiling": frozenset({"agent.commands", "agent.daemon", "agent.service"}),
    "cluster": frozenset({"agent.commands", "agent.daemon", "agent.service"}),
    "staging": frozenset({"agent.commands", "agent.daemon", "agent.service", "agent.cooling"}),
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


def test_agent_rooms_are_the_known_ones() -> None:
    """A new folder gets its rules here before it gets code."""
    rooms = {room for path in modules("agent") if (room := agent_room(path))}
    assert rooms == set(AGENT_RULES) | {"commands", "service"}


def test_agent_top_level_stays_small() -> None:
    top = sorted(path.name for path in modules("agent") if agent_room(path) is None)
    assert len(top) <= TOP_LEVEL_LIMIT, top


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


COORDINATOR = ROOT / "coordinator"
COORDINATOR_RULES: dict[str, frozenset[str]] = {
    "hosts": frozenset(
        {"coordinator.runs", "coordinator.telemetry", "coordinator.reports", "coordinator.commands"}
    ),
    "runs": frozenset({"coordinator.telemetry", "coordinator.commands"}),
    "telemetry": frozenset({"coordinator.runs", "coordinator.reports", "coordinator.commands"}),
    "reports": frozenset({"coordinator.runs", "coordinator.commands"}),
    "commands": frozenset(),
}
"""coordinator/'s rooms and what each may not import (a module or any of its submodules)."""
COORDINATOR_TOP = frozenset({"__init__.py", "cli.py"})

SHARED = ROOT / "shared"
SHARED_KIT = frozenset(
    {"shapes", "tables", "safe_text", "stats", "bounds", "clock", "exit_codes", "__init__"}
)
"""The small kit at shared/'s top: what every room may use."""
SHARED_ROOMS = ("cooling", "benchmark", "distributed", "wire", "reports", "io", "staging")
SHARED_RULES: dict[str, frozenset[str]] = {
    "kit": frozenset(f"shared.{room}" for room in SHARED_ROOMS),
    "cooling": frozenset(f"shared.{room}" for room in SHARED_ROOMS if room != "cooling"),
    "benchmark": frozenset({"shared.distributed", "shared.wire", "shared.reports"}),
    "distributed": frozenset({"shared.benchmark", "shared.wire", "shared.reports"}),
    "wire": frozenset({"shared.reports"}),
    "reports": frozenset(),
    "io": frozenset(),
    "staging": frozenset(
        {"shared.benchmark", "shared.distributed", "shared.cooling", "shared.reports"}
    ),
}
"""shared/'s rooms and what each may not import, beside the purity rule (IO_MODULES)."""
SHARED_ROOM_LIMIT = 14
SHARED_MODULE_LIMIT = 700
"""Lines: a module of shared/ past this is several concepts."""


def room_of(path: Path, package_dir: Path) -> str | None:
    """The folder of a package that `path` sits in; None for a module at the package's top."""
    parts = path.relative_to(package_dir).parts
    return parts[0] if len(parts) > 1 else None


def coordinator_breaks(path: Path) -> list[str]:
    room = room_of(path, COORDINATOR) or ""
    found = set(offending(path, COORDINATOR_RULES.get(room, frozenset())))
    found |= set(cli_breaks(path, COORDINATOR, "coordinator"))
    return sorted(found)


def shared_breaks(path: Path) -> list[str]:
    room = room_of(path, SHARED) or "kit"
    return offending(path, SHARED_RULES.get(room, frozenset()))


def test_coordinator_rooms_are_the_known_ones() -> None:
    """At most six rooms: the five folders and cli.py. A new folder gets its rules here first."""
    rooms = {room for path in modules("coordinator") if (room := room_of(path, COORDINATOR))}
    top = {path.name for path in modules("coordinator") if room_of(path, COORDINATOR) is None}
    assert rooms == set(COORDINATOR_RULES)
    assert top <= COORDINATOR_TOP, sorted(top - COORDINATOR_TOP)


def room_breaks(package: str, path: Path) -> list[str]:
    """What `path` imports that the rules of its room in `package` forbid (coordinator's and
    agent's: the CLI kit outside the commands too)."""
    checks = {"agent": agent_breaks, "coordinator": coordinator_breaks, "shared": shared_breaks}
    return checks[package](path)


@pytest.mark.parametrize("package", ["agent", "coordinator", "shared"])
def test_rooms_import_only_what_their_rules_allow(package: str) -> None:
    breaks = {
        str(path.relative_to(ROOT)): found
        for path in modules(package)
        if (found := room_breaks(package, path))
    }
    assert breaks == {}


def test_shared_rooms_are_the_known_ones() -> None:
    rooms = {room for path in modules("shared") if (room := room_of(path, SHARED))}
    top = {path.stem for path in modules("shared") if room_of(path, SHARED) is None}
    assert rooms == set(SHARED_ROOMS)
    assert top <= SHARED_KIT, sorted(top - SHARED_KIT)
    assert len(rooms) + len(top - {"__init__"}) <= SHARED_ROOM_LIMIT


CLASS_LIMIT = 250
"""Lines, a class's first to its last: a class past this is several (README, Design)."""


@pytest.mark.parametrize("package", ["agent", "coordinator", "shared", "tests", "bench"])
def test_classes_stay_one_concept_long(package: str) -> None:
    long = {
        f"{path.relative_to(ROOT)}: {node.name}": lines
        for path in modules(package)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
        and (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > CLASS_LIMIT
    }
    assert long == {}


def test_shared_modules_stay_one_concept_long() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in modules("shared")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > SHARED_MODULE_LIMIT
    }
    assert long == {}


def import_graph(package: str) -> dict[str, set[str]]:
    """Module name → the package's modules it imports (a package's __init__ by its own name)."""
    names = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in modules(package)
    }
    return {
        name: {other for other in imported(path) if other in names and other != name}
        for name, path in names.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph` (its strongly connected components of two or more)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(name: str) -> None:
        order[name] = low[name] = len(order)
        stack.append(name)
        for other in sorted(graph[name]):
            if other not in order:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in stack:
                low[name] = min(low[name], order[other])
        if low[name] == order[name]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == name:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in order:
            visit(name)
    return found


@pytest.mark.parametrize("package", ["agent", "coordinator", "shared"])
def test_no_import_circles(package: str) -> None:
    assert circles(import_graph(package)) == []


def test_the_circle_finder_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_the_coordinator_and_shared_rules_catch_a_violation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rule, on a scratch module written into a room for the test."""
    coordinator_cases = {
        "hosts/scratch.py": "from coordinator.runs.store import RunStore\n",
        "runs/scratch.py": "def f():\n    import coordinator.telemetry.monitor\n",
        "telemetry/scratch.py": "from coordinator.runs.fleet import run_fleet\n",
        "reports/scratch.py": "from coordinator.runs.store import RunStore\n",
        "runs/typer_scratch.py": "import typer\n",
    }
    shared_cases = {
        "scratch.py": "from shared.wire.protocol import DEFAULT_PORT\n",
        "cooling/scratch.py": "from shared.benchmark.matrix import Cell\n",
        "benchmark/scratch.py": "from shared.distributed.group import BenchGroup\n",
        "distributed/scratch.py": "import shared.benchmark.verdict\n",
        "wire/scratch.py": "from shared.reports.benchmark import render_text\n",
    }
    monkeypatch.setattr(sys.modules[__name__], "COORDINATOR", tmp_path / "coordinator")
    monkeypatch.setattr(sys.modules[__name__], "SHARED", tmp_path / "shared")
    found = {}
    for package, cases, check in (
        ("coordinator", coordinator_cases, coordinator_breaks),
        ("shared", shared_cases, shared_breaks),
    ):
        for name, text in cases.items():
            path = tmp_path / package / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            found[f"{package}/{name}"] = check(path)
    assert found == {
        "coordinator/hosts/scratch.py": [
            "coordinator.runs.store",
            "coordinator.runs.store.RunStore",
        ],
        "coordinator/runs/scratch.py": ["coordinator.telemetry.monitor"],
        "coordinator/telemetry/scratch.py": [
            "coordinator.runs.fleet",
            "coordinator.runs.fleet.run_fleet",
        ],
        "coordinator/reports/scratch.py": [
            "coordinator.runs.store",
            "coordinator.runs.store.RunStore",
        ],
        "coordinator/runs/typer_scratch.py": ["typer"],
        "shared/scratch.py": ["shared.wire.protocol", "shared.wire.protocol.DEFAULT_PORT"],
        "shared/cooling/scratch.py": ["shared.benchmark.matrix", "shared.benchmark.matrix.Cell"],
        "shared/benchmark/scratch.py": [
            "shared.distributed.group",
            "shared.distributed.group.BenchGroup",
        ],
        "shared/distributed/scratch.py": ["shared.benchmark.verdict"],
        "shared/wire/scratch.py": [
            "shared.reports.benchmark",
            "shared.reports.benchmark.render_text",
        ],
    }
