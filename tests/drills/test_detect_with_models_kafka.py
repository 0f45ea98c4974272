"""Drill: ``fleethealth detect --with-models`` through the real broker.

A fault-dense simulated half hour (24 hosts, 10 s polls, every mode) is produced to a topic of its
own; one worker with the shipped ML models consumes it to the end (``--exit-when-idle``). The
models score windows in batches and their findings arrive at the end of each poll batch, after the
rules': asserted that the worker exits cleanly, nothing is dead-lettered, every episode an
in-process rules-and-models run of the same recording opens is opened through Kafka too, the
models' evidence reaches the published incidents, and no model-only incident asks for a drain.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from detectors.engine.engine import DetectorEngine
from detectors.ml import MODEL_DIR
from detectors.registry import model_detectors
from fleethealth.bus import iter_jsonl
from fleethealth.kafka_bus import ensure_topics
from fleethealth.schema import decode_sample
from tests.drills import harness as h

pytestmark = [pytest.mark.drill, pytest.mark.kafka, pytest.mark.slow]
MODEL_FACTS = ("classifier p(", "peer-comparison anomaly")


def _from_models(inc) -> bool:  # type: ignore[no-untyped-def]
    return inc.detector.startswith("model:") or any(e.fact.startswith(MODEL_FACTS) for e in inc.evidence)


def _keys(incidents: list) -> set[tuple[str, str, str]]:  # type: ignore[type-arg]
    rack_only = {i.id for i in incidents if i.component == "host" and i.detector.startswith("model:peer")}
    return {(i.host, i.component, i.failure_mode) for i in incidents if i.id not in rack_only}


@pytest.mark.skipif(not (MODEL_DIR / "fault_classifier.json").exists(), reason="no shipped models")
def test_detect_with_models_through_kafka_matches_the_in_process_run(tmp_path: Path, kafka_bootstrap: str) -> None:
    from kafka import KafkaProducer

    tag = uuid.uuid4().hex[:10]
    telemetry, incidents, dead = f"drill.{tag}.telemetry", f"drill.{tag}.incidents", f"drill.{tag}.deadletter"
    rec = h.recording(tmp_path, hosts=24, duration_s=1800.0, interval_s=10.0, seed=13, fault_rate=2000.0,
                      min_per_mode=1)
    eng = DetectorEngine(extra_detectors=model_detectors())
    ref = []
    for i, (_, raw) in enumerate(iter_jsonl(rec), 1):
        ref.extend(eng.feed(decode_sample(raw)))
        if i % 500 == 0:
            ref.extend(eng.flush())
    ref.extend(eng.flush())
    assert any(_from_models(i) for i in ref), "the models should add evidence on this fault-dense fleet"

    ensure_topics(kafka_bootstrap, [telemetry, incidents, dead])
    p = KafkaProducer(bootstrap_servers=[kafka_bootstrap], acks="all", linger_ms=20, batch_size=256 << 10)
    n = 0
    for _, raw in iter_jsonl(rec):
        p.send(telemetry, key=decode_sample(raw).host.encode(), value=raw)
        n += 1
    p.flush()
    p.close()

    w = h.detect("detect-models", tmp_path, kafka_bootstrap, f"drill-{tag}", "--with-models", "--exit-when-idle",
                 "--topic", telemetry, "--incidents-topic", incidents, "--deadletter-topic", dead)
    try:
        w.popen.wait(240)
    finally:
        w.kill()
    assert w.popen.returncode == 0, w.text()[-3000:]
    got = h.read_incidents(kafka_bootstrap, incidents)
    assert h.read_topic(kafka_bootstrap, dead, idle_s=1.0) == []
    assert h.committed(kafka_bootstrap, f"drill-{tag}", telemetry) == n  # every record fed and committed
    # same episodes whatever the batching; a rack row compares a host with its rack as the batch
    # leaves it (docs/detectors.md), so a peer-only episode on a whole host may come or go
    assert _keys(got) == _keys(ref)
    assert any(_from_models(i) for i in got)
    drains = ("drain", "reset_gpu", "reboot_request")
    model_only = {i.id for i in got if i.detector.startswith("model:")}
    assert not any(set(i.recommended_action) & set(drains) and i.confidence < 0.97
                   for i in got if i.id in model_only)  # a model alone drains only at p >= 0.97
