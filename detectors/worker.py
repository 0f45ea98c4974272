"""The detect worker: telemetry from the bus -> DetectorEngine -> incidents on the bus.

Delivery: a batch is polled, every sample fed, and the batch's incidents and dead letters kept in
a pending list until the bus has acknowledged every one of them (publish + flush, retried with
capped exponential backoff for as long as the broker is away, counted as
``fleethealth_detect_publish_retries_total``); only then are the consumer's offsets committed and
the next batch polled. The worker never moves past a batch whose output is not acknowledged; a
crash or stop in between replays the batch (incidents are episodes with stable ids, so a replayed
message is the same message). A message that does not decode goes to ``fleet.deadletter.v1`` with
the reason and is counted; the worker carries on.

Rebalances (Kafka): per-host state lives in the worker that owns the host's partition (the key is
the host). When a partition is revoked its hosts' state is dropped silently; when one is assigned
that this worker did not already hold at the group's committed offset, the worker re-reads the
partition from ``rebuild_window_s`` before the committed record up to the committed offset and
replays it into the engine silently (:meth:`DetectorEngine.replay`): state, windows and episodes
come back with their original first_seen, hence their ids, and nothing is re-emitted. See
docs/detectors.md, "Episodes".

Time: detection time comes from the samples. Quiet periods run on each host's own sample time (in
the engine). Staleness (``host_unreachable``) needs a fleet clock, and the worker ticks it with
:func:`staleness_clock`: the stream time — the largest sample ts fed, advanced by the monotonic
time elapsed since a batch last brought samples, so a live fleet that goes silent still ages and a
replay of an old recording behaves as live — held back to the high-water sample ts of any assigned
partition that still has records waiting (Kafka reads partitions unevenly: a lagging partition's
hosts are behind, not silent). Partitions that are caught up count as current.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from detectors.engine import DetectorEngine
from detectors.fastdecode import IncrementalDecoder
from fleethealth.bus import DEADLETTER, INCIDENTS, TELEMETRY, Bus, BusError, Record
from fleethealth.schema import ContractError, DeadLetter, Incident, encode

log = logging.getLogger(__name__)
TP = tuple[str, int]


def staleness_clock(stream_now: float, high_water_ts: dict[TP, float], lag: dict[TP, int]) -> float:
    """The time staleness may be judged at: ``stream_now``, or the sample high-water mark of the
    furthest-behind partition that still has records to deliver (``lag`` > 0), whichever is less."""
    behind = [high_water_ts[tp] for tp, n in lag.items() if n > 0 and tp in high_water_ts]
    return min([stream_now, *behind])


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
    publish_retries: int = 0
    commit_failures: int = 0
    rebuilds: int = 0
    rebuilt_samples: int = 0
    last_batch_s: float = 0.0
    by_reason: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Outgoing:
    """One message the worker owes the bus (an incident or a dead letter), in emission order."""

    topic: str
    key: str | None
    value: bytes
    incident: Incident | None = None
    dead_kind: str = ""


def _acked(handle: Any, flushed: bool) -> bool:
    """Did the bus acknowledge a message? ``publish`` returns a future (Kafka) or None (buses that
    are durable once ``flush`` returns)."""
    if handle is None:
        return flushed
    done = getattr(handle, "is_done", None)
    if done is None:
        return flushed
    return bool(done) and bool(handle.succeeded())


class DetectWorker:
    """One member of the ``fleethealth detect`` consumer group.

    ``run_once()`` handles one poll (returns the number of records); ``run()`` loops until
    ``stop()``. Detection time always comes from the samples; ``clock`` (wall) only stamps dead
    letters and metrics. With ``idle_tick`` the stream clock also advances by ``monotonic`` time
    elapsed since samples last arrived (a live fleet gone silent becomes unreachable); without it
    (a file, a replay) only samples move time. The worker ticks the engine's staleness itself
    (``engine.auto_tick`` is switched off). ``sleep`` waits between delivery retries (``retry_s``
    doubling up to ``max_retry_s``).
    """

    def __init__(self, bus: Bus, engine: DetectorEngine | None = None, *, group: str = "fleethealth-detect",
                 topic: str = TELEMETRY, incidents_topic: str = INCIDENTS, deadletter_topic: str = DEADLETTER,
                 max_records: int = 2000, poll_timeout: float = 0.5, metrics: Any = None,
                 clock: Callable[[], float] = time.time, idle_tick: bool = True, retry_s: float = 0.5,
                 max_retry_s: float = 30.0, sleep: Callable[[float], None] = time.sleep,
                 rebuild_window_s: float = 7200.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.bus = bus
        self.engine = engine or DetectorEngine()
        self.engine.auto_tick = False  # staleness runs on this worker's clock (see staleness_clock)
        self.group = group
        self.topic = topic
        self.incidents_topic = incidents_topic
        self.deadletter_topic = deadletter_topic
        self.max_records = max_records
        self.poll_timeout = poll_timeout
        self.metrics = metrics
        self.clock = clock
        self.monotonic = monotonic
        self.idle_tick = idle_tick
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.sleep = sleep
        self.rebuild_window_s = rebuild_window_s
        self.stats = WorkerStats()
        # per-host reuse of unchanged sub-objects; same values and errors as decode_sample (one per worker)
        self._decoder = IncrementalDecoder()
        self.consumer = bus.consumer([topic], group)
        self.pending: list[Outgoing] = []
        self._stop = False
        self._host_tp: dict[str, TP] = {}
        self._next: dict[TP, int] = {}  # partition -> offset after the last record fed (live or replayed)
        self._hw_ts: dict[TP, float] = {}  # partition -> largest sample ts fed (live or replayed)
        self._last_ts = 0.0  # largest sample ts fed live
        self._last_mono = 0.0  # monotonic time a batch last brought samples
        self._last_tick = 0.0

    # ------------------------------------------------------------------ one batch

    def run_once(self) -> int:
        """One poll: feed, deliver (until acknowledged), commit. Returns the number of records."""
        t0 = time.perf_counter()
        if self.pending and not self._deliver():  # a previous call was stopped mid-delivery
            return 0
        records = self.consumer.poll(timeout=self.poll_timeout, max_records=self.max_records)
        self._sync_assignment()
        if not records:
            if self.idle_tick:  # a live stream gone quiet: stream time moves on with the monotonic clock
                self._tick()
                if self.pending:
                    self._deliver()
            return 0
        now = self.clock()
        fed = 0
        for rec in records:
            self._next[(rec.topic, rec.partition)] = rec.offset + 1
            try:
                sample = self._decoder.decode(rec.value)
            except ContractError as exc:
                self._dead(rec, str(exc), exc.kind, now)
                continue
            if rec.key is not None and rec.key != sample.host:
                self._dead(rec, f"message key {rec.key!r} does not match host {sample.host!r}", "key", now)
                continue
            tp = (rec.topic, rec.partition)
            self._host_tp[sample.host] = tp
            if sample.ts > self._hw_ts.get(tp, 0.0):
                self._hw_ts[tp] = sample.ts
            if sample.ts > self._last_ts:
                self._last_ts = sample.ts
            try:
                self._queue(self.engine.feed(sample))
            except Exception as exc:  # a sample that breaks a rule must not stop the fleet's detection
                log.exception("engine failed on a sample from %s", sample.host)
                self._dead(rec, f"detector failure: {type(exc).__name__}: {exc}", "engine", now)
                continue
            self.stats.samples += 1
            fed += 1
            if self.metrics is not None:
                self.metrics.sample(sample, now)
        if fed:
            self._last_mono = self.monotonic()
        try:
            self._queue(self.engine.flush())  # findings the model detectors batched
        except Exception:  # a broken model must not stop the rules' incidents
            log.exception("a detector's flush failed")
            self.engine.stats["detector_errors"] += 1
        self._tick()
        if not self._deliver():
            return len(records)  # stopped before the bus acknowledged: not committed, replayed by the next owner
        self._commit()
        self.stats.batches += 1
        self.stats.last_batch_s = time.perf_counter() - t0
        if self.metrics is not None:
            self.metrics.batch(len(records), self.stats.last_batch_s, self.engine, self.consumer)
        return len(records)

    def stream_now(self) -> float:
        """The largest sample ts fed, plus (live) the time elapsed since samples last arrived."""
        if not self._last_ts:
            return 0.0
        return self._last_ts + (max(0.0, self.monotonic() - self._last_mono) if self.idle_tick else 0.0)

    def _lag(self) -> dict[TP, int]:
        """Records each fed partition still holds beyond what was fed (Kafka: the consumer's last
        known high watermark, no network call); {} on buses without one (they are read in order)."""
        highwater = getattr(getattr(self.consumer, "raw", None), "highwater", None)
        if highwater is None:
            return {}
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        out: dict[TP, int] = {}
        for tp, nxt in self._next.items():
            try:
                hw = highwater(TopicPartition(*tp))
            except KafkaError:  # no longer assigned
                continue
            if hw is not None:
                out[tp] = hw - nxt
        return out

    def _tick(self) -> None:
        """Run staleness every ``engine.tick_every_s`` of :func:`staleness_clock` time."""
        if not self._last_ts:
            return
        now = staleness_clock(self.stream_now(), self._hw_ts, self._lag())
        if now - self._last_tick >= self.engine.tick_every_s:
            self._last_tick = now
            self._queue(self.engine.tick(now))

    def _queue(self, incidents: list[Incident]) -> None:
        for inc in incidents:
            self.pending.append(Outgoing(self.incidents_topic, inc.host, encode(inc), incident=inc))

    def _dead(self, rec: Record, reason: str, kind: str, now: float) -> None:
        log.warning("dead letter from %s[%s]@%s: %s", rec.topic, rec.partition, rec.offset, reason[:300])
        self.pending.append(Outgoing(self.deadletter_topic, rec.key, encode(dead_letter(rec, reason, self.group, now)),
                                     dead_kind=kind))

    def _deliver(self) -> bool:
        """Publish and flush the pending messages until the bus acknowledges every one; retry what it
        did not, in order, with capped backoff. False only when stop() was called first."""
        delay = self.retry_s
        while self.pending:
            handles: list[Any] = []
            err: BusError | None = None
            try:
                for out in self.pending:
                    handles.append(self.bus.publish(out.topic, out.key, out.value))
            except BusError as exc:
                err = exc
            try:
                self.bus.flush()
            except BusError as exc:
                err = err or exc
            left: list[Outgoing] = []
            for i, out in enumerate(self.pending):
                if i < len(handles) and _acked(handles[i], err is None):
                    self._delivered(out)
                else:
                    left.append(out)
            self.pending = left
            if not left:
                return True
            self.stats.publish_retries += 1
            if self.metrics is not None:
                self.metrics.publish_retries.inc()
            log.error("bus did not acknowledge %d of %d message(s) (%s); retrying in %.1f s, offsets held",
                      len(left), len(handles) or len(left), err or "send failed", delay)
            if self._stop:
                return False
            self.sleep(delay)
            delay = min(delay * 2, self.max_retry_s)
            if self._stop:
                return False
        return True

    def _delivered(self, out: Outgoing) -> None:
        if out.incident is not None:
            self.stats.incidents += 1
            if self.metrics is not None:
                self.metrics.incident(out.incident)
        else:
            self.stats.dead_letters += 1
            self.stats.by_reason[out.dead_kind] = self.stats.by_reason.get(out.dead_kind, 0) + 1
            if self.metrics is not None:
                self.metrics.dead_letter(out.dead_kind)

    def _commit(self) -> None:
        try:
            self.consumer.commit()
        except BusError as exc:
            # the output is acknowledged; the offsets are not: the batch may be replayed (same ids)
            self.stats.commit_failures += 1
            log.warning("offset commit failed (batch may be redelivered): %s", exc)

    # ------------------------------------------------------------------ rebalances

    def _sync_assignment(self) -> None:
        """Apply partition revocations/assignments the consumer reported during poll."""
        changes = getattr(self.consumer, "assignment_changes", None)
        if changes is None or not changes():
            return
        owned = set(self.consumer.assigned())
        committed: dict[TP, int | None] = self.consumer.committed(sorted(owned)) if owned else {}
        # a partition needs rebuilding when this worker has not fed it up to the group's offset
        stale = {tp for tp in owned if (committed.get(tp) or 0) > self._next.get(tp, 0) or tp not in self._next}
        gone = (set(self._next) - owned) | stale
        if gone:
            dropped = [h for h, tp in self._host_tp.items() if tp in gone]
            for host in dropped:
                self.engine.forget_host(host)
                self._decoder.forget(host)
                del self._host_tp[host]
            for tp in gone:
                self._next.pop(tp, None)
                self._hw_ts.pop(tp, None)
            if dropped or gone - stale:
                log.info("partitions %s left or must be rebuilt: state of %d host(s) dropped", sorted(gone),
                         len(dropped))
        ends = {tp: c for tp in stale if (c := committed.get(tp))}
        for tp in stale:
            self._next[tp] = committed.get(tp) or 0
        if ends:
            self._rebuild(ends)

    def _rebuild(self, ends: dict[TP, int]) -> None:
        t0 = time.perf_counter()
        n = 0
        for rec in self.consumer.history(ends, self.rebuild_window_s):
            try:
                sample = self._decoder.decode(rec.value)
            except ContractError:
                continue  # dead-lettered by the worker that read it live
            if rec.key is not None and rec.key != sample.host:
                continue
            tp = (rec.topic, rec.partition)
            self._host_tp[sample.host] = tp
            self._hw_ts[tp] = max(self._hw_ts.get(tp, 0.0), sample.ts)
            try:
                self.engine.replay(sample)
            except Exception:  # dead-lettered live; the rebuild goes on
                log.exception("engine failed replaying a sample from %s", sample.host)
            n += 1
        try:
            self.engine.flush(silent=True)  # windows the model detectors still hold are replayed ones
        except Exception:
            log.exception("a detector's flush failed after the rebuild")
        self.stats.rebuilds += len(ends)
        self.stats.rebuilt_samples += n
        if self.metrics is not None:
            self.metrics.rebuilds.inc(len(ends))
            self.metrics.rebuilt_samples.inc(n)
        log.info("rebuilt state of partitions %s from %d sample(s) of the last %.0f s in %.1f s",
                 sorted(ends), n, self.rebuild_window_s, time.perf_counter() - t0)

    # ------------------------------------------------------------------ loop

    def run(self, max_idle_polls: int | None = None) -> WorkerStats:
        """Loop until stop() (or, with ``max_idle_polls``, until that many empty polls in a row)."""
        idle = 0
        while not self._stop:
            try:
                n = self.run_once()
            except BusError as exc:  # poll or rebuild could not reach the bus; nothing is owed
                log.error("bus error, retrying in 1 s: %s", exc)
                self.sleep(1.0)
                continue
            idle = 0 if n else idle + 1
            if max_idle_polls is not None and idle >= max_idle_polls:
                break
        return self.stats

    def stop(self) -> None:
        self._stop = True

    def close(self) -> None:
        try:
            if self.pending:
                log.error("closing with %d unacknowledged message(s): their batch was not committed and will be "
                          "replayed by the next owner", len(self.pending))
            self.bus.flush()
        finally:
            self.consumer.close()
