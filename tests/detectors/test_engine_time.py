"""Time in the detectors: quiet periods run on each host's own sample time, staleness on a clock a
lagging Kafka partition cannot trip, and an idle worker ages hosts by stream time (last sample ts +
elapsed monotonic time), never by the wall clock."""

from __future__ import annotations

import time
import uuid

import msgspec
import pytest

from detectors.engine.engine import DetectorEngine
from detectors.worker.worker import DetectWorker, staleness_clock
from fleethealth.bus import INCIDENTS, TELEMETRY, InProcessBus
from fleethealth.schema import decode_incident, encode
from simulator.fixtures import HostSeries

replace = msgspec.structs.replace


@pytest.fixture(scope="module")
def rules():
    from detectors.engine.ruleset import RuleSet

    return RuleSet.load()


def lost(s):
    s.gpus[3] = replace(s.gpus[3], present=False, nvml_error="GPU_IS_LOST")


def uce(s):
    s.gpus[0] = replace(s.gpus[0], ecc=replace(s.gpus[0].ecc, dram_uncorrected_volatile=1))


def test_a_host_running_ahead_does_not_resolve_a_lagging_hosts_episode(rules):
    engine = DetectorEngine(rules)
    a, b = HostSeries("a"), HostSeries("b")
    out = [*engine.feed(a.advance()), *engine.feed(b.advance())]
    for _ in range(3):
        out += engine.feed(b.advance(lost))
    for _ in range(180):  # a's partition runs 30 min of sample time ahead (quiet_s of this rule: 300 s)
        out += engine.feed(a.advance())
    for _ in range(3):  # b's partition catches up: the GPU is still gone
        out += engine.feed(b.advance(lost))
    eps = [(i.host, i.failure_mode, i.state) for i in out if i.state != "updated"]
    assert eps == [("b", "gpu_fell_off_bus", "open")], eps
    assert len({i.id for i in out}) == 1


def test_an_episode_resolves_after_quiet_s_of_the_hosts_own_clean_samples(rules):
    engine = DetectorEngine(rules)
    a, b = HostSeries("a"), HostSeries("b")
    out = engine.feed(b.advance()) + engine.feed(b.advance(lost))
    opened_at = b.ts
    out += engine.feed(a.advance())
    for _ in range(200):  # a 33 min ahead: b has not reported clean samples, so nothing resolves
        out += engine.feed(a.advance())
    assert [i.state for i in out if i.state != "updated"] == ["open"]
    resolved = []
    while not resolved:  # b now reports clean samples
        resolved = [i for i in engine.feed(b.advance()) if i.state == "resolved"]
    assert resolved[0].host == "b" and b.ts - opened_at >= 300  # the rule's quiet_s, on b's clock
    assert b.ts - opened_at < 300 + 2 * b.interval


def test_unreachable_episode_id_does_not_depend_on_tick_cadence(rules):
    ids = set()
    for tick_every in (10.0, 60.0, 600.0):
        engine = DetectorEngine(rules, tick_every_s=tick_every)
        a, b = HostSeries("a"), HostSeries("b")
        out = []
        for _ in range(3):
            out += engine.feed(a.advance()) + engine.feed(b.advance())
        last_b = b.ts
        for _ in range(400):
            out += engine.feed(a.advance())
        un = [i for i in out if i.failure_mode == "host_unreachable"]
        assert [(i.host, i.state) for i in un] == [("b", "open")]
        assert un[0].first_seen == last_b + 2700  # max(10 polls, 45 min) after b's last sample
        ids.add(un[0].id)
    assert len(ids) == 1


def test_staleness_clock_waits_for_partitions_with_records_pending():
    hw = {("t", 0): 5000.0, ("t", 1): 1000.0, ("t", 2): 200.0}
    assert staleness_clock(5000.0, hw, {}) == 5000.0  # no lag known: the stream's own time
    assert staleness_clock(5000.0, hw, {("t", 0): 0, ("t", 1): 12, ("t", 2): 0}) == 1000.0
    assert staleness_clock(900.0, hw, {("t", 0): 3}) == 900.0  # never later than stream time
    assert staleness_clock(5000.0, {("t", 0): 5000.0}, {("t", 9): 4}) == 5000.0  # nothing fed from it yet


class Mono:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _worker(bus: InProcessBus, mono: Mono) -> DetectWorker:
    return DetectWorker(bus, DetectorEngine(), group="g", idle_tick=True, poll_timeout=0.0, monotonic=mono)


def test_idle_worker_ages_an_old_recording_by_stream_time_not_the_wall_clock():
    bus, mono = InProcessBus(), Mono()
    hs = HostSeries("old-1")  # sample times in 2023: the wall clock is years ahead
    for k in range(6):
        bus.publish(TELEMETRY, hs.base.host, encode(hs.advance(uce if k >= 3 else None)))
    w = _worker(bus, mono)
    assert w.run_once() == 6
    last_ts = hs.ts
    for _ in range(5):  # idle polls a few seconds apart: a replay pausing, not a silent fleet
        mono.t += 2.0
        assert w.run_once() == 0
    incs = [decode_incident(r.value) for r in bus.records(INCIDENTS)]
    assert [(i.failure_mode, i.state) for i in incs] == [("gpu_dram_uce", "open")]
    # the stream keeps going after the pause, samples keep arriving: still nothing new
    bus.publish(TELEMETRY, hs.base.host, encode(hs.advance(uce)))
    mono.t += 1.0
    assert w.run_once() == 1
    assert len(bus.records(INCIDENTS)) == 1
    assert w.stream_now() == hs.ts
    mono.t += 60.0
    assert w.stream_now() == hs.ts + 60.0
    assert last_ts < hs.ts


def test_live_fleet_gone_silent_becomes_unreachable_on_stream_time():
    bus, mono = InProcessBus(), Mono()
    hs = HostSeries("silent-1")
    for _ in range(3):
        bus.publish(TELEMETRY, hs.base.host, encode(hs.advance()))
    w = _worker(bus, mono)
    w.run_once()
    mono.t += 2600.0  # 43 min of silence: below the 45 min limit
    w.run_once()
    assert bus.records(INCIDENTS) == []
    mono.t += 200.0
    w.run_once()
    incs = [decode_incident(r.value) for r in bus.records(INCIDENTS)]
    assert [(i.host, i.failure_mode, i.state) for i in incs] == [("silent-1", "host_unreachable", "open")]
    assert incs[0].first_seen == hs.ts + 2700
    bus.publish(TELEMETRY, hs.base.host, encode(hs.advance()))  # a late one (a spool resend): still silent now
    w.run_once()
    incs = [decode_incident(r.value) for r in bus.records(INCIDENTS)]
    assert [(i.failure_mode, i.state) for i in incs][-1] == ("host_unreachable", "open")
    hs.seq += 280  # it comes back, stamped at the stream's now
    bus.publish(TELEMETRY, hs.base.host, encode(hs.advance()))
    w.run_once()
    incs = [decode_incident(r.value) for r in bus.records(INCIDENTS)]
    assert [(i.failure_mode, i.state) for i in incs][-1] == ("host_unreachable", "resolved")


def test_replay_worker_without_idle_tick_never_ages_on_its_own():
    bus, mono = InProcessBus(), Mono()
    hs = HostSeries("file-1")
    for _ in range(3):
        bus.publish(TELEMETRY, hs.base.host, encode(hs.advance()))
    w = DetectWorker(bus, DetectorEngine(), group="g", idle_tick=False, poll_timeout=0.0, monotonic=mono)
    w.run_once()
    mono.t += 10_000.0
    w.run_once()
    assert bus.records(INCIDENTS) == [] and w.stream_now() == hs.ts


@pytest.mark.kafka
def test_uneven_partitions_on_real_kafka_raise_no_false_unreachable(kafka_bootstrap):
    """Two hosts on two partitions, 5 h of samples each already on the topic: the consumer hands
    out one partition's fetched chunk before the other's, so one host's sample time runs far ahead
    of the other's. The lagging host is behind, not silent: no host_unreachable, nothing resolved."""
    from kafka import KafkaProducer

    from fleethealth.kafka_bus import KafkaBus, ensure_topics

    tag = uuid.uuid4().hex[:8]
    topics = {"t": f"{tag}.telemetry", "i": f"{tag}.incidents", "d": f"{tag}.deadletter"}
    ensure_topics(kafka_bootstrap, list(topics.values()), partitions=2)
    a, b = HostSeries(f"ka-{tag}", interval=60.0), HostSeries(f"kb-{tag}", interval=60.0)
    prod = KafkaProducer(bootstrap_servers=[kafka_bootstrap], linger_ms=20, batch_size=256 << 10)
    n = 300
    for p, hs in ((0, a), (1, b)):
        for _ in range(n):
            prod.send(topics["t"], key=hs.base.host.encode(), value=encode(hs.advance()), partition=p)
    prod.flush()
    prod.close()
    bus = KafkaBus(kafka_bootstrap)
    w = DetectWorker(bus, DetectorEngine(), group=f"g-{tag}", topic=topics["t"], incidents_topic=topics["i"],
                     deadletter_topic=topics["d"], idle_tick=True, poll_timeout=1.0, max_records=50)
    skew = 0.0
    try:
        deadline = time.monotonic() + 60
        while w.stats.samples < 2 * n and time.monotonic() < deadline:
            w.run_once()
            hosts = w.engine.hosts
            if len(hosts) == 2:
                skew = max(skew, abs(hosts[a.base.host].last_ts - hosts[b.base.host].last_ts))
        assert w.stats.samples == 2 * n
        assert w.stats.incidents == 0, w.engine.stats
    finally:
        w.close()
        bus.close()
    print(f"largest sample-time skew between the two partitions' hosts: {skew:.0f} s")
