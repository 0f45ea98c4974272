"""A partition changes owner (real Kafka broker): the new owner rebuilds the hosts' state from the
stream before the committed offset, silently, so an episode still active keeps its id — no double
incident, nothing re-emitted, nothing missed."""

from __future__ import annotations

import time
import uuid

import msgspec
import pytest

from detectors.engine.engine import DetectorEngine
from detectors.worker.worker import DetectWorker
from fleethealth.schema import Sample, decode_incident, encode
from simulator.fixtures import HostSeries

replace = msgspec.structs.replace
pytestmark = pytest.mark.kafka


def _fleet(tag: str, hosts: int = 6, polls: int = 30) -> list[Sample]:
    """Every host's GPU k % 8 has a DRAM UCE count rising from poll 3 on: an ongoing fault (open,
    then updated every minute of sample time while it lasts)."""
    fleet = [HostSeries(f"rb-{tag}-{i}") for i in range(hosts)]
    out = []
    for k in range(polls):
        for i, hs in enumerate(fleet):
            def fn(s: Sample, k: int = k, i: int = i) -> None:
                if k >= 3:
                    g = s.gpus[i % 8]
                    s.gpus[i % 8] = replace(g, ecc=replace(g.ecc, dram_uncorrected_volatile=k))
            out.append(hs.advance(fn))
    return out


def _worker(bus, topics, group):  # noqa: ANN001, ANN202
    return DetectWorker(bus, DetectorEngine(), group=group, topic=topics["t"], incidents_topic=topics["i"],
                        deadletter_topic=topics["d"], idle_tick=False, poll_timeout=0.5, max_records=20)


def test_new_owner_keeps_episode_ids_of_ongoing_faults(kafka_bootstrap):
    from fleethealth.kafka_bus import KafkaBus, ensure_topics

    tag = uuid.uuid4().hex[:8]
    topics = {"t": f"{tag}.telemetry", "i": f"{tag}.incidents", "d": f"{tag}.deadletter"}
    ensure_topics(kafka_bootstrap, list(topics.values()), partitions=2)
    samples = _fleet(tag)
    ref_engine = DetectorEngine()
    ref = [inc for s in samples for inc in ref_engine.feed(s)]
    ref_events = {(i.id, i.update_seq, i.state) for i in ref}
    assert {i.state for i in ref} == {"open", "updated"} and len({i.id for i in ref}) == 6

    bus = KafkaBus(kafka_bootstrap)
    try:
        for s in samples:
            bus.publish(topics["t"], s.host, encode(s))
        bus.flush()
        group = f"g-{tag}"
        a = _worker(bus, topics, group)
        deadline = time.time() + 60
        while a.stats.samples < len(samples) // 2 and time.time() < deadline:
            a.run_once()
        assert a.stats.samples >= len(samples) // 2
        in_flight = a.consumer.poll(timeout=2.0, max_records=20)  # polled, never committed: A dies here
        a.close()

        b = _worker(bus, topics, group)
        deadline = time.time() + 60
        while a.stats.samples + b.stats.samples < len(samples) and time.time() < deadline:
            b.run_once()
        b.close()
        assert a.stats.samples + b.stats.samples == len(samples), "B starts at A's committed offsets"
        assert b.stats.rebuilds >= 1 and b.stats.rebuilt_samples >= a.stats.samples - len(in_flight)

        reader = bus.consumer([topics["i"]], f"r-{tag}")
        got = []
        deadline = time.time() + 30
        while len(got) < len(ref) and time.time() < deadline:
            got.extend(decode_incident(r.value) for r in reader.poll(timeout=1.0, max_records=1000))
        reader.close()
    finally:
        bus.close()
    events = [(i.id, i.update_seq, i.state) for i in got]
    # every event of the uninterrupted run, each exactly once: B neither re-opened A's episodes under
    # new ids nor re-emitted what A had already published while it rebuilt
    assert sorted(events) == sorted(ref_events)
    a_ids = {i.id for i in got if i.state == "open"}
    assert len(a_ids) == 6
    assert {i.id for i in got[len(got) // 2:]} <= a_ids
