"""Drill: the remediation worker is killed between draining a real Slurm node and committing.

The incident comes over the real Kafka broker (its own topic and consumer group); the first
``fleethealth remediate`` drains the node in the real slurmctld and dies (``os._exit(137)`` at the
test hook right after the drain call, before the decision is recorded and the offset committed).
Kafka redelivers the incident to the restarted worker, which must recognise its own drain: one
drain in Slurm and in the audit, one ticket. A third start (offset now committed) and a duplicate
of the incident on the topic (at-least-once upstream) change nothing.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleethealth.kafka_bus import KafkaBus, ensure_topics
from fleethealth.schema import encode
from tests.drills import harness as h
from tests.remediation.helpers import incident
from tests.remediation.slurm_util import restore, show, wait_for_room

pytestmark = [pytest.mark.drill, pytest.mark.kafka, pytest.mark.slurm, pytest.mark.slow]
NODE = "gpu-node-006"  # tests/remediation/test_crash.py uses 007


@pytest.fixture
def node(slurm_conf: str) -> Iterator[str]:
    restore(NODE)
    wait_for_room()
    yield NODE
    restore(NODE)


def _remediate(tmp: Path, bootstrap: str, topic: str, group: str, crash: str | None) -> subprocess.CompletedProcess[str]:
    env = h.clean_env(**({"FLEETHEALTH_TEST_CRASH_AFTER": crash} if crash else {}))
    return subprocess.run(
        h.cli("remediate", "--bus", f"kafka:{bootstrap}", "--topic", topic, "--group", group, "--scheduler", "slurm",
              "--state-db", str(tmp / "state.sqlite"), "--metrics-port", "0", "--exit-when-idle", "5",
              "--session-timeout-ms", "6000"),
        env=env, capture_output=True, text=True, timeout=90, cwd=h.REPO)


def test_killed_after_drain_on_kafka_drains_once_and_tickets_once(tmp_path: Path, kafka_bootstrap: str,
                                                                   node: str) -> None:
    topic = f"drill.incidents.{uuid.uuid4().hex[:10]}"
    group = f"drill-remediate-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [topic], 2)
    inc = incident(node, "gpu_fell_off_bus")
    bus = KafkaBus(kafka_bootstrap)
    bus.publish(topic, inc.host, encode(inc))
    bus.flush()

    first = _remediate(tmp_path, kafka_bootstrap, topic, group, "drain")
    assert first.returncode == 137, first.stderr[-3000:]
    assert show(node).drained_for(inc.id), "the drain reached slurmctld before the crash"
    assert h.group_lag(kafka_bootstrap, group, topic) in (None, 1), "the crashed worker must not have committed"
    # the dead member holds its partition until its session times out (--session-timeout-ms 6000,
    # the broker's minimum); a restart before that would wait in JoinGroup for it
    h.wait_until(lambda: h.describe_group(kafka_bootstrap, group)[0] == "Empty", 60, 0.5,
                 "the killed worker's session to expire")

    again = _remediate(tmp_path, kafka_bootstrap, topic, group, None)  # Kafka redelivers the incident
    assert again.returncode == 0, again.stderr[-3000:]
    assert h.group_lag(kafka_bootstrap, group, topic) == 0

    bus.publish(topic, inc.host, encode(inc))  # the same incident once more (at-least-once upstream)
    bus.flush()
    bus.close()
    third = _remediate(tmp_path, kafka_bootstrap, topic, group, None)
    assert third.returncode == 0, third.stderr[-3000:]

    db = sqlite3.connect(tmp_path / "state.sqlite")
    drains = db.execute("SELECT outcome, reason FROM audit WHERE kind='drain' AND incident_id=?", (inc.id,)).fetchall()
    assert [o for o, _ in drains] == ["done"], drains
    assert "recorded, not repeated" in drains[0][1]
    assert db.execute("SELECT COUNT(*) FROM tickets").fetchone()[0] == 1
    assert db.execute("SELECT COUNT(*) FROM audit WHERE kind='ticket_opened'").fetchone()[0] == 1
    st = show(node)
    assert st.drained and st.drained_for(inc.id)
    log = Path(os.environ["SLURM_CONF"]).parent / "slurmctld.log"
    if log.exists():  # slurmctld received one drain request naming this incident
        assert log.read_text(errors="replace").count(f"fleethealth:{inc.id}") <= 1
