"""Kill the real `fleethealth remediate` process after it drained a real Slurm node but before it
recorded the drain and committed the offset; restart it; exactly one drain and one ticket."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleethealth.bus import INCIDENTS, JsonlBus
from fleethealth.schema import encode
from tests.remediation.helpers import incident
from tests.remediation.slurm_util import restore, show, wait_for_room

NODE = "gpu-node-007"


def remediate(tmp: Path, bus: Path, crash: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHEALTH_")}
    if crash:
        env["FLEETHEALTH_TEST_CRASH_AFTER"] = crash
    return subprocess.run(
        [sys.executable, "-m", "fleetcli.cli", "--log-format", "json", "remediate", "--bus", f"jsonl:{bus}",
         "--scheduler", "slurm", "--state-db", str(tmp / "state.sqlite"), "--metrics-port", "0",
         "--exit-when-idle", "0.5"], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def node(slurm_conf: str) -> Iterator[str]:
    restore(NODE)
    wait_for_room()
    yield NODE
    restore(NODE)


@pytest.mark.slurm
@pytest.mark.parametrize("crash", ["drain", "record"])
def test_killed_worker_never_drains_twice_or_opens_second_ticket(tmp_path: Path, node: str, crash: str) -> None:
    bus_path = tmp_path / "bus.jsonl"
    inc = incident(node, "gpu_fell_off_bus")
    bus = JsonlBus(bus_path)
    bus.publish(INCIDENTS, inc.host, encode(inc))
    bus.close()

    first = remediate(tmp_path, bus_path, crash)
    assert first.returncode == 137, first.stderr[-2000:]
    assert show(node).drained_for(inc.id), "the drain happened before the crash"

    for _ in range(2):  # restart, then replay once more for good measure
        again = remediate(tmp_path, bus_path, None)
        assert again.returncode == 0, again.stderr[-2000:]

    db = sqlite3.connect(tmp_path / "state.sqlite")
    drains = db.execute("SELECT outcome, reason FROM audit WHERE kind='drain'").fetchall()
    assert [o for o, _ in drains] == ["done"]
    if crash == "drain":
        assert "recorded, not repeated" in drains[0][1]
    assert db.execute("SELECT COUNT(*) FROM tickets").fetchone()[0] == 1
    assert db.execute("SELECT COUNT(*) FROM audit WHERE kind='ticket_opened'").fetchone()[0] == 1
    slurmctld_log = Path(os.environ["SLURM_CONF"]).parent / "slurmctld.log"
    if slurmctld_log.exists():  # the controller saw one drain request for this incident, not two
        assert slurmctld_log.read_text(errors="replace").count(f"fleethealth:{inc.id}") <= 1
