"""The detect worker on the in-process bus and on the real Kafka broker: incidents out, dead
letters with reasons (the worker's decode loop is the one that dead-letters telemetry), offsets
committed only after the batch's incidents are flushed."""

from __future__ import annotations

import time
import uuid

import msgspec
import pytest

from detectors.engine.engine import DetectorEngine
from detectors.worker.metrics import DetectMetrics
from detectors.worker.worker import DetectWorker
from fleethealth.bus import DEADLETTER, DEFAULT_PARTITIONS, INCIDENTS, TELEMETRY, InProcessBus, partition_for
from fleethealth.schema import decode_incident, encode
from simulator.fixtures import HostSeries

replace = msgspec.structs.replace


def _uce_stream(host="w-1", n=6):
    hs = HostSeries(host)
    out = []
    for k in range(n):
        def fn(s, k=k):
            if k >= 3:
                s.gpus[0] = replace(s.gpus[0], ecc=replace(s.gpus[0].ecc, dram_uncorrected_volatile=1))
        out.append(hs.advance(fn))
    return out


def test_worker_publishes_incidents_and_dead_letters_and_carries_on():
    bus = InProcessBus()
    samples = _uce_stream()
    for s in samples[:3]:
        bus.publish(TELEMETRY, s.host, encode(s))
    bus.publish(TELEMETRY, "w-1", b'{"host": "w-1", "ts": "yesterday"}')
    bus.publish(TELEMETRY, "w-1", b"\xff\xfe not json")
    bus.publish(TELEMETRY, "w-1", b'{"v":9,"host":"w-1"}')
    bus.publish(TELEMETRY, "other", encode(samples[3]))  # key does not match the host
    for s in samples[3:]:
        bus.publish(TELEMETRY, s.host, encode(s))
    metrics = DetectMetrics()
    w = DetectWorker(bus, DetectorEngine(), metrics=metrics, idle_tick=False)
    w.run(max_idle_polls=1)
    incs = [decode_incident(r.value) for r in bus.records(INCIDENTS)]
    assert [(i.failure_mode, i.state) for i in incs] == [("gpu_dram_uce", "open")]
    assert all(r.key == "w-1" for r in bus.records(INCIDENTS))
    dead = [msgspec.json.decode(r.value) for r in bus.records(DEADLETTER)]
    assert len(dead) == 4 and w.stats.dead_letters == 4
    # each names its record (topic, partition, offset: w-1's follow its 3 good samples) and the group
    assert all(d["source_topic"] == TELEMETRY and d["consumer"] == w.group and d["payload_size"] > 0 for d in dead)
    at = {d["offset"]: d["reason"] for d in dead if d["partition"] == partition_for("w-1", DEFAULT_PARTITIONS)}
    assert sorted(at) == [3, 4, 5]
    assert "$.ts" in at[3] and "not valid JSON" in at[4] and "unsupported schema version 9" in at[5]
    assert [d["reason"] for d in dead if d["key"] == "other"] == ["message key 'other' does not match host 'w-1'"]
    text = __import__("prometheus_client").generate_latest(metrics.registry).decode()
    assert 'fleethealth_detect_dead_letters_total{reason="telemetry sample"} 3.0' in text
    assert 'fleethealth_detect_incidents_total{failure_mode="gpu_dram_uce",state="open"} 1.0' in text
    assert 'fleethealth_detect_last_sample_age_seconds{host="w-1"}' in text


class _FlushFails(InProcessBus):
    def flush(self, timeout=None):
        raise RuntimeError("broker went away")


def test_offsets_are_not_committed_when_incidents_are_not_flushed():
    bus = _FlushFails()
    for s in _uce_stream():
        bus.publish(TELEMETRY, s.host, encode(s))
    w = DetectWorker(bus, DetectorEngine(), group="g1", idle_tick=False)
    with pytest.raises(RuntimeError):
        w.run_once()
    # a second member of the group starts over: nothing was committed
    again = bus.consumer([TELEMETRY], "g1").poll(timeout=0)
    assert len(again) == 6


def test_two_workers_of_a_group_split_hosts_and_each_detects_its_own():
    bus = InProcessBus(partitions=4)
    hosts = [f"split-{i}" for i in range(8)]
    for k in range(6):
        for h in hosts:
            s = _uce_stream(h)[k]
            bus.publish(TELEMETRY, h, encode(s))
    w = DetectWorker(bus, DetectorEngine(), group="g2", idle_tick=False)
    w.run(max_idle_polls=1)
    assert {decode_incident(r.value).host for r in bus.records(INCIDENTS)} == set(hosts)


def _read(bus, topic, group, n, timeout_s=30.0):
    """At least ``n`` records of ``topic`` (what arrived within ``timeout_s``)."""
    c = bus.consumer([topic], group)
    got = []
    deadline = time.time() + timeout_s
    while len(got) < n and time.time() < deadline:
        got += c.poll(timeout=1.0)
    c.close()
    return got


@pytest.mark.kafka
@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_worker_on_real_kafka(kafka_bootstrap, client):
    from fleethealth.config import kafka_bus
    from fleethealth.kafka_bus import ensure_topics

    tag = uuid.uuid4().hex[:8]
    topics = {"t": f"{tag}.telemetry", "i": f"{tag}.incidents", "d": f"{tag}.deadletter"}
    ensure_topics(kafka_bootstrap, list(topics.values()), partitions=2)
    bus = kafka_bus(kafka_bootstrap, client)
    try:
        for s in _uce_stream(f"k-{tag}"):
            bus.publish(topics["t"], s.host, encode(s))
        host = f"k-{tag}"
        for bad in (b"{broken", b'{"v":7,"host":"%s"}' % host.encode(),
                    b'{"v":1,"host":"%s","ts":1,"seq":"x","collector_version":"a"}' % host.encode()):
            bus.publish(topics["t"], host, bad)
        bus.flush()
        w = DetectWorker(bus, DetectorEngine(), group=f"g-{tag}", topic=topics["t"], incidents_topic=topics["i"],
                         deadletter_topic=topics["d"], idle_tick=False, poll_timeout=1.0)
        deadline = time.time() + 60
        while (w.stats.samples < 6 or w.stats.dead_letters < 3) and time.time() < deadline:
            w.run_once()
        w.close()
        assert w.stats.samples == 6 and w.stats.dead_letters == 3
        letters = [msgspec.json.decode(r.value) for r in _read(bus, topics["d"], f"d-{tag}", 3)]
        reasons = sorted(d["reason"] for d in letters)
        assert any("not valid JSON" in r for r in reasons)
        assert any("unsupported schema version 7" in r for r in reasons)
        assert any("$.seq" in r for r in reasons)
        assert all(d["source_topic"] == topics["t"] and d["offset"] is not None and d["key"] == host for d in letters)
        got = _read(bus, topics["i"], f"r-{tag}", 1)
        inc = decode_incident(got[0].value)
        assert (inc.failure_mode, inc.state, got[0].key) == ("gpu_dram_uce", "open", f"k-{tag}")
        # the group committed: a new member of the same group finds nothing left to read
        c2 = bus.consumer([topics["t"]], f"g-{tag}")
        left = c2.poll(timeout=3.0)
        c2.close()
        assert left == []
    finally:
        bus.close()
