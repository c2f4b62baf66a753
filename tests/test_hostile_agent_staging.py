"""Issue 42's hostile-agent tests for what this round added (tests/test_hostile_agent.py holds
the rest, and the helpers these share): `coordinator stage` and `coordinator models` against a
fake that answers docs/protocol.md §19 with PAYLOAD in every free string (tests/fakes/
hostile_agent.py, Staging); serving cells (§5) through benchmark, show, export and compare; a
canary whose cells match on both sides while every other string is hostile; `doctor --level
2`'s bandwidth probe and level 3's burn-in; a group cell and its straggler (§17);
`coordinator calibrate` (§18). Through pipes and a pty, as the rest: no markup, control or
forged row reaches the terminal, and a reply of the wrong shape is one line naming the host,
the other host kept."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from shared.shapes import Invalid
from shared.staging.shapes import BODIES
from tests import test_hostile_agent
from tests.fakes.hostile_agent import (
    HELD_MODEL,
    PAYLOAD,
    STAGED_DIGEST,
    STAGED_REVISION,
    STAGED_SIZE,
    HostileAgent,
)
from tests.test_hostile_agent import (
    BENCH,
    BENCH_LINKS,
    LINKS,
    Run,
    Stored,
    against,
    benchmark,
    check,
    coordinator,
    hostile_output,
    lines_naming,
    not_strict_json,
    strict_json,
    table_rows,
)

pytestmark = pytest.mark.timeout(180)
fake = test_hostile_agent.fake
"""The fixture fake(mode): one fake agent per mode, this module's own."""

FORMATS = [("table", False), ("table", True), ("json", False)]
FORMAT_IDS = ["pipe", "pty", "json"]


def formatted(run: Run, fmt: str) -> list[str]:
    return not_strict_json(run, " ".join(run.args)) if fmt == "json" else []


def outside_tables(run: Run, *needles: str) -> list[str]:
    """The lines naming every needle that are no table row (a report's own lines)."""
    return [line for line in lines_naming(run, *needles) if line[:1] not in "│┃"]


# --- 1. coordinator stage and models (§19) ------------------------------------------------


@pytest.mark.parametrize(
    ("origin", "fmt", "tty"),
    [("hostile", "table", False), ("hostile", "table", True)]
    + [("benign", *case) for case in FORMATS],
)
@pytest.mark.slow
def test_strings_stage(
    fake: Callable[[str], HostileAgent], tmp_path: Path, origin: str, fmt: str, tty: bool
) -> None:
    """The hostile host as the origin (its stage.prepare.ok, models.list.ok) or as a receiver
    (its fetch's `source`, the first fetch failed with PAYLOAD in `error`, another model's task
    in stage.status; its tasks name another source than asked, so its fetch is cancelled and
    asked again, a bounded number of times: before, for ever): the stage ends staged on
    both, every agent string plain."""
    hostile, benign = fake("strings"), fake("benign")
    hosts = [hostile.address, benign.address]
    if origin == "benign":
        hosts.reverse()
    model = f"org/{origin}-{fmt}-{'pty' if tty else 'pipe'}"  # a model neither fake holds
    expect = "stage.prepare" if origin == "hostile" else "stage.status"
    args = ["stage", model, "--hosts", ",".join(hosts), *BENCH_LINKS, "-o", fmt]
    run, problems = against(hostile, expect, *args, home=tmp_path, tty=tty)
    problems += formatted(run, fmt)
    if run.returncode != 0:
        problems.append(f"exit {run.returncode}: {run.text[-800:]!r}")
    if origin == "benign" and not outside_tables(run, hostile.address, "chunk 7 failed"):
        problems.append(f"the failed first fetch is not named: {run.text[-800:]!r}")
    check(run, problems)


@pytest.mark.parametrize(("fmt", "tty"), FORMATS, ids=FORMAT_IDS)
def test_strings_models(
    fake: Callable[[str], HostileAgent], fleet_home: Path, fmt: str, tty: bool
) -> None:
    """models.list.ok's store, a held model's name, revision, refs and error."""
    hostile, benign = fake("strings"), fake("benign")
    hosts = f"{hostile.address},{benign.address}"
    args = ["models", "--hosts", hosts, *LINKS, "-o", fmt]
    run, problems = against(hostile, "models.list", *args, home=fleet_home, tty=tty)
    problems += formatted(run, fmt)
    if run.returncode != 0 or "mismatch" not in run.text:
        problems.append(f"exit {run.returncode}, no mismatched copy: {run.text[-800:]!r}")
    check(run, problems)


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "pty"])
@pytest.mark.slow
def test_strings_benchmark_refuses_a_mismatched_copy(
    fake: Callable[[str], HostileAgent], fleet_home: Path, tty: bool
) -> None:
    """`benchmark --model ORG/NAME` asks every host models.list first: the hostile host's copy
    is mismatched, so the run is refused in one line quoting its `error` as plain text."""
    hostile, benign = fake("strings"), fake("benign")
    hosts = f"{hostile.address},{benign.address}"
    args = ["benchmark", "--hosts", hosts, *BENCH_LINKS, *BENCH, "--model", HELD_MODEL]
    since = len(hostile.requests)
    run, problems = against(hostile, "models.list", *args, home=fleet_home, tty=tty)
    problems = [p for p in problems if not p.startswith("exit code 2 ")]
    if run.returncode != 2 or not lines_naming(run, hostile.address, "differs", "MARKUP"):
        problems.append(f"exit {run.returncode}, not the refusal: {run.text[-800:]!r}")
    if "bench.start" in hostile.requests[since:]:
        problems.append("a job was started")
    check(run, problems)


def stage_to_hostile(
    fake: Callable[[str], HostileAgent], mode: str, expect: str, model: str, home: Path
) -> tuple[HostileAgent, HostileAgent, Run, list[str]]:
    """`stage MODEL` from a benign origin to a receiver in `mode` (which must be asked
    `expect`): the receiver, the origin, the run and its problems."""
    hostile, benign = fake(mode), fake("benign")
    hosts = f"{benign.address},{hostile.address}"
    args = ["stage", model, "--hosts", hosts, *BENCH_LINKS]
    return hostile, benign, *against(hostile, expect, *args, home=home)


@pytest.mark.slow
def test_types_stage_fails_the_host_once(
    fake: Callable[[str], HostileAgent], fleet_home: Path
) -> None:
    """A receiver's stage.fetch.ok with `bytes` -1: one line naming the host and the field,
    that host failed (never reconnected and asked again: before, for ever), the origin held,
    exit 1."""
    hostile, benign, run, problems = stage_to_hostile(
        fake, "types", "stage.fetch", "org/typed", fleet_home
    )
    named = outside_tables(run, hostile.address, "bytes")
    if len(named) != 1:
        problems.append(f"{len(named)} lines name {hostile.address} and bytes: {named}")
    if hostile.requests.count("stage.fetch") != 1:
        problems.append(f"stage.fetch asked {hostile.requests.count('stage.fetch')} times")
    if run.returncode != 1 or not lines_naming(run, benign.address, "held"):
        problems.append(f"exit {run.returncode}, the origin not held: {run.text[-800:]!r}")
    check(run, problems)


@pytest.mark.slow
def test_a_fetch_the_agent_forgot_ends(
    fake: Callable[[str], HostileAgent], fleet_home: Path
) -> None:
    """A receiver whose stage.status holds no task after its stage.fetch.ok (restarted): each
    attempt fails naming it, the host fails after its attempts (before: polled for ever),
    the origin held, exit 1."""
    hostile, _, run, problems = stage_to_hostile(
        fake, "stage-forgets", "stage.status", "org/forgot", fleet_home
    )
    if not outside_tables(run, hostile.address, "is gone"):
        problems.append(f"no line says the fetch is gone: {run.text[-800:]!r}")
    if run.returncode != 1 or not table_rows(run, hostile.address, "failed"):
        problems.append(f"exit {run.returncode}, the host not failed: {run.text[-800:]!r}")
    check(run, problems)


def test_invalid_models_names_the_host_and_field(
    fake: Callable[[str], HostileAgent], fleet_home: Path
) -> None:
    """models.list.ok with an empty body (`reply-invalid`): the host's line (the caption)
    names the missing field, exit 1, the benign host's column kept."""
    hostile, benign = fake("reply-invalid"), fake("benign")
    hosts = f"{hostile.address},{benign.address}"
    run, problems = against(hostile, "models.list", "models", "--hosts", hosts, *LINKS,
                            home=fleet_home)  # fmt: skip
    said = " ".join(run.text.split())  # the table's caption wraps at the table's width
    if run.returncode != 1 or not re.search(rf"{hostile.address}: [^│]*'?store\b", said):
        problems.append(f"exit {run.returncode}, no line naming the field: {run.text[-800:]!r}")
    if not lines_naming(run, benign.address):
        problems.append("the benign host's column is gone")
    check(run, problems)


@pytest.mark.parametrize(
    ("field", "value"),
    [("revision", "0123456789ABCDEF0123456789abcdef01234567"), ("digest", PAYLOAD[:64])],
)
def test_a_task_names_its_model_in_hex_digits(field: str, value: str) -> None:
    """§19: a commit is 40 and a digest 64 lowercase hex digits; a coordinator shows their
    first digits, so a task with anything else there is refused, naming the field (before,
    any 40 or 64 characters passed, PAYLOAD's escapes among them)."""
    task = {
        "model": "org/name",
        "revision": STAGED_REVISION,
        "role": "receiver",
        "state": "fetching",
        "digest": STAGED_DIGEST,
        "bytes": 0,
        "total": STAGED_SIZE,
        "resumed": 0,
        "rate": None,
        "capped": False,
        "source": "10.0.0.2:5555",
        "served": 0,
        "files": 1,
        "files_done": 0,
        "error": None,
        "started": 1.0,
        "finished": None,
    }
    BODIES["stage.status.ok"]({"tasks": [task]})
    with pytest.raises(Invalid, match=rf"{field}.* is not \d+ lowercase hex digits"):
        BODIES["stage.status.ok"]({"tasks": [task | {field: value}]})


# --- 2. serving cells (§5) ----------------------------------------------------------------

SERVE = [*BENCH, "--concurrency", "1,2"]


@pytest.fixture(scope="module")
def served(fake: Callable[[str], HostileAgent], tmp_path_factory: pytest.TempPathFactory) -> Stored:
    """A serving run of the hostile fake beside the benign one: its records' `serving`
    strings (engine, model_impl, tokens_from, prompt_cache) carry PAYLOAD."""
    home = tmp_path_factory.mktemp("served")
    hostile = fake("strings")
    since = len(hostile.requests)
    hosts = f"{hostile.address},{fake('benign').address}"
    run = coordinator("benchmark", "--hosts", hosts, *BENCH_LINKS, *SERVE, home=home)
    listed = coordinator("runs", "-o", "json", home=home)
    run_id = json.loads(listed.stdout)[0]["id"] if listed.returncode == 0 else None
    return Stored(home, run, hostile.address, "", run_id, hostile.requests[since:])


@pytest.mark.slow
def test_strings_serving_benchmark(served: Stored) -> None:
    problems = hostile_output(served.run) + served.unasked("bench.start")
    if "serving" not in served.run.text:
        problems.append(f"no serving table: {served.run.text[-800:]!r}")
    check(served.run, problems)


@pytest.mark.parametrize(("fmt", "tty"), [*FORMATS, ("csv", False), ("md", False)])
@pytest.mark.slow
def test_strings_serving_show(served: Stored, fmt: str, tty: bool) -> None:
    shown = served.show(fmt, tty=tty)
    problems = hostile_output(shown) + formatted(shown, fmt)
    if fmt == "json" and not any(cell.get("serving") for cell in served.cells()):
        problems.append("no serving record stored")
    check(shown, problems)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.slow
def test_strings_serving_export(served: Stored, fmt: str) -> None:
    """The flat formats' serving columns (serve_engine: the agent's words)."""
    assert served.run_id, served.run.text[-2000:]
    run = coordinator("export", served.run_id, "--label", "x", "-o", fmt, home=served.home)
    problems = hostile_output(run)
    if fmt == "jsonl":
        problems += [p for line in run.stdout.splitlines() for p in not_strict_line(line)]
    if "serve_engine" not in run.text:
        problems.append(f"no serving column: {run.text[:400]!r}")
    check(run, problems)


def not_strict_line(line: bytes) -> list[str]:
    try:
        strict_json(line)
    except ValueError as exc:
        return [f"-o jsonl is not strict JSON: {exc}"]
    return []


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "pty"])
@pytest.mark.slow
def test_strings_serving_compare(served: Stored, tty: bool) -> None:
    assert served.run_id, served.run.text[-2000:]
    run = coordinator("compare", served.run_id, served.run_id, home=served.home, tty=tty)
    check(run, hostile_output(run))


# --- 3. canary: cells on both sides, every other string hostile ---------------------------


@pytest.mark.slow
def test_strings_canary_table(fake: Callable[[str], HostileAgent], tmp_path: Path) -> None:
    """The hostile host's cells named plainly (so pp16 ran on both sides of the split) while
    its macOS build, MLX version and every other string carry PAYLOAD: the table is drawn,
    its side values plain text."""
    with HostileAgent("strings", name="mac3", plain_cells=True) as hostile:
        stored = benchmark(tmp_path, hostile, fake("benign").address)
    assert stored.run_id, stored.run.text[-2000:]
    for split, fmt, tty in [
        ("macos", "table", True),
        ("macos", "json", False),
        ("mlx", "table", False),
    ]:
        args = ["canary", "--runs", stored.run_id, "--split", split, "-o", fmt]
        run = coordinator(*args, home=tmp_path, tty=tty)
        problems = hostile_output(run) + formatted(run, fmt)
        if "no cell ran on both sides" in run.text or "MARKUP" not in run.text:
            problems.append(f"no table naming the hostile side: {run.text[-800:]!r}")
        check(run, problems)


# --- 4. doctor --level 2 and 3 (§14 bandwidth) ---------------------------------------------


@pytest.mark.parametrize(
    ("level", "fmt", "tty"),
    [*(("2", *case) for case in FORMATS), ("3", "table", False), ("3", "table", True)],
)
@pytest.mark.slow
def test_strings_doctor_levels(
    fake: Callable[[str], HostileAgent], fleet_home: Path, level: str, fmt: str, tty: bool
) -> None:
    """The bandwidth probe's `error` and level 1's strings beside the decode cell's; level 3
    adds the sustained cell's and netbench's (the hostile rank's `error`)."""
    hostile, benign = fake("strings"), fake("benign")
    hosts = f"{hostile.address},{benign.address}"
    args = ["doctor", "--level", level, "--hosts", hosts, *LINKS, "-o", fmt]
    args += ["--duration", "30s"] if level == "3" else []
    expect = "rank.get" if level == "3" else "bench.start"
    run, problems = against(hostile, expect, *args, home=fleet_home, tty=tty)
    check(run, problems + formatted(run, fmt))


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "pty"])
@pytest.mark.slow
def test_strings_group_refused_for_its_mlx(
    fake: Callable[[str], HostileAgent], fleet_home: Path, tty: bool
) -> None:
    """A group of the hostile host and the benign one (§17): the members' MLX versions (the
    hostile one's PAYLOAD) differ, so the run is refused in one line quoting both as plain text
    before any job."""
    hostile, benign = fake("strings"), fake("benign")
    group = f"{hostile.address}+{benign.address}"
    since = len(hostile.requests)
    args = ["benchmark", "--hosts", group, *BENCH_LINKS, *BENCH]
    run, problems = against(hostile, "info", *args, home=fleet_home, tty=tty)
    problems = [p for p in problems if not p.startswith("exit code 2 ")]
    if run.returncode != 2 or not lines_naming(run, group, "different MLX", "MARKUP"):
        problems.append(f"exit {run.returncode}, not the refusal: {run.text[-800:]!r}")
    if "bench.start" in hostile.requests[since:]:
        problems.append("a job was started")
    check(run, problems)


@pytest.mark.slow
def test_strings_group_cell_and_its_straggler(tmp_path: Path) -> None:
    """Two hostile members (the same MLX version: the same PAYLOAD) whose cells are named
    plainly, so the group runs (§17): rank 1's probe makes it a compute straggler and its
    `injected` fault is PAYLOAD, quoted in the straggler line, the flags and the ranks'
    errors; through a pipe and a pty, and `show` of the run."""
    with (
        HostileAgent("strings", name="mac3", plain_cells=True) as first,
        HostileAgent("strings", name="mac4", plain_cells=True) as second,
    ):
        group = f"{first.address}+{second.address}"
        for tty in (False, True):
            args = ["benchmark", "--hosts", group, *BENCH_LINKS, *BENCH]
            run, problems = against(first, "bench.start", *args, home=tmp_path, tty=tty)
            if not lines_naming(run, "straggler rank 1", "injected"):
                problems.append(f"no straggler line: {run.text[-800:]!r}")
            check(run, problems)
    [stored] = json.loads(coordinator("runs", "-o", "json", home=tmp_path).stdout)[:1]
    for tty in (False, True):
        shown = coordinator("show", stored["id"], home=tmp_path, tty=tty)
        check(shown, hostile_output(shown))


# --- 5. coordinator calibrate (§18) ------------------------------------------------------


@pytest.mark.parametrize(("fmt", "tty"), FORMATS[1:], ids=FORMAT_IDS[1:])  # 2 s a poll
@pytest.mark.slow
def test_strings_calibrate(
    fake: Callable[[str], HostileAgent], fleet_home: Path, fmt: str, tty: bool
) -> None:
    """calibrate.start.ok's source; calibrate.get.ok's progress sensor, error, origin and policy
    origin: the host's calibration failed, named, exit 1."""
    hostile = fake("strings")
    args = ["calibrate", "--hosts", hostile.address, "--minutes", "1", *LINKS, "-o", fmt]
    run, problems = against(hostile, "calibrate.get", *args, home=fleet_home, tty=tty)
    if run.returncode != 1 or "no onset found" not in run.text:
        problems.append(f"exit {run.returncode}, the failure not named: {run.text[-800:]!r}")
    check(run, problems + formatted(run, fmt))
