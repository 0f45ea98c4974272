"""The bus on the real Kafka broker started by scripts/services.sh (issue 2)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fleethealth.config import kafka_bus
from fleethealth.kafka_bus import KafkaBus, ensure_topics
from fleethealth.schema import decode_sample, encode
from tests.spine.sample_factory import sample

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["kafka-python", "confluent"])
def client(request):
    """Both Kafka clients behind the one Bus protocol, on the real broker."""
    return request.param


def _topic(kafka_bootstrap: str, name: str) -> str:
    topic = f"test.{uuid.uuid4().hex[:10]}.{name}"
    ensure_topics(kafka_bootstrap, [topic], partitions=8)
    return topic


def _consume_all(bus: KafkaBus, topic: str, group: str, expect: int, deadline_s: float = 90.0,
                 until=None) -> list:
    c = bus.consumer([topic], group)
    out: list = []
    end = time.monotonic() + deadline_s
    try:
        while len(out) < expect and time.monotonic() < end and not (until and until(out)):
            batch = c.poll(timeout=1.0, max_records=1000)
            out.extend(batch)
            if batch:
                c.commit()
    finally:
        c.close()
    return out


def test_10k_samples_from_100_hosts_round_trip_in_per_host_order(kafka_bootstrap, client):
    topic = _topic(kafka_bootstrap, "telemetry")
    bus = kafka_bus(kafka_bootstrap, client)
    template = {h: sample(host=f"gpu-node-{h:03d}", gpus=2) for h in range(100)}
    import msgspec

    for seq in range(100):
        for s in template.values():
            bus.publish(topic, s.host, encode(msgspec.structs.replace(s, seq=seq, ts=s.ts + seq)))
    bus.flush(60)
    recs = _consume_all(bus, topic, f"g-{uuid.uuid4().hex[:6]}", 10_000)
    bus.close()
    assert len(recs) == 10_000
    per_host: dict[str, list[int]] = {}
    partitions: dict[str, set[int]] = {}
    for r in recs:
        s = decode_sample(r.value)
        assert r.key == s.host
        per_host.setdefault(s.host, []).append(s.seq)
        partitions.setdefault(s.host, set()).add(r.partition)
    assert len(per_host) == 100
    assert all(seqs == list(range(100)) for seqs in per_host.values())
    assert all(len(p) == 1 for p in partitions.values())  # one host -> one partition
    assert len({p for ps in partitions.values() for p in ps}) == 8


def test_killed_consumer_is_resumed_by_the_group_without_loss(kafka_bootstrap, tmp_path):
    """On the default client (≈ 10 s a run; kafka-python's commit and resume from the committed
    offset are in test_headers_acks_commit_resume...)."""
    from fleethealth.config import DEFAULT_KAFKA_CLIENT as client

    topic = _topic(kafka_bootstrap, "telemetry")
    group = f"g-{uuid.uuid4().hex[:6]}"
    bus = kafka_bus(kafka_bootstrap, client)
    n_hosts, per_host = 20, 150
    for seq in range(per_host):
        for h in range(n_hosts):
            bus.publish(topic, f"h{h:02d}", encode(sample(host=f"h{h:02d}", seq=seq, gpus=1)))
    bus.flush(60)
    out = tmp_path / "seen.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-m", "tests.integration.kafka_child_consumer", kafka_bootstrap,
                              topic, group, str(out), client], cwd=REPO, env=env)
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and (not out.exists() or len(out.read_text().splitlines()) < 500):
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    first = out.read_text().splitlines()
    assert 0 < len(first) < n_hosts * per_host, "the child must die mid-stream"
    total = n_hosts * per_host
    seen = {tuple(line.split()) for line in first}

    def complete(recs: list) -> bool:  # stop as soon as nothing is missing (duplicates may not come)
        return len(seen | {(s.host, str(s.seq)) for s in map(decode_sample, (r.value for r in recs))}) == total

    rest = _consume_all(bus, topic, group, total - len(first) + 1, deadline_s=60, until=complete)
    bus.close()
    seen |= {(s.host, str(s.seq)) for s in (decode_sample(r.value) for r in rest)}
    assert len(seen) == total, f"lost {total - len(seen)} messages"
    # at-least-once: only the batch in flight at the kill may be seen twice
    dupes = len(first) + len(rest) - total
    assert 0 <= dupes <= 50 * n_hosts


def _join(c, max_records: int, deadline_s: float = 30.0) -> list:
    """Poll until the group assigned partitions; the records that came with the assignment."""
    got: list = []
    end = time.monotonic() + deadline_s
    while not c.assigned() and time.monotonic() < end:
        got += c.poll(timeout=0.5, max_records=max_records)
    assert c.assigned(), "no partition assigned"
    return got


def test_headers_acks_commit_resume_rebalance_events_highwater_and_history(kafka_bootstrap, client):
    """What the detect worker relies on from either Kafka client (fleethealth.bus.RebalancingConsumer)."""
    from fleethealth.bus import PublishAck, RebalancingConsumer
    from fleethealth.identity import HEADER

    topic = f"test.{uuid.uuid4().hex[:10]}.proto"
    ensure_topics(kafka_bootstrap, [topic], partitions=2)
    group = f"g-{uuid.uuid4().hex[:6]}"
    bus = kafka_bus(kafka_bootstrap, client)
    acks = [bus.publish(topic, f"h{i % 4}", f"v{i}".encode(), ((HEADER, b"sig-%d" % i),)) for i in range(40)]
    bus.flush(30)
    assert all(isinstance(a, PublishAck) and a.is_done and a.succeeded() for a in acks)

    c = bus.consumer([topic], group)
    assert isinstance(c, RebalancingConsumer)
    got = _join(c, 5)
    events = c.assignment_changes()
    assert ("assigned", frozenset({(topic, 0), (topic, 1)})) in events
    assert c.assignment_changes() == []  # drained
    end = time.monotonic() + 30
    while len(got) < 25 and time.monotonic() < end:
        got += c.poll(timeout=0.5, max_records=25 - len(got))
    assert len(got) == 25
    by_value = {r.value: r for r in got}
    r = by_value[b"v5"]
    assert r.key == "h1" and r.headers == ((HEADER, b"sig-5"),) and r.ts is not None and r.ts > 1e9
    c.commit()
    seen = {r.value for r in got}
    committed = c.committed([(topic, 0), (topic, 1)])
    per_tp = {tp: sum(1 for r in got if (r.topic, r.partition) == tp) for tp in committed}
    assert committed == {tp: (n or None) for tp, n in per_tp.items()}
    ends = {}
    for tp in committed:
        hw = c.highwater(tp)
        assert hw is not None and hw >= (committed[tp] or 0)
        ends[tp] = hw
    assert sum(ends.values()) == 40
    c.close()  # nothing after the commit is committed: a new member resumes there

    c2 = bus.consumer([topic], group)
    rest = _join(c2, 100)
    end = time.monotonic() + 30
    while len(rest) < 15 and time.monotonic() < end:
        rest += c2.poll(timeout=0.5, max_records=100)
    assert len(rest) == 15 and seen.isdisjoint(r.value for r in rest)
    # history: the records before the committed offsets (window by record time), in offset order
    hist = list(c2.history({tp: off for tp, off in committed.items() if off}, window_s=3600))
    assert sorted(r.value for r in hist) == sorted(seen)
    for tp in committed:
        offs = [r.offset for r in hist if (r.topic, r.partition) == tp]
        assert offs == sorted(offs) == list(range(len(offs)))
    assert all(r.headers for r in hist)
    # a second member joins: this one sees its partitions revoked, then its share assigned
    # (under load a join can take more than one rebalance, and a member's assignment still shows its
    # old partitions between a "revoked" and the next "assigned": wait for the group to settle)
    c3 = bus.consumer([topic], group)
    kinds: list[str] = []
    end = time.monotonic() + 60
    while time.monotonic() < end and not (c3.assigned() and len(c2.assigned()) == 1 and kinds[-1:] == ["assigned"]):
        c2.poll(timeout=0.2)
        c3.poll(timeout=0.2)
        kinds += [k for k, _ in c2.assignment_changes()]
    assert "revoked" in kinds and kinds[-1] == "assigned", kinds
    assert len(c2.assigned()) == 1 and len(c3.assigned()) == 1 and c2.assigned() != c3.assigned()
    for x in (c2, c3):
        x.close()
    bus.close()


def test_failures_only_delivery_reports_raise_at_flush_for_what_the_broker_refused(kafka_bootstrap, client):
    """``delivery_reports="failures"`` (what replay opens): publish returns no handle, and ``flush``
    raises for a message the broker refused (a topic whose max.message.bytes a record batch of 14 KB
    of random bytes exceeds), once."""
    from kafka.admin import KafkaAdminClient, NewTopic

    from fleethealth.bus import BusError
    from fleethealth.kafka_bus import delete_topics

    topic = f"test.{uuid.uuid4().hex[:10]}.small"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap.split(","), client_id="fleethealth-test")
    try:
        admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"max.message.bytes": "4096"})])
    finally:
        admin.close()
    bus = kafka_bus(kafka_bootstrap, client, delivery_reports="failures")
    try:
        assert bus.publish(topic, "h1", b"small") is None
        bus.flush(30)  # delivered: no error
        assert bus.publish(topic, "h1", os.urandom(14_000)) is None  # incompressible: the batch stays > 4 KiB
        with pytest.raises(BusError, match=r"1 message\(s\) not delivered"):
            bus.flush(30)
        bus.flush(30)  # the refused one is reported once (kafka-python's producer is spent after it)
    finally:
        bus.close()
        delete_topics(kafka_bootstrap, [topic])
    with pytest.raises(ValueError, match="delivery_reports"):
        kafka_bus(kafka_bootstrap, client, delivery_reports="some")


def test_ensure_topics_returns_once_every_partition_has_a_leader(kafka_bootstrap):
    """What a producer needs of a fresh topic (a just-started broker answered the bench's first sends
    with NotLeaderForPartition): ensure_topics waits for each partition's leader; the check names a
    topic the broker does not know and never creates it."""
    from kafka.admin import KafkaAdminClient

    from fleethealth.kafka_bus import _leaderless, delete_topics

    tag = uuid.uuid4().hex[:10]
    topics = [f"test.{tag}.lead{i}" for i in range(2)]
    missing = f"test.{tag}.never"
    ensure_topics(kafka_bootstrap, topics, partitions=4)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap.split(","), client_id="fleethealth-test")
    try:
        meta = admin.describe_topics(topics)
        assert sorted(len(t["partitions"]) for t in meta) == [4, 4]
        assert all(p["leader_id"] >= 0 for t in meta for p in t["partitions"])
        assert _leaderless(admin, [*topics, missing]) == [missing]
        assert missing not in admin.list_topics()
    finally:
        admin.close()
        delete_topics(kafka_bootstrap, topics)
