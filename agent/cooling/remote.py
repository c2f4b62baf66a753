"""RemoteMonitor: ThermalMonitor's API over the local agent daemon's samples, with the daemon's
policy in `policy` (CoolingScheduler uses it), for cooperative training loops on this machine:
one sensor reader serves every job (docs/protocol.md §12). A local monitor when no daemon runs,
or once it is gone."""

from __future__ import annotations

import logging

from agent.cooling.feed import open_fallback
from agent.cooling.session import DaemonLost, connect_daemon
from agent.thermal import ThermalMonitor, ThermalSource
from agent.thermal.fed import FedSource
from shared.cooling.policy import ThermalPolicy

log = logging.getLogger("agent.remote")


class RemoteMonitor(ThermalMonitor):
    """The local daemon's monitor with ThermalMonitor's API and semantics: `reading`,
    `temperature`, `get_history()` and `is_rising()` follow the daemon's samples (its poll
    interval, its source's name); `read()` / `get_soc_temperature()` give its latest reading;
    `policy` is the policy the daemon enforces (updated when a coordinator pushes one), which
    CoolingScheduler uses when given no policy of its own.

    With no daemon running, it is a plain ThermalMonitor over `source` (a name or a
    ThermalSource; "auto" by default) and `policy` is None. If the daemon goes away while
    polling, it opens `source` then and goes on locally, keeping the daemon's last policy.
    """

    def __init__(
        self,
        poll_interval: float = 1.0,
        history_size: int = 60,
        source: ThermalSource | str | None = None,
    ) -> None:
        self._fallback = source
        self._session = connect_daemon()
        self.policy: ThermalPolicy | None = None
        if self._session is None:
            super().__init__(poll_interval, history_size, source)
            return
        fed = FedSource(self._session.source)
        fed.feed(self._session.first)
        super().__init__(self._session.poll_interval, history_size, fed)
        self.policy = self._session.policy

    def start(self) -> None:
        """With a daemon: take its latest reading now, then follow its samples on a thread."""
        if self._session is None or self.running:
            super().start()
            return
        self._poll()
        self._start_thread()

    @property
    def remote(self) -> bool:
        """Whether readings come from the daemon now."""
        return self._session is not None

    def close(self) -> None:
        super().close()
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def _run(self) -> None:
        session = self._session
        if session is None:
            super()._run()
            return
        try:
            while (sample := session.next_sample(self._stop)) is not None:
                assert isinstance(self.source, FedSource)
                self.source.feed(sample.reading)
                self.policy = sample.policy
                self._poll()
            return
        except DaemonLost as exc:
            log.warning("%s: reading the sensor here", exc)
        self._session = None
        session.close()
        with self._source_lock:
            self.source = open_fallback(self._fallback, self.poll_interval)
            self._owns_source = not isinstance(self._fallback, ThermalSource)
        super()._run()
