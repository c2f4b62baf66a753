"""netbench's stored per-link figures as a group's straggler verdict reads them
(coordinator.runs.netbench.stored_link_seconds): from a real run store, the newest netbench run
that measured each of the group's links, at the probe's 4 KiB, in either direction's name."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from coordinator.runs.netbench import stored_link_seconds
from coordinator.runs.store import RunStore
from shared.clock import utc_now
from shared.distributed.netbench import Measured, stored_measurement
from shared.distributed.stragglers import LINK_BYTES


def netbench_run(store: RunStore, hosts: list[str], links: dict[str, float], age_h: int) -> None:
    started = utc_now() - timedelta(hours=age_h)
    run_id = store.create_run({"sizes": [LINK_BYTES]}, hosts, "netbench", started=started)
    for index, (where, seconds) in enumerate(links.items()):
        measured = Measured("send_recv", LINK_BYTES, len(hosts), (seconds, seconds), where)
        store.add_cell(run_id, hosts[0], stored_measurement(measured), index)
    store.finish_run(run_id, "ok")


def test_the_newest_run_measuring_each_link_gives_its_figure(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.sqlite") as store:
        netbench_run(store, ["a", "b", "c"], {"a↔b": 0.004, "b↔c": 0.003, "c↔a": 0.002}, 48)
        netbench_run(store, ["b", "a"], {"b↔a": 0.0001}, 1)
        netbench_run(store, ["a", "d"], {"a↔d": 0.5}, 0)  # d is no member
        links = stored_link_seconds(store, ["a", "b", "c"])
    assert links == {"b↔a": 0.0001, "b↔c": 0.003, "c↔a": 0.002}
