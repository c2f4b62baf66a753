"""How long `coordinator --help` and `agent --help` take to start, next to `python -c pass` (the
floor every command pays), a bare two-command Typer app's --help (the floor of any Typer
command line) and `import mlx.core` (what a command that needs MLX adds), each in a fresh
process, in interleaved rounds; a round's figure for a side is the median of `--runs`
starts. Every command's start-up is its --help's plus what it imports to run: a bare Typer
command given six options (what Typer pays to parse them) and `coordinator runs -o json` on an
empty data directory (a whole command that runs) show it.

    .venv/bin/python bench/bench_cli.py [--repeats 5] [--runs 9] [--quick]

Numbers are printed, never asserted.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from support import interleave, machine, parser, round_count, run, spread, wall_s

BIN = Path(sys.executable).parent
BARE_TYPER = """
import typer
app = typer.Typer(help="x", add_completion=False, rich_markup_mode=None)
@app.command()
def one() -> None:
    \"\"\"One.\"\"\"
@app.command()
def two() -> None:
    \"\"\"Two.\"\"\"
app()
"""
"""The floor of any Typer command line's --help: two commands, nothing imported."""
BARE_OPTIONS = """
import typer
app = typer.Typer(add_completion=False)
@app.command()
def run(a: int = 1, b: float = 2.0, c: str = "x", d: bool = False, e: int = 3, f: str = "y"):
    pass
app()
"""
"""A bare Typer command run with six options given: what parsing them costs."""
SIDES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "a bare Typer app's --help": [sys.executable, "-c", BARE_TYPER, "--help"],
    "python -c 'import mlx.core'": [sys.executable, "-c", "import mlx.core"],
    "coordinator --help": [str(BIN / "coordinator"), "--help"],
    "agent --help": [str(BIN / "agent"), "--help"],
    "a bare Typer command, 6 options": [
        *(sys.executable, "-c", BARE_OPTIONS, "--a", "4", "--b", "1.5", "--c", "z"),
        *("--d", "--e", "5", "--f", "w"),
    ],
    "coordinator runs -o json": [str(BIN / "coordinator"), "runs", "-o", "json"],
}


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--runs", type=int, default=9, help="starts per side per round")
    opts = args.parse_args()
    runs = 1 if opts.quick else opts.runs
    repeats = round_count(opts)
    print(f"machine: {machine()}; {repeats} interleaved rounds of {runs} starts per side")

    scratch = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    # `coordinator runs` reads an empty store; bytecode is cached as on an installed machine,
    # even where PYTHONDONTWRITEBYTECODE would have every start compile our modules again.
    env = {**os.environ, "MLX_FLEET_HOME": str(scratch), "PYTHONPYCACHEPREFIX": str(scratch)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for command in SIDES.values():
        wall_s(command, env)  # writes the bytecode the rounds read

    def side(command: list[str]) -> Callable[[], float]:
        return lambda: statistics.median(wall_s(command, env) for _ in range(runs))

    rounds = interleave({name: side(command) for name, command in SIDES.items()}, repeats)
    print(f"{'':32} {'ms':>22} {'× python -c pass':>20}")
    for name in SIDES:
        ratio = spread(rounds.ratios(name, "python -c pass"))
        print(f"{name:32} {spread(rounds.values[name], 1000, 1):>22} {ratio:>20}")


if __name__ == "__main__":
    run(main)
