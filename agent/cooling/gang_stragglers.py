"""`agent run`'s side of a cooperative gang's straggler figures: the step gate writes every
rank's compute and wait over its last steps beside the state file (agent.cooling.step_gate);
each poll this reads a new window and, when the rank named changes, says so on stderr:

    [mlx-fleet] 12:00:01 straggler rank 1 (10.0.0.2): compute: rank 1 (10.0.0.2) computes ...

A rank of a gang learns of it while the job runs. Only the ranks' compute is judged: a training
step has no link probe (shared.distributed.stragglers).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from agent.cooling.events import PREFIX
from agent.cooling.step_gate import stragglers_path
from shared.distributed.stragglers import NONE, UNAVAILABLE, analyse, mark
from shared.safe_text import DETAIL_CAP, shown


class GangStragglers:
    def __init__(self, state_file: Path) -> None:
        self.path = stragglers_path(state_file)
        self.named: str | None = None
        """The flag last said (shared.distributed.stragglers.mark), None: nobody named."""
        self._read_at: float | None = None

    def poll(self) -> dict[str, Any] | None:
        """The newest window's verdict, said when whom it names changed; None without a new
        window (or a window that is not the gate's)."""
        window = self._read()
        if window is None:
            return None
        hosts, compute, wait, injected = window
        probes = [{"compute_s": c, "wait_s": w} for c, w in zip(compute, wait, strict=True)]
        kinds = [["step-delay"] if flag else [] for flag in injected]
        found = analyse(hosts, probes, injected=kinds)
        if found["verdict"] == UNAVAILABLE:
            return found
        named = mark({"stragglers": found})
        if named != self.named and (named is not None or found["verdict"] == NONE):
            said = f"{named}: {found['why']}" if named else f"no straggler now: {found['why']}"
            stamp = time.strftime("%H:%M:%S")
            print(f"{PREFIX} {stamp} {shown(said, DETAIL_CAP)}", file=sys.stderr, flush=True)
            self.named = named
        return found

    def _read(self) -> tuple[list[str], list[Any], list[Any], list[bool]] | None:
        try:
            body = json.loads(self.path.read_text(encoding="utf-8"))
            hosts, compute, wait = body["hosts"], body["compute_s"], body["wait_s"]
            injected, written = body["injected"], body["time"]
        except (OSError, ValueError, TypeError, KeyError):
            return None
        lists = (hosts, compute, wait, injected)
        if written == self._read_at or not all(isinstance(each, list) for each in lists):
            return None
        if len({len(each) for each in lists}) != 1 or not all(isinstance(h, str) for h in hosts):
            return None
        self._read_at = written
        return hosts, compute, wait, [flag is True for flag in injected]

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
