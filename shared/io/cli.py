"""Command-line pieces both `agent` and `coordinator` use: matrix options, output, exit codes.

Exit codes: 0 ok, 1 partial failure (a host or cell failed), 2 usage error, 130 interrupted.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from shared.matrix import (
    BUILTIN_DEFAULT_BITS,
    MatrixError,
    MatrixSpec,
    expand,
    parse_int_list,
)
from shared.policy import ThermalPolicy
from shared.report import FORMATS, render_text, rich_report

EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 partial failure (a host or cell failed), 2 usage error, "
    "130 interrupted. `agent run` passes on its command's code (see its --help)."
)

err = Console(stderr=True, soft_wrap=True)  # log lines stay whole, never wrapped

SeqLengths = Annotated[
    str, typer.Option("-s", "--seq-lengths", help="Comma list of prompt/context lengths.")
]
BatchSizes = Annotated[
    str, typer.Option("-b", "--batch-sizes", "--batch-size", help="Comma list of batch sizes.")
]
Warmup = Annotated[int, typer.Option("-w", "--warmup", help="Untimed iterations per cell.")]
Iterations = Annotated[int, typer.Option("-i", "--iterations", help="Timed iterations per cell.")]
ConfigSmall = Annotated[
    bool, typer.Option("--config-small", help="The ~4M-parameter model: instant, for smoke tests.")
]
ConfigName = Annotated[
    str | None,
    typer.Option(
        "--config", help="Built-in model: small, or full (Llama-3.2-3B shaped; the default)."
    ),
]
ModelDirs = Annotated[
    list[Path] | None,
    typer.Option(
        "--model", help="An mlx-lm model directory (config.json + safetensors); repeatable."
    ),
]
Bits = Annotated[
    str | None,
    typer.Option(
        "--bits",
        help="Comma list of 4, 8, 16 (16 = float16). Default: 4 for full, 16 for "
        "small, the stored weights for --model.",
    ),
]
DecodeTokens = Annotated[
    int,
    typer.Option(
        "--decode-tokens", help="Tokens generated per decode cell (tg<N> @ d<seq>); 0 skips decode."
    ),
]
Format = Annotated[str, typer.Option("--format", help=f"One of {', '.join(FORMATS)}.")]
ThermalSourceName = Annotated[
    str,
    typer.Option(
        "--thermal-source",
        help="auto, none, iohid, macmon, powermetrics, linux, sim[:k=v,...], "
        "replay:CSV (sim and replay are labelled as not a sensor).",
    ),
]
PollInterval = Annotated[
    float, typer.Option("--poll-interval", help="Seconds between temperature readings.")
]
MaxSpeedTemp = Annotated[
    float,
    typer.Option("--max-speed-temp", help="°C from which the policy asks to reduce the batch."),
]
PauseTemp = Annotated[float, typer.Option("--pause-temp", help="°C from which work pauses.")]
StopTemp = Annotated[float, typer.Option("--stop-temp", help="°C at which work stops.")]
Hysteresis = Annotated[
    float, typer.Option("--hysteresis", help="A pause ends below pause-temp minus this many °C.")
]
Output = Annotated[Path | None, typer.Option("--output", help="Write the report to FILE.")]


def fleet_app(program: str, summary: str) -> typer.Typer:
    """A top-level CLI: plain rewrapped --help ending with the exit codes, and --version."""
    app = typer.Typer(
        help=summary,
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
        epilog=EXIT_CODES_HELP,
    )

    def show_version(value: bool) -> None:
        if value:
            print(f"mlx-fleet {program} {metadata.version('mlx-fleet')}")
            raise typer.Exit()

    @app.callback()
    def options(  # the option's default names a local: it cannot be a string annotation
        version: bool = typer.Option(
            False,
            "--version",
            callback=show_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ) -> None:
        pass

    return app


def usage_error(message: str) -> typer.Exit:
    """Print one line naming the problem; raise the result to exit with code 2."""
    err.print(Text("error: ", style="red") + Text(message), soft_wrap=True)
    return typer.Exit(EXIT_USAGE)


def policy_from_options(
    max_speed_temp: float, pause_temp: float, stop_temp: float, hysteresis: float
) -> ThermalPolicy:
    """The thresholds as a ThermalPolicy, or exit 2 naming the ones out of order."""
    try:
        return ThermalPolicy(max_speed_temp, pause_temp, stop_temp, hysteresis=hysteresis)
    except ValueError as exc:
        raise usage_error(str(exc)) from None


def check_format(fmt: str, output: Path | None = None) -> None:
    """Refuse a bad --format or an --output that cannot be written before any work starts."""
    if fmt not in FORMATS:
        raise usage_error(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if output is not None:
        folder = output.parent if str(output.parent) else Path(".")
        if not folder.is_dir():
            raise usage_error(f"--output {output}: folder {folder} does not exist")
        if output.is_dir():
            raise usage_error(f"--output {output} is a folder, not a file")
        if not os.access(folder, os.W_OK):
            raise usage_error(f"--output {output}: folder {folder} is not writable")


def matrix_from_options(
    seq_lengths: str,
    batch_sizes: str,
    warmup: int,
    iterations: int,
    config_small: bool,
    config: str | None,
    model_dirs: list[str],
    bits: str | None,
    decode_tokens: int,
) -> MatrixSpec:
    """The matrix options as a validated MatrixSpec; raises MatrixError naming the problem."""
    if config is not None and config not in BUILTIN_DEFAULT_BITS:
        known = ", ".join(BUILTIN_DEFAULT_BITS)
        raise MatrixError(f"unknown config {config!r}; known configs: {known}")
    configs = [config] if config else []
    if config_small:
        configs.append("small")
    if not configs and not model_dirs:
        configs = ["full"]
    spec = MatrixSpec(
        seq_lengths=parse_int_list(seq_lengths, "--seq-lengths"),
        batch_sizes=parse_int_list(batch_sizes, "--batch-sizes"),
        models=tuple(configs) + tuple(model_dirs),
        bits=parse_int_list(bits, "--bits") if bits else (None,),
        decode_tokens=decode_tokens,
        warmup=warmup,
        iterations=iterations,
    )
    expand(spec)
    return spec


def show_report(report: dict[str, Any], fmt: str, output: Path | None) -> None:
    """The report on stdout (a table sized to the terminal) or written to `output`."""
    if fmt == "table" and output is None:
        Console(width=None if sys.stdout.isatty() else 200).print(rich_report(report))
        return
    text = render_text(report, fmt)
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        err.print(
            f"error: cannot write {output}: {exc.strerror or exc}", highlight=False, markup=False
        )
        raise typer.Exit(EXIT_PARTIAL) from None
    err.print(f"wrote {output}", highlight=False, markup=False)
