"""Starting a job process (agent.daemon.benchmark.process) for a plan's cells: what it is told
of the agent (its thermal source and poll, its power meter, the group it is one rank of) and
where its output goes. Its own module because a job starts a process more than once (a new one
runs the cells left after a crash, agent.daemon.benchmark.jobs), each the same way."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agent.daemon.benchmark.plan import JobPlan
from agent.daemon.benchmark.process import JobProcess
from agent.daemon.storage import JOB_LOGS, StorageHealth
from agent.power.meter import EnergyMeter
from agent.sensors.base import SourceInfo
from shared.io.paths import data_dir, data_subdir


class JobLauncher:
    """launch() a job process; `source` and `meter` are the daemon's (each asked at each
    launch), `storage` hears of a job log the disk refuses."""

    def __init__(
        self,
        source: Callable[[], SourceInfo],
        meter: Callable[[], EnergyMeter | None],
        poll_interval: float,
        storage: StorageHealth,
    ) -> None:
        self.source = source
        self.meter = meter
        self.poll_interval = poll_interval
        self.storage = storage

    def launch(self, plan: JobPlan, first: int) -> JobProcess:
        """A job process for the cells of `plan` from index `first`. Raises OSError."""
        source = self.source()
        thermal = {
            "source": source.name,
            "simulated": source.simulated,
            "poll_interval": self.poll_interval,
        }
        meter = self.meter()
        power = {
            "source": meter.source.spec if meter is not None and meter.present else "none",
            "baseline_s": meter.baseline_s if meter is not None else 0.0,
            "why": meter.last_error if meter is not None else "the agent has no power source",
        }
        request = {
            "matrix": plan.spec.to_dict(),
            "thermal": thermal,
            "power": power,
            "sustain": plan.sustain.to_dict() if plan.sustain else None,
            "first": first,
            "group": plan.group.to_wire() if plan.group else None,
            "check_tokens": plan.check_tokens,
        }
        return JobProcess.spawn(request, self._log_path(plan.id))

    def _log_path(self, job_id: str) -> Path | None:
        """Where the job's output goes; None (nowhere) when the disk refuses the folder."""
        try:
            folder = data_subdir("job-logs")
            path = folder / f"{job_id}.log"
            path.touch(mode=0o600)
        except OSError as exc:
            self.storage.failed(JOB_LOGS, data_dir(create=False) / "job-logs", exc)
            return None
        self.storage.written(JOB_LOGS)
        return path
