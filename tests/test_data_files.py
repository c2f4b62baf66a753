"""An agent service and a coordinator may share one data directory (the operator's own Mac):
their SQLite files must never be the same file."""

from __future__ import annotations

from agent.cooling.events import default_events_path
from agent.daemon.benchmark.journal import default_journal_path
from agent.daemon.history import default_samples_path
from coordinator.runs.store import default_store_path
from coordinator.telemetry.store import default_telemetry_path


def test_every_store_has_its_own_file() -> None:
    agent_files = {default_events_path(), default_samples_path(), default_journal_path()}
    coordinator_files = {default_store_path(), default_telemetry_path()}
    assert len(agent_files) == 3 and len(coordinator_files) == 2
    assert not agent_files & coordinator_files
