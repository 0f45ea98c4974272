"""`fleethealth fleet-metrics`: the fleet dashboards' series from the bus, as `run` serves them.

Unit tests fold an in-process bus; the integration test runs the command against the real shared
Kafka broker (unique topics and groups) and scrapes its HTTP endpoint.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetcli.fleet_service import FleetMetricsService, Topics, sample_head
from fleethealth import metrics_names as m
from fleethealth.bus import ACTIONS, INCIDENTS, TELEMETRY, InProcessBus
from fleethealth.schema import ContractError, encode, encode_packed
from tests.pipeline.test_fleet_metrics import action, incident
from tests.spine.sample_factory import sample

REPO = Path(__file__).resolve().parents[2]
T0 = 1_764_000_000.0


def _values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _scrape(svc: FleetMetricsService) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reg = CollectorRegistry(auto_describe=False)
    for c in svc.collectors():
        reg.register(c)
    return _values(generate_latest(reg).decode())


def test_sample_head_reads_json_and_msgpack_and_refuses_garbage() -> None:
    s = sample(host="gpu-node-007", ts=T0 + 5)
    for raw in (encode(s), encode_packed(s)):
        head = sample_head(raw)
        assert (head.host, head.rack, head.ts) == ("gpu-node-007", "r01", T0 + 5)
    for bad in (b"", b"{\"host\": \"a\"", b"\x93\x01\x02\x03", b"{\"host\": \"\", \"ts\": 1}", b"[1,2]"):
        with pytest.raises(ContractError):
            sample_head(bad)


def test_service_folds_in_process_bus_into_host_states() -> None:
    bus = InProcessBus()
    svc = FleetMetricsService(bus, clock=lambda: T0 + 100)
    for i, h in enumerate(["a", "b", "c", "d"]):
        bus.publish(TELEMETRY, h, encode(sample(host=h, ts=T0 + 90 + i)))
    bus.publish(TELEMETRY, "x", b"not a sample")
    bus.publish(INCIDENTS, "b", encode(incident("b")))
    bus.publish(INCIDENTS, "c", encode(incident("c")))
    bus.publish(ACTIONS, "c", encode(action("c", "drain", "dry_run", "c-gpu_dram_uce")))
    bus.publish(INCIDENTS, "d", encode(incident("d")))
    bus.publish(INCIDENTS, "d", b"{\"truncated\": ")
    bus.publish(ACTIONS, "d", encode(action("d", "drain", "done", "d-gpu_dram_uce")))
    bus.publish(ACTIONS, "d", encode(action("d", "ticket_opened", "done", "d-gpu_dram_uce")))
    assert svc.step(timeout=0) == 4 + 7  # the bad incident is counted as folded-and-skipped, not lost silently
    v = _scrape(svc)
    assert v[(m.HOSTS, (("state", "healthy"),))] == 1
    assert v[(m.HOSTS, (("state", "suspect"),))] == 1
    assert v[(m.HOSTS, (("state", "drained"),))] == 1
    assert v[(m.HOSTS, (("state", "in_repair"),))] == 1
    assert v[(m.LAST_SAMPLE_AGE, (("host", "a"), ("rack", "r01")))] == 0.0  # received "now" by the fake clock
    assert v[(m.LAST_SAMPLE_TS, (("host", "d"), ("rack", "r01")))] == T0 + 93
    assert v[("fleethealth_fleet_metrics_skipped_total", (("topic", TELEMETRY),))] == 1
    assert v[("fleethealth_fleet_metrics_skipped_total", (("topic", INCIDENTS),))] == 1
    assert (m.MESSAGES, (("topic", TELEMETRY),)) not in v  # no offsets source: no throughput series
    bus.publish(INCIDENTS, "b", encode(incident("b", state="resolved")))
    svc.step(timeout=0)
    assert _scrape(svc)[(m.HOSTS, (("state", "healthy"),))] == 2


# --------------------------------------------------------------------------- real Kafka


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


@pytest.mark.kafka
def test_fleet_metrics_command_on_real_kafka(kafka_bootstrap: str) -> None:
    from kafka import KafkaConsumer

    from fleethealth.kafka_bus import KafkaBus, ensure_topics

    u = uuid.uuid4().hex[:10]
    topics = Topics(f"t-{u}.telemetry", f"t-{u}.incidents", f"t-{u}.actions", f"t-{u}.deadletter")
    ensure_topics(kafka_bootstrap, topics.all(), partitions=2)
    detect_group = f"detect-{u}"
    bus = KafkaBus(kafka_bootstrap, client_id=f"test-{u}")
    try:
        for seq in range(1, 4):  # 3 hosts x 3 samples
            for h in ("gpu-node-001", "gpu-node-002", "gpu-node-003"):
                bus.publish(topics.telemetry, h, encode_packed(sample(host=h, seq=seq, ts=T0 + 10 * seq)))
        bus.publish(topics.incidents, "gpu-node-002", encode(incident("gpu-node-002", iid="i2")))
        bus.publish(topics.incidents, "gpu-node-003", encode(incident("gpu-node-003", mode="pcie_link_degraded",
                                                                      iid="i3")))
        bus.publish(topics.actions, "gpu-node-003", encode(action("gpu-node-003", "drain", "done", "i3")))
        bus.publish(topics.actions, "gpu-node-003", encode(action("gpu-node-003", "ticket_opened", "done", "i3")))
        bus.publish(topics.deadletter, None, b"{\"reason\": \"test\"}")
        bus.flush(10)

        # a "detect" group that has consumed and committed the 9 samples; 2 more arrive after
        c = KafkaConsumer(topics.telemetry, bootstrap_servers=kafka_bootstrap, group_id=detect_group,
                          enable_auto_commit=False, auto_offset_reset="earliest")
        got, deadline = 0, time.monotonic() + 20
        while got < 9 and time.monotonic() < deadline:
            got += sum(len(v) for v in c.poll(timeout_ms=500).values())
        assert got == 9
        c.commit()
        c.close()
        for h in ("gpu-node-001", "gpu-node-004"):
            bus.publish(topics.telemetry, h, encode(sample(host=h, seq=9, ts=T0 + 40)))
        bus.flush(10)

        port = _free_port()
        env = {**os.environ, "FLEETHEALTH_FLEET_METRICS_EXIT_AFTER": "60"}
        cmd = [str(Path(sys.executable).parent / "fleethealth"), "fleet-metrics", "--bus", f"kafka:{kafka_bootstrap}",
               "--metrics-port", str(port), "--group", f"fm-{u}", "--detect-group", detect_group,
               "--remediate-group", f"rem-{u}", "--telemetry-topic", topics.telemetry,
               "--incidents-topic", topics.incidents, "--actions-topic", topics.actions,
               "--deadletter-topic", topics.deadletter, "--offsets-every", "0.5", "--telemetry-from", "earliest"]
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            want = {
                (m.HOSTS, (("state", "healthy"),)): 2,
                (m.HOSTS, (("state", "suspect"),)): 1,
                (m.HOSTS, (("state", "in_repair"),)): 1,
                (m.HOSTS, (("state", "drained"),)): 0,
                (m.INCIDENTS_OPEN, (("failure_mode", "pcie_link_degraded"), ("host", "gpu-node-003"),
                                    ("rack", "r01"), ("severity", "critical"))): 1,
                (m.INCIDENT_MESSAGES, (("failure_mode", "gpu_dram_uce"), ("state", "open"))): 1,
                (m.MESSAGES, (("topic", topics.telemetry),)): 11,
                (m.MESSAGES, (("topic", topics.actions),)): 2,
                (m.SAMPLES, ()): 11,
                (m.DEAD_LETTERS, ()): 1,
                (m.CONSUMER_LAG, (("group", detect_group), ("topic", topics.telemetry))): 2,
                (m.LAST_SAMPLE_TS, (("host", "gpu-node-001"), ("rack", "r01"))): T0 + 40,
                (m.LAST_SAMPLE_TS, (("host", "gpu-node-002"), ("rack", "r01"))): T0 + 30,
                (m.STALE_HOSTS, ()): 0,
            }
            deadline, v = time.monotonic() + 40, {}
            while time.monotonic() < deadline and proc.poll() is None:
                text = _get(f"http://127.0.0.1:{port}/metrics")
                v = _values(text) if text else {}
                if all(v.get(k) == n for k, n in want.items()) and \
                        v.get((m.CONSUMER_LAG, (("group", f"fm-{u}"), ("topic", topics.telemetry)))) == 0:
                    break
                time.sleep(0.5)
            assert {k: v.get(k) for k in want} == want, {k: v.get(k) for k in want if v.get(k) != want[k]}
            assert not any(k[0] == "fleethealth_fleet_metrics_skipped_total" for k in v)
            # its own group commits what it read: no lag once caught up; the remediate group never ran
            assert v[(m.CONSUMER_LAG, (("group", f"fm-{u}"), ("topic", topics.telemetry)))] == 0
            assert not any(k[0] == m.CONSUMER_LAG and ("group", f"rem-{u}") in k[1] for k in v)
            assert {k[1] for k in v if k[0] == m.LAST_SAMPLE_AGE} == {
                (("host", f"gpu-node-00{i}"), ("rack", "r01")) for i in range(1, 5)}
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
    finally:
        bus.close()
