"""The collector daemon against a real Kafka broker that is stopped and restarted mid-run.

To leave the shared broker (127.0.0.1:9092) alone, this test starts its OWN single-node KRaft
broker on two free ports from the same Kafka jars that scripts/services.sh downloads, in a
temporary directory, and stops only that process. Several simulated hosts run
``fleethealth collect --simulate --sink kafka:127.0.0.1:PORT``; after the broker comes back every
(host, seq) from 0 to the host's last sequence number must be in the topic exactly once after
de-duplication by (host, seq).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KAFKA_LIBS = Path(os.environ.get("FLEETHEALTH_KAFKA_LIBS")
                  or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fleethealth" / "kafka-4.1.1-libs")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PORT, CPORT = _free_port(), _free_port()  # never the shared broker's 9092/9093

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _unavailable(why: str) -> None:
    if os.environ.get("FLEETHEALTH_REQUIRE_SERVICES") == "1":
        pytest.fail(why)
    pytest.skip(why)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class PrivateBroker:
    def __init__(self, d: Path) -> None:
        self.d = d
        self.proc: subprocess.Popen | None = None
        props = (ROOT / "deploy" / "kafka" / "server.properties").read_text()
        props = props.replace("@DATA_DIR@", str(d)).replace(":9092", f":{PORT}").replace(":9093", f":{CPORT}")
        (d / "server.properties").write_text(props)
        self.java = ["java", "-Xms128m", "-Xmx384m", "-XX:TieredStopAtLevel=1",
                     f"-Dlog4j2.configurationFile={ROOT / 'deploy' / 'kafka' / 'log4j2.properties'}",
                     "-cp", f"{KAFKA_LIBS}/*"]
        subprocess.run([*self.java, "kafka.tools.StorageTool", "format", "--config", str(d / "server.properties"),
                        "--cluster-id", "fhcollectortest0000000", "--ignore-formatted"],
                       check=True, capture_output=True, timeout=120)

    def start(self, timeout: float = 120) -> None:
        log = open(self.d / "kafka.log", "ab")  # noqa: SIM115 - owned by the broker process
        self.proc = subprocess.Popen([*self.java, "kafka.Kafka", str(self.d / "server.properties")],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + timeout
        while not _port_open(PORT):
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"private broker did not start; see {self.d / 'kafka.log'}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


@pytest.fixture
def private_broker(tmp_path):
    if not (KAFKA_LIBS / ".complete").exists() and not any(KAFKA_LIBS.glob("kafka_*.jar")):
        _unavailable(f"Kafka jars not found in {KAFKA_LIBS}; run scripts/services.sh up once to fetch them")
    if shutil.which("java") is None:
        _unavailable("java is not installed")
    if _port_open(PORT) or _port_open(CPORT):
        _unavailable(f"ports {PORT}/{CPORT} are busy")
    (tmp_path / "kafka").mkdir(exist_ok=True)
    b = PrivateBroker(tmp_path / "kafka")
    try:
        b.start()
        yield b
    finally:
        b.stop()


def _consume_all(topic: str, expect: int, timeout: float = 60) -> list[tuple[str, int]]:
    """Read the whole topic by partition assignment (no consumer group needed)."""
    from kafka import KafkaConsumer, TopicPartition

    from fleethealth.schema import decode_sample

    c = KafkaConsumer(bootstrap_servers=[f"127.0.0.1:{PORT}"], enable_auto_commit=False, group_id=None)
    got: list[tuple[str, int]] = []
    end = time.monotonic() + timeout
    try:
        parts = None
        while not parts and time.monotonic() < end:
            parts = c.partitions_for_topic(topic)
            time.sleep(0.2)
        tps = [TopicPartition(topic, p) for p in sorted(parts or [])]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        while time.monotonic() < end and len(set(got)) < expect:
            for _tp, msgs in c.poll(timeout_ms=1000).items():
                for m in msgs:
                    s = decode_sample(m.value)
                    assert m.key.decode() == s.host
                    got.append((s.host, s.seq))
    finally:
        c.close()
    return got


def test_broker_restart_loses_nothing(private_broker, tmp_path):
    from fleethealth.kafka_bus import ensure_topics

    topic = f"test.telemetry.{uuid.uuid4().hex[:8]}"
    ensure_topics(f"127.0.0.1:{PORT}", [topic], partitions=4)
    hosts = [f"sim-{i:02d}" for i in range(3)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = {}
    for i, h in enumerate(hosts):
        procs[h] = subprocess.Popen(
            [sys.executable, "-m", "fleetcli.cli", "--log-format", "json", "collect", "--simulate",
             "--host", h, "--sim-gpus", "2", "--sim-seed", str(i), "--interval", "0.2",
             "--sink", f"kafka:127.0.0.1:{PORT}", "--topic", topic, "--exporter-port", "0",
             "--state-dir", str(tmp_path / h)],
            env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{h}.log", "wb"))  # noqa: SIM115
    def seqs() -> list[int]:
        out = []
        for h in hosts:
            try:
                out.append(json.loads((tmp_path / h / "collector-state.json").read_text())["seq"])
            except (OSError, ValueError):
                out.append(-1)
        return out

    def wait_for(cond, what: str, timeout: float = 90) -> None:
        end = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < end, f"timed out waiting for {what}"
            assert all(p.poll() is None for p in procs.values()), "a collector exited early"
            time.sleep(0.2)

    try:
        wait_for(lambda: min(seqs()) >= 8, "first samples")
        private_broker.stop()  # outage: samples must go to the spool
        at_stop = seqs()
        wait_for(lambda: all(n >= s + 15 for n, s in zip(seqs(), at_stop, strict=True)), "samples during outage")
        private_broker.start()
        at_start = seqs()
        wait_for(lambda: all(n >= s + 10 for n, s in zip(seqs(), at_start, strict=True)), "samples after restart")
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(90) for p in procs.values()]
    assert codes == [0, 0, 0], [(tmp_path / f"{h}.log").read_text()[-2000:] for h in hosts]
    for h in hosts:  # the broker is up at SIGTERM: each daemon drains its spool before it exits
        assert "samples left in the spool" not in (tmp_path / f"{h}.log").read_text(), h
    last = {h: json.loads((tmp_path / h / "collector-state.json").read_text())["seq"] for h in hosts}
    expected = {(h, s) for h in hosts for s in range(last[h] + 1)}
    got = _consume_all(topic, len(expected))
    assert set(got) == expected  # every (host, seq), nothing missing, nothing foreign
    assert len(got) >= len(expected)  # duplicates (a retried batch) are allowed; de-dup by (host, seq)
    for h in hosts:  # per host, first occurrences arrive in order (same key -> same partition)
        seqs = [s for hh, s in got if hh == h]
        firsts = sorted(set(seqs), key=seqs.index)
        assert firsts == sorted(firsts)
