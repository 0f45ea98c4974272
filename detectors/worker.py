"""The detect worker: telemetry from the bus -> DetectorEngine -> incidents on the bus.

Delivery: a batch is polled, every sample fed, the batch's incidents published and flushed, and
only then the consumer's offsets committed — a crash between poll and commit replays the batch
(incidents are episodes with stable ids, so a replayed open is recognisable downstream). A
message that does not decode goes to ``fleet.deadletter.v1`` with the reason and is counted; the
worker carries on. Per-host state lives in the worker that owns the host's partition (the key is
the host); after a rebalance the new owner rebuilds it from the stream as samples arrive.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from detectors.engine import DetectorEngine
from fleethealth.bus import DEADLETTER, INCIDENTS, TELEMETRY, Bus, BusError, Record
from fleethealth.schema import ContractError, DeadLetter, Incident, decode_sample, encode

log = logging.getLogger(__name__)


def dead_letter(rec: Record, reason: str, consumer: str, now: float) -> DeadLetter:
    return DeadLetter(source_topic=rec.topic, partition=rec.partition, offset=rec.offset, key=rec.key,
                      reason=reason[:8000], consumer=consumer, ts=now, payload_excerpt=repr(rec.value[:512])[:1024],
                      payload_size=len(rec.value))


@dataclass
class WorkerStats:
    batches: int = 0
    samples: int = 0
    dead_letters: int = 0
    incidents: int = 0
    last_batch_s: float = 0.0
    by_reason: dict[str, int] = field(default_factory=dict)


class DetectWorker:
    """One member of the ``fleethealth detect`` consumer group.

    ``run_once()`` handles one poll (returns the number of records); ``run()`` loops until
    ``stop()``. ``clock`` is the wall clock used only for the idle staleness tick and dead-letter
    timestamps; detection time always comes from the samples.
    """

    def __init__(self, bus: Bus, engine: DetectorEngine | None = None, *, group: str = "fleethealth-detect",
                 topic: str = TELEMETRY, incidents_topic: str = INCIDENTS, deadletter_topic: str = DEADLETTER,
                 max_records: int = 2000, poll_timeout: float = 0.5, metrics: Any = None,
                 clock: Callable[[], float] = time.time, idle_tick: bool = True) -> None:
        self.bus = bus
        self.engine = engine or DetectorEngine()
        self.group = group
        self.topic = topic
        self.incidents_topic = incidents_topic
        self.deadletter_topic = deadletter_topic
        self.max_records = max_records
        self.poll_timeout = poll_timeout
        self.metrics = metrics
        self.clock = clock
        self.idle_tick = idle_tick
        self.stats = WorkerStats()
        self.consumer = bus.consumer([topic], group)
        self._stop = False
        self._idle_since: float | None = None

    def run_once(self) -> int:
        t0 = time.perf_counter()
        records = self.consumer.poll(timeout=self.poll_timeout, max_records=self.max_records)
        out: list[Incident] = []
        if not records:
            if self.idle_tick and self.engine.fleet_ts:
                # live stream gone quiet: let staleness advance on the wall clock
                now = self.clock()
                if now > self.engine.fleet_ts + self.engine.tick_every_s:
                    out = self.engine.tick(now)
                    self._publish(out)
                    self.bus.flush()
            return 0
        now = self.clock()
        for rec in records:
            try:
                sample = decode_sample(rec.value)
            except ContractError as exc:
                self._dead(rec, str(exc), exc.kind, now)
                continue
            if rec.key is not None and rec.key != sample.host:
                self._dead(rec, f"message key {rec.key!r} does not match host {sample.host!r}", "key", now)
                continue
            try:
                out.extend(self.engine.feed(sample))
            except Exception as exc:  # a sample that breaks a rule must not stop the fleet's detection
                log.exception("engine failed on a sample from %s", sample.host)
                self._dead(rec, f"detector failure: {type(exc).__name__}: {exc}", "engine", now)
                continue
            self.stats.samples += 1
            if self.metrics is not None:
                self.metrics.sample(sample, now)
        self._publish(out)
        self.bus.flush()  # incidents are durable before the offsets move
        self.consumer.commit()
        self.stats.batches += 1
        self.stats.last_batch_s = time.perf_counter() - t0
        if self.metrics is not None:
            self.metrics.batch(len(records), self.stats.last_batch_s, self.engine, self.consumer)
        return len(records)

    def _publish(self, incidents: list[Incident]) -> None:
        for inc in incidents:
            self.bus.publish(self.incidents_topic, inc.host, encode(inc))
            self.stats.incidents += 1
            if self.metrics is not None:
                self.metrics.incident(inc)

    def _dead(self, rec: Record, reason: str, kind: str, now: float) -> None:
        self.stats.dead_letters += 1
        self.stats.by_reason[kind] = self.stats.by_reason.get(kind, 0) + 1
        log.warning("dead letter from %s[%s]@%s: %s", rec.topic, rec.partition, rec.offset, reason[:300])
        self.bus.publish(self.deadletter_topic, rec.key, encode(dead_letter(rec, reason, self.group, now)))
        if self.metrics is not None:
            self.metrics.dead_letter(kind)

    def run(self, max_idle_polls: int | None = None) -> WorkerStats:
        """Loop until stop() (or, with ``max_idle_polls``, until that many empty polls in a row)."""
        idle = 0
        while not self._stop:
            try:
                n = self.run_once()
            except BusError as exc:
                log.error("bus error, retrying in 1 s: %s", exc)
                time.sleep(1.0)
                continue
            idle = 0 if n else idle + 1
            if max_idle_polls is not None and idle >= max_idle_polls:
                break
        return self.stats

    def stop(self) -> None:
        self._stop = True

    def close(self) -> None:
        try:
            self.bus.flush()
        finally:
            self.consumer.close()
