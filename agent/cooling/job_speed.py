"""`agent run`'s view of its job's own speed, poll by poll: the work rate from mlx_lm's reports
(read from CMD's stdout: agent.cooling.accounting) or from a custom loop's step-gate work
reports (agent.cooling.work_report), judged by the throttle rule (shared.cooling.throttle).

What it gives each poll goes into the state file `agent run` writes (its `work` map, which the
agent reads for its samples: docs/protocol.md §12), and a change of verdict becomes an event
(`throttling`, `throttle_end`). A rate measured across a pause is no rate of work: a poll that
finds the job paused, or follows one that did, drops what came in.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.cooling.gang_stragglers import GangStragglers
from agent.cooling.work_report import WorkFile
from shared.cooling.throttle import ThrottlePoll, ThrottleVerdict, ThrottleWatch

_FILE_SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
THROTTLING = "throttling"
THROTTLE_END = "throttle_end"
UNIT = "tok/s"


class JobSpeed:
    """One job's: poll() once per sample; `work` is the state file's map after it."""

    def __init__(self, state_file: Path, reported: Callable[[], float | None]) -> None:
        self.file = WorkFile(state_file)
        self.reported = reported
        """The tok/s of mlx_lm's latest train report since the last call, None without one."""
        self.watch = ThrottleWatch.start()
        self.verdict = ThrottleVerdict(None)
        self.rate: float | None = None
        self.rate_at: float | None = None
        self._ran_before = False
        self.stragglers = GangStragglers(state_file)
        """A cooperative gang's ranks compared, said on stderr (agent.cooling.gang_stragglers)."""

    @property
    def work(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "unit": UNIT,
            "time": self.rate_at,
            "throttling": self.verdict.throttling,
            "evidence": self.verdict.text,
        }

    def poll(self, running: bool) -> tuple[str, str] | None:
        """Take this poll's rate (`running`: the job ran unpaused all along); returns the
        event (action, detail) when the verdict changed."""
        self.stragglers.poll()
        reported, from_file = self.reported(), self.file.rate()
        if not (running and self._ran_before):
            self._ran_before = running
            self.file.forget()
            return None
        rate = from_file if from_file is not None else reported
        if rate is not None:
            self.rate, self.rate_at = rate, time.time()
        self.watch, verdict = self.watch.observe(ThrottlePoll(rate=rate, rate_unit=UNIT))
        was = self.verdict.throttling
        self.verdict = verdict
        if verdict.throttling and not was:
            return THROTTLING, verdict.text or ""
        if verdict.throttling is False and was:
            return THROTTLE_END, f"no longer throttling: {verdict.text}"
        return None

    def close(self) -> None:
        self.file.remove()
        self.stragglers.remove()


def state_file(jobs_dir: Path, job: str) -> Path | None:
    """Where `agent run` keeps job `job`'s state (agent.cooling.supervise's state_file); None
    for an id that would name another file."""
    return jobs_dir / f"{job}.cooling.json" if _FILE_SAFE.fullmatch(job) else None


def stated_work(jobs_dir: Path, job: str) -> object:
    """The `work` map job `job`'s `agent run` last wrote (unchecked: see
    shared.cooling.throttle.job_work); None when there is none to read."""
    path = state_file(jobs_dir, job)
    if path is None:
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state.get("work") if isinstance(state, dict) else None
