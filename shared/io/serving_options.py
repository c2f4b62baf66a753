"""The serving axis's options (shared.benchmark.serving), declared once for `agent bench` and
`coordinator benchmark`: an option group as shared.io.options' others (`with_options`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from shared.benchmark.matrix import (
    BUILTIN_DEFAULT_BITS,
    MatrixError,
    MatrixSpec,
    expand,
    parse_int_list,
)
from shared.benchmark.serving import (
    DEFAULT_REQUESTS,
    MAX_REQUESTS,
    MAX_SERVE_S,
    SERVED_MODEL,
    SERVERS,
    ServingError,
    ServingSpec,
    parse_prompt_file,
    parse_rates,
)
from shared.benchmark.serving_figures import DEFAULT_SLO, SLO_PRESETS
from shared.benchmark.sustain import SustainError, parse_duration
from shared.bounds import duration_text
from shared.io.given import count, path_given, positive

Concurrency = Annotated[
    str | None,
    typer.Option(
        "--concurrency",
        help="Comma list of clients, each sending its next request as its last completes (a "
        "closed loop): a serving test `serve c<N>` each, through mlx-lm's batch engine.",
    ),
]
RequestRate = Annotated[
    str | None,
    typer.Option(
        "--request-rate",
        help="Comma list of request rates (per second), arriving as a seeded Poisson process "
        "whatever the engine does (an open loop): a serving test `serve r<R>` each.",
    ),
]
Requests = Annotated[
    int | None,
    typer.Option(
        "--requests",
        help=f"Requests per timed pass of a serving test (default {DEFAULT_REQUESTS}); the "
        "most, with --serve-duration.",
        callback=count("--requests", 1, MAX_REQUESTS),
    ),
]
ServeDuration = Annotated[
    str | None,
    typer.Option(
        "--serve-duration",
        help="Send requests for this long per timed pass (30s, 2m), instead of a count; at most "
        f"{duration_text(MAX_SERVE_S)}.",
    ),
]
PromptFile = Annotated[
    Path | None,
    typer.Option(
        "--prompt-file",
        help='JSONL, a request per line: {"prompt": "..."} or mlx-lm server_benchmark\'s '
        '{"messages": [...]}, "max_tokens" optional (else -n); else -p random tokens (over '
        "HTTP, -p words).",
        parser=path_given("--prompt-file"),
        metavar="FILE",
    ),
]
ServeSeed = Annotated[
    int,
    typer.Option(
        "--serve-seed",
        help="Seed of the synthetic prompts and of the open loop's arrivals.",
        callback=count("--serve-seed", 0, 2**32 - 1),
    ),
]

ServeUrlOption = Annotated[
    str | None,
    typer.Option(
        "--serve-url",
        help="Send the serving tests to this OpenAI-compatible server (http://HOST:PORT, as "
        "the agent reaches it), streamed; its model is the server's.",
        metavar="URL",
    ),
]
Serve = Annotated[
    str | None,
    typer.Option(
        "--serve",
        help="Start this server with each --model for each serving test and stop it after: "
        f"{', '.join(SERVERS)} (mlx_lm.server on a free local port).",
        metavar="SERVER",
    ),
]


def slo_limit(flag: str, limit: str, interactive_ms: float) -> Any:
    """One of goodput's two limits (ms), MLPerf's conversational one by default."""
    return Annotated[
        float,
        typer.Option(
            flag,
            help=f"Goodput's {limit} limit, ms: MLPerf's conversational Llama-3.1-8B "
            f"constraint by default (interactive: {interactive_ms:g}).",
            callback=positive(flag, "ms", MAX_SERVE_S * 1000),
        ),
    ]


SloTtft = slo_limit("--slo-ttft", "time-to-first-token", SLO_PRESETS["interactive"].ttft_ms)
SloTpot = slo_limit("--slo-tpot", "time-per-output-token", SLO_PRESETS["interactive"].tpot_ms)

FLAG_OF_FIELD = {
    "serving.concurrency": "--concurrency",
    "serving.request_rates": "--request-rate",
    "serving.requests": "--requests",
    "serving.duration_s": "--serve-duration",
    "serving.seed": "--serve-seed",
    "serving.serve_url": "--serve-url",
    "serving.serve": "--serve",
    "n_pg": "-pg",
    "n_depth": "--n-depth",
    "batch_sizes": "--batch-sizes",
}
"""The option that sets each field a serving matrix's own checks name."""


@dataclass(frozen=True)
class ServingOptions:
    """The serving axis: with --concurrency or --request-rate every cell is a serving test."""

    concurrency: Concurrency = None
    request_rate: RequestRate = None
    requests: Requests = None
    serve_duration: ServeDuration = None
    prompt_file: PromptFile = None
    serve_seed: ServeSeed = 0
    slo_ttft: SloTtft = SLO_PRESETS[DEFAULT_SLO].ttft_ms
    slo_tpot: SloTpot = SLO_PRESETS[DEFAULT_SLO].tpot_ms
    serve_url: ServeUrlOption = None
    serve: Serve = None

    @property
    def given(self) -> bool:
        return self.concurrency is not None or self.request_rate is not None

    def serving(self) -> ServingSpec | None:
        """The serving axis asked for, None without --concurrency and --request-rate; raises
        MatrixError naming the option (the prompt file read and checked here, on this machine:
        it travels in the spec)."""
        if not self.given:
            for flag, value in (
                ("--requests", self.requests),
                ("--serve-duration", self.serve_duration),
                ("--prompt-file", self.prompt_file),
                ("--serve-url", self.serve_url),
                ("--serve", self.serve),
            ):
                if value is not None:
                    raise MatrixError(
                        f"{flag} applies to serving tests: give --concurrency or --request-rate too"
                    )
            return None
        try:
            prompts = () if self.prompt_file is None else _prompts(self.prompt_file)
            return ServingSpec(
                concurrency=(
                    parse_int_list(self.concurrency, "--concurrency") if self.concurrency else ()
                ),
                request_rates=parse_rates(self.request_rate) if self.request_rate else (),
                requests=DEFAULT_REQUESTS if self.requests is None else self.requests,
                duration_s=(
                    None
                    if self.serve_duration is None
                    else parse_duration(self.serve_duration, "--serve-duration")
                ),
                prompts=prompts,
                seed=self.serve_seed,
                slo_ttft_ms=self.slo_ttft,
                slo_tpot_ms=self.slo_tpot,
                serve_url=self.serve_url,
                serve=self.serve,
            )
        except (ServingError, SustainError) as exc:
            raise MatrixError(as_serving_flags(str(exc))) from None

    def apply(self, spec: MatrixSpec) -> MatrixSpec:
        """`spec` with the serving axis, checked whole; MatrixError naming the option."""
        serving = self.serving()
        if serving is None:
            return spec
        if serving.serve_url is not None and all(m in BUILTIN_DEFAULT_BITS for m in spec.models):
            # No --model: the server's own model, not a built-in config.
            spec = dataclasses.replace(spec, models=(SERVED_MODEL,), bits=(None,))
        if serving.serve is not None and any(m in BUILTIN_DEFAULT_BITS for m in spec.models):
            raise MatrixError(
                f"--serve {serving.serve} serves an mlx-lm model: give --model DIR or ORG/NAME "
                "(a built-in config is not one it loads)"
            )
        spec = dataclasses.replace(spec, serving=serving)
        try:
            expand(spec)
        except MatrixError as exc:
            raise MatrixError(as_serving_flags(str(exc))) from None
        return spec


def _prompts(path: Path) -> tuple:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ServingError(f"--prompt-file {path}: cannot be read ({exc})") from None
    return parse_prompt_file(text, str(path))


def as_serving_flags(message: str) -> str:
    """A serving field's message (`serving.concurrency[0]: ...`) told as its option."""
    head, sep, rest = message.partition(": ")
    field, _, index = head.partition("[")
    flag = FLAG_OF_FIELD.get(field)
    if not sep or flag is None:
        return message
    number = index.split("]")[0]
    return f"{flag} item {int(number) + 1}: {rest}" if number.isdigit() else f"{flag}: {rest}"
