"""The detect worker never moves past a batch whose incidents and dead letters the bus has not
acknowledged: it retries publish + flush with capped backoff, keeps the order, loses nothing,
duplicates nothing, and commits only afterwards.

``OutageBus`` behaves like ``KafkaBus`` over kafka-python during a broker outage: ``publish`` raises
``BusError`` while metadata cannot be fetched (``max_block_ms`` elapsed), or accepts the message
into a producer buffer and returns a future; ``flush`` returns without raising and a batch that
could not be delivered fails its futures (delivery timeout) and is gone from the buffer.
"""

from __future__ import annotations

import msgspec
import prometheus_client

from detectors.engine.engine import DetectorEngine
from detectors.worker.metrics import DetectMetrics
from detectors.worker.worker import DetectWorker
from fleethealth.bus import DEADLETTER, INCIDENTS, TELEMETRY, BusError, InProcessBus
from fleethealth.schema import encode
from simulator.fixtures import HostSeries

replace = msgspec.structs.replace


class Future:
    def __init__(self) -> None:
        self.is_done = False
        self._ok = False

    def succeeded(self) -> bool:
        return self.is_done and self._ok


class OutageBus(InProcessBus):
    """Telemetry and consumers as InProcessBus; output topics through a Kafka-like producer buffer."""

    def __init__(self, send_failures: int = 0, delivery_failures: int = 0) -> None:
        super().__init__(partitions=4)
        self.send_failures = send_failures  # publish calls that raise (metadata unavailable)
        self.delivery_failures = delivery_failures  # flushes whose buffered batches expire
        self.buffer: list[tuple[str, str | None, bytes, Future]] = []
        self.sends = self.flushes = 0

    def publish(self, topic, key, value):  # noqa: ANN001, ANN201
        if topic == TELEMETRY:
            return super().publish(topic, key, value)
        self.sends += 1
        if self.send_failures > 0:
            self.send_failures -= 1
            raise BusError(f"Kafka send to {topic} failed: KafkaTimeoutError: Failed to update metadata after 10.0 secs.")
        fut = Future()
        self.buffer.append((topic, key, value, fut))
        return fut

    def flush(self, timeout=None):  # noqa: ANN001, ANN201
        self.flushes += 1
        batch, self.buffer = self.buffer, []
        failing = bool(batch) and self.delivery_failures > 0
        if failing:
            self.delivery_failures -= 1
        for topic, key, value, fut in batch:
            if not failing:
                super().publish(topic, key, value)
            fut.is_done, fut._ok = True, not failing


def _stream() -> list[tuple[str, bytes]]:
    """Six hosts, each with a DRAM UCE and then a host-level fault, plus undecodable messages."""
    out = []
    fleet = [HostSeries(f"dl-{i}") for i in range(6)]
    for k in range(14):
        for i, hs in enumerate(fleet):
            def fn(s, k=k, i=i):
                if k >= 2 + i:  # a UCE that keeps rising: open, then updates
                    g = s.gpus[i]
                    s.gpus[i] = replace(g, ecc=replace(g.ecc, dram_uncorrected_volatile=k))
            s = hs.advance(fn)
            out.append((s.host, encode(s)))
        if k in (3, 9):
            out.append((f"dl-{k % 3}", b'{"host": "dl-0", "ts": "soon"}'))
    return out


def _run(bus: InProcessBus, **kw) -> DetectWorker:  # noqa: ANN003
    for host, raw in _stream():
        bus.publish(TELEMETRY, host, raw)
    w = DetectWorker(bus, DetectorEngine(), group="g", idle_tick=False, max_records=5, clock=lambda: 1000.0, **kw)
    w.run(max_idle_polls=1)
    return w


def test_outage_during_publish_loses_nothing_keeps_order_and_holds_offsets():
    ref_bus = InProcessBus(partitions=4)
    ref = _run(ref_bus)
    ref_inc = [r.value for r in ref_bus.records(INCIDENTS)]
    ref_dead = [r.value for r in ref_bus.records(DEADLETTER)]
    assert len(ref_inc) >= 6 and len(ref_dead) == 2

    bus = OutageBus(send_failures=3, delivery_failures=4)
    sleeps: list[tuple[float, int]] = []
    metrics = DetectMetrics()
    w = _run(bus, sleep=lambda s: sleeps.append((s, bus.lag("g", TELEMETRY))), retry_s=0.5, max_retry_s=2.0,
             metrics=metrics)

    # every incident and dead letter, each once, in the order the uninterrupted run publishes them
    assert [r.value for r in bus.records(INCIDENTS)] == ref_inc
    assert [r.value for r in bus.records(DEADLETTER)] == ref_dead
    assert (w.stats.incidents, w.stats.dead_letters, w.stats.samples) == (ref.stats.incidents, 2, ref.stats.samples)
    # the outage was waited out with capped exponential backoff, one batch at a time: the group's
    # committed offset did not move while the batch's output was unacknowledged
    assert [s for s, _ in sleeps] == [0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    assert len({lag for _, lag in sleeps}) == 1 and sleeps[0][1] > 0
    assert w.stats.publish_retries == 7 and w.pending == []
    assert bus.lag("g", TELEMETRY) == 0
    text = prometheus_client.generate_latest(metrics.registry).decode()
    assert "fleethealth_detect_publish_retries_total 7.0" in text


def test_stop_during_outage_leaves_the_batch_uncommitted_for_the_next_owner():
    bus = OutageBus(send_failures=10**6)
    for host, raw in _stream():
        bus.publish(TELEMETRY, host, raw)
    w = DetectWorker(bus, DetectorEngine(), group="g", idle_tick=False, max_records=1000, clock=lambda: 1000.0)
    w.sleep = lambda s: w.stop()  # SIGTERM arrives while the broker is away
    w.run()
    assert w.pending and w.stats.incidents == 0
    w.close()
    # nothing was committed: the next member of the group reads the whole batch again
    assert len(bus.consumer([TELEMETRY], "g").poll(timeout=0, max_records=1000)) == len(_stream())


def test_a_failed_commit_after_acknowledged_output_is_counted_not_fatal():
    class CommitFails(InProcessBus):
        def consumer(self, topics, group):  # noqa: ANN001, ANN201
            c = super().consumer(topics, group)

            def commit() -> None:
                raise BusError("Kafka commit failed: CommitFailedError: the group has rebalanced")

            c.commit = commit  # type: ignore[method-assign]
            return c

    bus = CommitFails()
    w = _run(bus)
    assert w.stats.commit_failures == w.stats.batches > 0
    assert w.stats.incidents == len(bus.records(INCIDENTS)) > 0
