"""The command-line options of `agent` and `coordinator` that two or more commands take,
each declared once: its flags, its help, its default and the check of its value. One command's
own options live in that command's module (agent/commands/, coordinator/commands/). Commands take
related options whole, as an option group (a frozen dataclass of options) expanded by
`with_options`, so `agent bench` and `coordinator benchmark` cannot drift apart on the matrix, nor
`agent bench`, `agent run`, `agent temp` and `agent serve` on the thermal source and the policy.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_type_hints

import typer

from shared.benchmark.energy import DEFAULT_BASELINE_S
from shared.benchmark.matrix import (
    BUILTIN_DEFAULT_BITS,
    DEFAULT_COOL_START_S,
    DEFAULT_MAX_REPETITIONS,
    MAX_ITERATIONS,
    MatrixError,
    MatrixSpec,
    expand,
    parse_int_list,
    parse_pair,
    parse_precision,
)
from shared.benchmark.sustain import DEFAULT_WINDOW_S, SustainError, SustainPlan, parse_duration
from shared.benchmark.verdict import NOISY_SHARE
from shared.bounds import (
    MAX_CALIBRATE_MINUTES,
    MAX_COOL_START_S,
    MAX_DELAY_S,
    MAX_IDLE_BASELINE_S,
    MAX_POLL_INTERVAL_S,
    MAX_RETENTION_DAYS,
    MAX_SUSTAIN_S,
    MAX_SUSTAIN_WINDOW_S,
    MAX_WARMUP,
    BoundError,
    check_seconds,
    duration_text,
)
from shared.cooling.calibration import (
    SET_ON_COMMAND_LINE,
    PolicyInForce,
    check_given,
    source_defaults,
    with_given,
)
from shared.cooling.sources import DEFAULT_POLL_INTERVAL_S, POWER_SOURCE_HELP, SOURCE_HELP
from shared.io.cli import usage_error
from shared.io.given import (  # the option callbacks, where every command takes them from
    apart_from,
    at_least_zero,
    count,
    finite_number,
    not_empty,
    one_of,
    path_given,
    positive,
)
from shared.io.serving_options import ServingOptions
from shared.reports.benchmark import FORMATS
from shared.reports.llama_bench import LabelError, check_label
from shared.stats import MIN_AUTO_REPETITIONS

TABLE_OR_JSON = ("table", "json")
DEFAULT_MATRIX = MatrixSpec()
AUTO = "auto"
"""`-r auto`: repeat each cell until its interval reaches --precision (shared.stats)."""


def bounded_option(flag: str, help: str, unit: str, most: float, *aliases: str) -> Any:
    """A float option that must be finite, above 0 and at most `most` (a bound of
    shared.bounds), refused in one line naming `flag` otherwise: every duration the CLIs take."""
    return Annotated[
        float, typer.Option(flag, *aliases, help=help, callback=positive(flag, unit, most))
    ]


TAKES_A_KEY: dict[str, Any] = {"ignore_unknown_options": True}
"""context_settings of a command with a CURVE key argument: a Z85 key may start with '-' (or
'--'), which Click would otherwise take for an unknown option. Its short options (`-h`) are kept
from a key's letters by shared.io.app.TakesAKey, the command's class."""


# --- single options -----------------------------------------------------------------------------

NPrompt = Annotated[
    str,
    typer.Option(
        "-p",
        "--n-prompt",
        "-s",
        "--seq-lengths",
        "--prompt-tokens",
        help="Comma list of prompt lengths: a test pp<N> each (0: none). -s/--seq-lengths and "
        "--prompt-tokens (mlx_lm.benchmark's) are aliases.",
    ),
]
NGen = Annotated[
    str,
    typer.Option(
        "-n",
        "--n-gen",
        "--decode-tokens",
        "--generation-tokens",
        help="Comma list of generation lengths: a test tg<N> each (0: none); llama-bench's -n, "
        "not mlx_lm.benchmark's (its trials: -r here). --decode-tokens and --generation-tokens "
        "(mlx_lm.benchmark's -g) are aliases.",
    ),
]
NPromptGen = Annotated[
    list[str] | None,
    typer.Option(
        "-pg",
        help="PROMPT,GENERATED: a test pp<P>+tg<G> timing both as one figure; repeatable.",
    ),
]
NDepth = Annotated[
    str,
    typer.Option(
        "-d",
        "--n-depth",
        help="Comma list of depths: tokens already in the KV cache (untimed) before each test.",
    ),
]
BatchSizes = Annotated[
    str,
    typer.Option(
        "-b",
        "--batch-sizes",
        "--batch-size",
        help="Comma list of batch sizes (sequences), mlx_lm.benchmark's -b; not llama-bench's -b "
        "(n_batch: --prefill-step-size here).",
    ),
]
Warmup = Annotated[
    int,
    typer.Option(
        "-w",
        "--warmup",
        help=f"Untimed iterations per cell (at most {MAX_WARMUP}).",
        callback=count("--warmup", 0, MAX_WARMUP),
    ),
]
Repetitions = Annotated[
    str,
    typer.Option(
        "-r",
        "--repetitions",
        "-i",
        "--iterations",
        "--num-trials",
        metavar=f"N|{AUTO}",
        help=f"Timed iterations per cell, or {AUTO}: at least {MIN_AUTO_REPETITIONS}, then more "
        "until the 95 % interval of the mean tok/s is within --precision, or "
        "--max-repetitions (docs/performance.md, Adaptive repetitions). -i/--iterations and "
        "--num-trials (mlx_lm.benchmark's -n) are aliases.",
    ),
]
Precision = Annotated[
    str | None,
    typer.Option(
        "--precision",
        metavar="SHARE",
        help=f"With -r {AUTO}: the share of the mean the 95 % half-width may reach, as 0.02 or "
        f"2% [default: {NOISY_SHARE:.0%}, the noisy limit].",
    ),
]
MaxRepetitions = Annotated[
    int | None,
    typer.Option(
        "--max-repetitions",
        help=f"With -r {AUTO}: the most timed iterations per cell; a cell that stops here short "
        f"of --precision is noisy [default: {DEFAULT_MAX_REPETITIONS}].",
    ),
]
PrefillStepSize = Annotated[
    int,
    typer.Option(
        "--prefill-step-size",
        help="Prompt tokens per forward pass while filling the KV cache (mlx-lm's).",
    ),
]
Delay = Annotated[
    float,
    typer.Option(
        "--delay",
        help="Seconds to wait between two cells (lets a fanless Mac cool); at most "
        f"{duration_text(MAX_DELAY_S)}.",
        callback=at_least_zero("--delay", "seconds", MAX_DELAY_S),
    ),
]
CoolStartLimit = Annotated[
    float,
    typer.Option(
        "--cool-start-limit",
        metavar="SECONDS",
        help="The most a cell waits, before it starts, for the machine to get below the "
        "policy's reduce threshold with nominal pressure; past it the cell runs, flagged "
        f"hot-start. At most {duration_text(MAX_COOL_START_S)}.",
        callback=apart_from(
            "--cool-start-limit",
            "--no-cool-start",
            at_least_zero("--cool-start-limit", "seconds", MAX_COOL_START_S),
        ),
    ),
]
NoCoolStart = Annotated[
    bool, typer.Option("--no-cool-start", help="Start every cell at once, however hot it is.",
                       callback=apart_from("--no-cool-start", "--cool-start-limit")),
]  # fmt: skip
ConfigSmall = Annotated[
    bool,
    typer.Option(
        "--config-small",
        help="The ~4M-parameter model, for smoke tests: instant in float16 (its default), not "
        "with --bits 4/8 on MLX's CPU backend (quantized matmuls are 50-400x slower there).",
    ),
]
ConfigName = Annotated[
    str | None,
    typer.Option(
        "--config", help="Built-in model: small, or full (Llama-3.2-3B shaped; the default)."
    ),
]
Models = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        help="An mlx-lm model directory (config.json + safetensors), or a Hugging Face id "
        "ORG/NAME[@REVISION] resolved as mlx-lm does; repeatable.",
        callback=not_empty("--model"),
    ),
]
Bits = Annotated[
    str | None,
    typer.Option(
        "--bits",
        help="Comma list of 4, 8, 16 (16 = float16). Default: 4 for full, 16 for "
        "small, the stored weights for --model.",
        callback=not_empty("--bits"),
    ),
]
ThermalSourceName = Annotated[
    str, typer.Option("--thermal-source", "--source", callback=not_empty("--thermal-source"),
                      help=f"Where temperatures come from: {SOURCE_HELP}"),
]  # fmt: skip
PollInterval = bounded_option(
    "--poll-interval",
    "Seconds between temperature readings.",
    "seconds",
    MAX_POLL_INTERVAL_S,
    "--interval",
)
CalibrateMinutes = bounded_option(
    "--minutes",
    "Minutes the calibration runs: flat out until the Mac throttles, then held below it.",
    "minutes",
    MAX_CALIBRATE_MINUTES,
)
PowerSourceName = Annotated[
    str,
    typer.Option(
        "--power-source",
        help=f"Where energy comes from (docs/energy.md): {POWER_SOURCE_HELP}",
    ),
]
IdleBaseline = Annotated[
    float,
    typer.Option(
        "--idle-baseline",
        help="Seconds of idle power measured before the matrix (at least two of the meter's "
        "intervals), subtracted from each cell's joules for its net energy; 0 skips it.",
        callback=at_least_zero("--idle-baseline", "seconds", MAX_IDLE_BASELINE_S),
    ),
]
SustainDuration = Annotated[
    str | None,
    typer.Option(
        "--sustain",
        help="Run each cell continuously for DURATION (30s, 20m, 1h) and report it window by "
        "window: tok/s, °C, watts and the policy's state; first-window and steady-state tok/s, "
        f"the throttle ratio and the time to throttle. At most {duration_text(MAX_SUSTAIN_S)}.",
    ),
]
SustainWindowLength = Annotated[
    str | None,
    typer.Option(
        "--sustain-window",
        help=f"The length of each window of a --sustain run, at most "
        f"{duration_text(MAX_SUSTAIN_WINDOW_S)} [default: {DEFAULT_WINDOW_S:g}s].",
    ),
]
PLOT_EXTRA = "pip install 'mlx-fleet[plot]'"
UNSET_POLICY = "; unset: as it is, or the thermal source's default (docs/thermal.md)"


def policy_option(flag: str, meaning: str) -> Any:
    """A cooling policy's number (°C): finite, or refused by name; unset keeps what is in force."""
    return Annotated[
        float, typer.Option(flag, help=f"{meaning}{UNSET_POLICY}.", callback=finite_number(flag))
    ]


MaxSpeedTemp = policy_option(
    "--max-speed-temp", "°C from which the policy asks to reduce the batch"
)
PauseTemp = policy_option("--pause-temp", "°C from which work pauses")
StopTemp = policy_option("--stop-temp", "°C at which work stops (after 3 polls in a row)")
Hysteresis = policy_option("--hysteresis", "A pause ends below pause-temp minus this many °C")
PaceTemp = policy_option(
    "--pace-temp",
    "°C the pace tier holds the Mac under by duty-cycling the job (at most pause-temp: its "
    "calibrated onset, say)",
)
PaceSlice = policy_option("--pace-slice", "Seconds of each pace slice, 0.05 to 0.5")
PaceMinDuty = policy_option(
    "--pace-min-duty", "Lowest share of a slice a paced job runs, 0.05 to 0.9"
)


def unset(option: Any) -> Any:
    """`option` for a float that is None when not given."""
    return Annotated[(float | None, *option.__metadata__)]


MaxSpeedGiven, PauseGiven = unset(MaxSpeedTemp), unset(PauseTemp)
StopGiven, HysteresisGiven = unset(StopTemp), unset(Hysteresis)
PaceTempGiven, PaceSliceGiven = unset(PaceTemp), unset(PaceSlice)
PaceMinDutyGiven = unset(PaceMinDuty)
PaceAtOnsetGiven = Annotated[
    bool | None,
    typer.Option(
        "--pace-at-onset/--no-pace-at-onset",
        help="Pace each Mac under its own calibrated throttle onset (agent calibrate), or under "
        "pause-temp less 2 °C where that is lower; a Mac without a calibration is not paced and "
        "says so. Not with --pace-temp; unset: as it is.",
    ),
]


def output_format(choices: tuple[str, ...], help: str | None = None) -> Any:
    """The one format option of every command that prints a format: `-o/--output-format`
    (llama-bench's -o), `--format` an alias, taking only `choices` (what the command can
    print); any other value is one line, exit 2."""
    shown = help or f"One of {', '.join(choices)}."
    return Annotated[
        str,
        typer.Option(
            "-o",
            "--output-format",
            "--format",
            metavar="FORMAT",
            help=f"{shown} --format is an alias.",
            callback=one_of(choices),
        ),
    ]


ReportFormat = output_format(
    FORMATS,
    f"One of {', '.join(FORMATS)} (llama-bench's -o; csv, jsonl, sql and llama-json hold "
    "llama-bench's rows, which compare-llama-bench.py reads; llama-json is its JSON array).",
)
"""A benchmark report's format (shared.reports.benchmark)."""
LinkReportFormat = output_format(tuple(f for f in FORMATS if f != "llama-json"))
"""A netbench report's format: a link has no llama-bench row."""


def label_given(value: str | None) -> str | None:
    """--label's check (shared.reports.llama_bench.check_label): one line, exit 2."""
    if value is None:
        return None
    try:
        return check_label(value)
    except LabelError as exc:
        raise usage_error(str(exc)) from None


Label = Annotated[
    str | None,
    typer.Option(
        "--label",
        metavar="TEXT",
        help="build_commit of the llama-bench rows (csv, jsonl, sql, llama-json): the name "
        "compare-llama-bench.py's -b/-c take [default: each host's MLX version]; a macOS "
        "build, a host, an mlx-fleet version. Runs compared need labels of one length.",
        callback=label_given,
    ),
]
"""What a run is called in llama-bench's rows (shared.reports.llama_bench)."""
TableFormat = output_format(TABLE_OR_JSON, "table (for people) or json (for scripts).")
"""Every other command's: a Rich table for people, JSON for scripts (shared.io.cli.emit)."""
Output = Annotated[
    Path | None,
    typer.Option("--output", help="Write the report to FILE.", parser=path_given("--output")),
]
RunId = Annotated[
    str, typer.Argument(help="A run id, or a unique prefix of one (`coordinator runs` lists them).")
]
"""A stored run, as `coordinator show`, `compare`, `resume` and `cancel` take it."""
RetentionDays = bounded_option(
    "--retention-days",
    "Telemetry samples and events older than this many days are dropped.",
    "days",
    MAX_RETENTION_DAYS,
)


# --- option groups ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatrixOptions:
    """What to benchmark (shared.benchmark.matrix), llama-bench's options and names: `agent bench`
    and `coordinator benchmark` alike."""

    n_prompt: NPrompt = ",".join(map(str, DEFAULT_MATRIX.n_prompt))
    n_gen: NGen = ",".join(map(str, DEFAULT_MATRIX.n_gen))
    pg: NPromptGen = None
    n_depth: NDepth = ",".join(map(str, DEFAULT_MATRIX.n_depth))
    batch_sizes: BatchSizes = ",".join(map(str, DEFAULT_MATRIX.batch_sizes))
    warmup: Warmup = DEFAULT_MATRIX.warmup
    repetitions: Repetitions = str(DEFAULT_MATRIX.iterations)
    precision: Precision = None
    max_repetitions: MaxRepetitions = None
    prefill_step_size: PrefillStepSize = DEFAULT_MATRIX.prefill_step_size
    delay: Delay = DEFAULT_MATRIX.delay_s
    cool_start_limit: CoolStartLimit = DEFAULT_COOL_START_S
    no_cool_start: NoCoolStart = False
    config_small: ConfigSmall = False
    config: ConfigName = None
    model: Models = None
    bits: Bits = None

    def spec(self, models: list[str] | None = None) -> MatrixSpec:
        """The options as a validated MatrixSpec, with `models` for --model (as the caller
        resolved them; as given, by default). Raises MatrixError naming the problem."""
        if self.config is not None and self.config not in BUILTIN_DEFAULT_BITS:
            known = ", ".join(BUILTIN_DEFAULT_BITS)
            raise MatrixError(f"unknown config {self.config!r}; known configs: {known}")
        if self.config_small and self.config not in (None, "small"):
            raise MatrixError(
                f"--config-small and --config {self.config} conflict: give one of them"
            )
        if models is None:
            models = list(self.model or [])
        iterations, precision = self.repetitions_plan()
        configs = ["small"] if self.config_small else [self.config] if self.config else []
        if not configs and not models:
            configs = ["full"]
        spec = MatrixSpec(
            n_prompt=parse_int_list(self.n_prompt, "--n-prompt"),
            n_gen=parse_int_list(self.n_gen, "--n-gen"),
            n_pg=tuple(parse_pair(pair, "-pg") for pair in self.pg or []),
            n_depth=parse_int_list(self.n_depth, "--n-depth"),
            batch_sizes=parse_int_list(self.batch_sizes, "--batch-sizes"),
            models=(*configs, *models),
            bits=parse_int_list(self.bits, "--bits") if self.bits is not None else (None,),
            warmup=self.warmup,
            iterations=iterations,
            precision=precision,
            prefill_step_size=self.prefill_step_size,
            delay_s=self.delay,
            cool_start_s=0.0 if self.no_cool_start else self.cool_start_limit,
        )
        try:
            expand(spec)
        except MatrixError as exc:
            raise MatrixError(as_flags(str(exc))) from None
        return spec

    def repetitions_plan(self) -> tuple[int, float | None]:
        """(timed iterations, None) for -r N; (the most, the precision) for -r auto. Raises
        MatrixError naming the flag: --precision and --max-repetitions mean nothing without
        -r auto, and auto needs room for its MIN_AUTO_REPETITIONS."""
        if self.repetitions.strip().lower() != AUTO:
            for flag, value in (
                ("--precision", self.precision),
                ("--max-repetitions", self.max_repetitions),
            ):
                if value is not None:
                    raise MatrixError(f"{flag} applies to -r {AUTO} only: give -r {AUTO} too")
            try:
                return int(self.repetitions), None
            except ValueError:
                raise MatrixError(
                    f"--repetitions: {self.repetitions!r} is not a whole number or {AUTO}"
                ) from None
        most = DEFAULT_MAX_REPETITIONS if self.max_repetitions is None else self.max_repetitions
        if not MIN_AUTO_REPETITIONS <= most <= MAX_ITERATIONS:
            raise MatrixError(
                f"--max-repetitions must be {MIN_AUTO_REPETITIONS} to {MAX_ITERATIONS} "
                f"(-r {AUTO} always runs {MIN_AUTO_REPETITIONS}), got {most}"
            )
        return most, NOISY_SHARE if self.precision is None else parse_precision(self.precision)


FLAG_OF_FIELD = {
    "n_prompt": "--n-prompt",
    "n_gen": "--n-gen",
    "n_pg": "-pg",
    "n_depth": "--n-depth",
    "batch_sizes": "--batch-sizes",
    "bits": "--bits",
    "models": "--model",
    "warmup": "--warmup",
    "iterations": "--repetitions",
    "prefill_step_size": "--prefill-step-size",
    "delay_s": "--delay",
    "cool_start_s": "--cool-start-limit",
}
"""The option that sets each matrix field: validate()'s messages start with the wire field."""


def as_flags(message: str) -> str:
    """validate()'s message with its leading wire field (`n_prompt[0]: ...`) told as the option
    (`--n-prompt item 1: ...`); a message about several fields is left as it is."""
    head, sep, rest = message.partition(": ")
    field, _, index = head.partition("[")
    flag = FLAG_OF_FIELD.get(field)
    if not sep or flag is None or "," in head:
        return message
    if index:
        number = index.split("]")[0]
        if number.isdigit():
            return f"{flag} item {int(number) + 1}: {rest}"
    return f"{flag}: {rest}" if head == field else message


def check_sustained_repetitions(spec: MatrixSpec, plan: SustainPlan | None) -> None:
    """Exit 2 for -r auto with --sustain: a sustained cell runs for its duration, not to a
    precision."""
    if plan is not None and spec.serving is not None:
        raise usage_error("--sustain and a serving test conflict: it runs its requests' passes")
    if plan is not None and spec.precision is not None:
        raise usage_error(
            f"-r {AUTO} and --sustain conflict: a sustained cell runs for its duration"
        )


@dataclass(frozen=True)
class ThermalOptions:
    """Where temperatures come from and how often they are read."""

    thermal_source: ThermalSourceName = "auto"
    poll_interval: PollInterval = DEFAULT_POLL_INTERVAL_S


@dataclass(frozen=True)
class PowerOptions:
    """Where energy comes from, and how long the idle baseline before a matrix lasts."""

    power_source: PowerSourceName = "auto"
    idle_baseline: IdleBaseline = DEFAULT_BASELINE_S


@dataclass(frozen=True)
class SustainOptions:
    """A sustained run: each cell for a duration, reported window by window
    (shared.benchmark.sustain)."""

    sustain: SustainDuration = None
    sustain_window: SustainWindowLength = None

    def plan(self) -> SustainPlan | None:
        """The plan (None without --sustain), or exit 2 naming what is wrong: a duration that
        does not parse, one shorter than two windows, or a window without --sustain."""
        if self.sustain is None:
            if self.sustain_window is not None:
                raise usage_error("--sustain-window cuts a sustained run: give --sustain too")
            return None
        try:
            window = self.sustain_window
            plan = SustainPlan(
                parse_duration(self.sustain, "--sustain"),
                DEFAULT_WINDOW_S if window is None else parse_duration(window, "--sustain-window"),
            )
            check_seconds("--sustain", plan.duration_s, MAX_SUSTAIN_S, shown=self.sustain)
            if window is not None:
                check_seconds("--sustain-window", plan.window_s, MAX_SUSTAIN_WINDOW_S, shown=window)
            plan.check()
        except (SustainError, BoundError) as exc:
            raise usage_error(str(exc)) from None
        return plan


@dataclass(frozen=True)
class PolicyChanges:
    """The thresholds, each None unless given: what `coordinator policy` pushes."""

    max_speed_temp: MaxSpeedGiven = None
    pause_temp: PauseGiven = None
    stop_temp: StopGiven = None
    hysteresis: HysteresisGiven = None
    pace_temp: PaceTempGiven = None
    pace_slice: PaceSliceGiven = None
    pace_min_duty: PaceMinDutyGiven = None
    pace_at_onset: PaceAtOnsetGiven = None

    def given(self) -> dict[str, float]:
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}


@dataclass(frozen=True)
class PolicyOptions(PolicyChanges):
    """The same thresholds on a command that enforces them: those given win, the others are the
    defaults for the source that reads the temperature (shared.cooling.calibration)."""

    def check(self) -> None:
        """Exit 2 when the thresholds given are out of order among themselves: known before any
        source opens (and checked even when a daemon's policy, not these, will apply)."""
        try:
            check_given(self.given())
        except ValueError as exc:
            raise usage_error(str(exc)) from None

    def for_scale(self, scale: str | None, base: PolicyInForce | None = None) -> PolicyInForce:
        """The policy for a source of this scale, over `base` (a calibration's; the source's
        table without it); ValueError naming the thresholds out of order with those defaults
        (and saying which they are)."""
        try:
            return with_given(scale, self.given(), SET_ON_COMMAND_LINE, base)
        except ValueError as exc:
            defaults = base or source_defaults(scale)
            raise ValueError(
                f"{exc}; the thresholds not given are the {defaults.origin} "
                f"({defaults.policy.max_speed_temp:g}/{defaults.policy.pause_temp:g}/"
                f"{defaults.policy.stop_temp:g} °C): give them too"
            ) from None

    def in_force(self, scale: str | None, base: PolicyInForce | None = None) -> PolicyInForce:
        """for_scale(), or exit 2 naming the problem."""
        try:
            return self.for_scale(scale, base)
        except ValueError as exc:
            raise usage_error(str(exc)) from None


# --- taking groups whole ------------------------------------------------------------------------

F = TypeVar("F", bound=Callable[..., Any])
GROUPS = {
    MatrixOptions, ServingOptions, ThermalOptions, PolicyOptions, PolicyChanges, PowerOptions,
    SustainOptions,
}  # fmt: skip


def option_group(group: F) -> F:
    """Let with_options take `group` whole: a group one side declares (the coordinator's hosts)."""
    GROUPS.add(group)
    return group


def with_options(command: F) -> F:
    """Let `command` take option groups: each parameter annotated with a group becomes the
    group's options on the command line, and the command is called with the group built."""
    hints = get_type_hints(command, include_extras=True)
    parameters: list[inspect.Parameter] = []
    groups: dict[str, tuple[type, list[str]]] = {}
    for parameter in inspect.signature(command).parameters.values():
        hint = hints.get(parameter.name, parameter.annotation)
        if not (isinstance(hint, type) and hint in GROUPS):
            parameters.append(parameter.replace(annotation=hint))
            continue
        assert is_dataclass(hint)
        group_hints = get_type_hints(hint, include_extras=True)
        names = [f.name for f in fields(hint)]
        groups[parameter.name] = (hint, names)
        parameters += [
            inspect.Parameter(
                f.name,
                parameter.kind,
                default=f.default,
                annotation=group_hints[f.name],
            )
            for f in fields(hint)
        ]
    seen = [p.name for p in parameters]
    if len(seen) != len(set(seen)):
        raise TypeError(f"{command.__name__}: an option of a group is declared twice")

    @functools.wraps(command)
    def expanded(*args: Any, **options: Any) -> Any:
        for name, (group, names) in groups.items():
            options[name] = group(**{key: options.pop(key) for key in names})
        return command(*args, **options)

    expanded.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    expanded.__annotations__ = {p.name: p.annotation for p in parameters}
    return expanded  # type: ignore[return-value]
