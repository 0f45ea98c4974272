"""The telemetry wire format on the real broker (issue 18): collectors publish msgpack by default,
JSON (``--kafka-wire json``, or a record spooled before the change) still reaches the same topic,
and the detect worker tells them apart by the bytes alone and finds the faults in both."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from collectors.spool import Spool
from detectors.engine.engine import DetectorEngine
from detectors.worker.worker import DetectWorker
from fleetcli.cli import main
from fleethealth.config import kafka_bus
from fleethealth.kafka_bus import delete_topics, ensure_topics
from fleethealth.schema import decode_incident, decode_sample, encode, is_packed
from tests.spine.sample_factory import sample

pytestmark = pytest.mark.kafka


def _collect(boot: str, topic: str, state: Path, host: str, mode: str, *extra: str) -> None:
    rc = main(["--log-level", "warning", "collect", "--simulate", "--once", "--exporter-port", "0", "--host", host,
               "--sink", f"kafka:{boot}", "--topic", topic, "--state-dir", str(state), "--inject", f"{mode}@2",
               *extra])
    assert rc == 0


def test_collectors_publish_msgpack_by_default_json_still_counts_and_detect_finds_both(kafka_bootstrap: str,
                                                                                        tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:10]
    topic, incidents, dead = f"test.{tag}.telemetry", f"test.{tag}.incidents", f"test.{tag}.deadletter"
    ensure_topics(kafka_bootstrap, [topic, incidents, dead], partitions=2)
    try:
        # a record spooled by a collector before msgpack became the default: JSON, still in the spool
        old = sample(host="old-1", ts=time.time() - 30, gpus=2)
        spool = Spool(tmp_path / "a" / "spool")
        spool.append(old.host, encode(old))
        spool.close()
        _collect(kafka_bootstrap, topic, tmp_path / "a", "wire-mp", "gpu_fell_off_bus")  # the default
        _collect(kafka_bootstrap, topic, tmp_path / "b", "wire-js", "gpu_hw_error", "--kafka-wire", "json")

        bus = kafka_bus(kafka_bootstrap)
        w = DetectWorker(bus, DetectorEngine(), group=f"test-{tag}", topic=topic, incidents_topic=incidents,
                         deadletter_topic=dead, idle_tick=False, poll_timeout=1.0)
        end = time.monotonic() + 60
        while w.stats.samples < 3 and time.monotonic() < end:
            w.run_once()
        got = {(decode_incident(r.value).host, decode_incident(r.value).failure_mode)
               for r in _read(bus, incidents, w.stats.incidents)}
        w.close()
        seen = {r.key: r.value for r in _read(bus, topic, 3)}  # the bytes as they are on the topic
        bus.close()
        assert w.stats.samples == 3 and w.stats.dead_letters == 0, w.stats
        assert is_packed(seen["wire-mp"]) and not is_packed(seen["wire-js"]) and not is_packed(seen["old-1"])
        assert decode_sample(seen["old-1"]) == old  # the spooled JSON went out as it was written
        assert ("wire-mp", "gpu_fell_off_bus") in got and ("wire-js", "gpu_hw_error") in got, got
    finally:
        delete_topics(kafka_bootstrap, [topic, incidents, dead])


def _read(bus, topic: str, n: int) -> list:
    c = bus.consumer([topic], f"read-{uuid.uuid4().hex[:8]}")
    out: list = []
    end = time.monotonic() + 30
    while len(out) < n and time.monotonic() < end:
        out += c.poll(timeout=1.0, max_records=100)
    c.close()
    return out
