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

Grouping: with the rules alone, each batch is fed grouped by host (each host's own order kept; a
host's cold per-host memory is then touched once per run of samples, not once per sample), with the
same output as record order: see :meth:`DetectWorker._feed_batch`. The model detectors (one
:class:`detectors.ml.MLSuite`) hold their windows and are scored at the same fleet-time points and at
the end of each batch, so an engine with them is fed grouped too; an engine with a detector that
returns findings of other hosts' windows from ``feed`` (not ``engine.order_free``) is fed in record
order.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from detectors.engine.engine import DetectorEngine
from detectors.engine.fastdecode import IncrementalDecoder
from fleethealth.bus import (
    DEADLETTER,
    INCIDENTS,
    TELEMETRY,
    Bus,
    BusError,
    PublishAck,
    RebalancingConsumer,
    Record,
)
from fleethealth.deadletter import dead_letter_for
from fleethealth.identity import Verifier
from fleethealth.salvage import removed_fields
from fleethealth.schema import ContractError, Incident, Sample, encode

log = logging.getLogger(__name__)
TP = tuple[str, int]


_AT_TURN = object()  # a grouped batch's record whose key is new to the worker: decoded at its admission turn
GC_YOUNG = 10_000  # the collector's young-generation threshold in a long-running worker (CPython: 700)


def streaming_gc() -> None:
    """Collector settings for a long-running worker, called once start-up is done: the objects alive
    now (modules, rules and their generated code, models) are frozen out of the collector's view,
    and the young generation is collected every ``GC_YOUNG`` net allocations instead of 700. A
    batch's decoded samples stay alive until it is fed, so at 700 the collector ran every ~70
    samples and traversed them again and again: 17-22 us a sample of collector time on the 256-host
    cut (gc.callbacks, load ~7), 6-8 us with these settings. Reference counting still frees all
    acyclic garbage at once; only cycles wait longer (at most ``GC_YOUNG`` objects more)."""
    gc.collect()
    gc.freeze()
    _, mid, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, mid, old)


def staleness_clock(stream_now: float, high_water_ts: dict[TP, float], lag: dict[TP, int]) -> float:
    """The time staleness may be judged at: ``stream_now``, or the sample high-water mark of the
    furthest-behind partition that still has records to deliver (``lag`` > 0), whichever is less."""
    behind = [high_water_ts[tp] for tp, n in lag.items() if n > 0 and tp in high_water_ts]
    return min([stream_now, *behind])


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
    clock_ahead: int = 0  # samples stamped past --max-clock-skew ahead of receive time (corrected)
    clock_behind: int = 0  # samples stamped past --max-lateness behind receive time (counted only)
    fields_rejected: int = 0  # samples that lost fields to field-level rejection (processed)
    hosts_evicted: int = 0  # silent hosts whose state made room under --max-hosts
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


def _first(item: tuple[int, Outgoing]) -> int:
    return item[0]


def _acked(handle: PublishAck | None, flushed: bool) -> bool:
    """Did the bus acknowledge a message? ``publish`` returns a :class:`PublishAck` (Kafka) or None
    (buses that are durable once ``flush`` returns)."""
    if handle is None:
        return flushed
    return bool(handle.is_done) and bool(handle.succeeded())


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

    JOIN_GRACE_S = 60.0  # run(max_idle_polls): empty polls before the first assignment are not idle, this long

    def __init__(self, bus: Bus, engine: DetectorEngine | None = None, *, group: str = "fleethealth-detect",
                 topic: str = TELEMETRY, incidents_topic: str = INCIDENTS, deadletter_topic: str = DEADLETTER,
                 max_records: int = 2000, poll_timeout: float = 0.5, metrics: Any = None,
                 clock: Callable[[], float] = time.time, idle_tick: bool = True, retry_s: float = 0.5,
                 max_retry_s: float = 30.0, sleep: Callable[[float], None] = time.sleep,
                 rebuild_window_s: float = 7200.0, monotonic: Callable[[], float] = time.monotonic,
                 max_clock_skew: float = 300.0, max_lateness: float = 3600.0,
                 host_allowlist: frozenset[str] | None = None, max_hosts: int = 25_000,
                 verifier: Verifier | None = None, group_hosts: bool | None = None) -> None:
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
        self.max_clock_skew = max_clock_skew
        self.max_lateness = max_lateness
        self.host_allowlist = host_allowlist
        self.max_hosts = max_hosts
        self.verifier = verifier
        self.stats = WorkerStats()
        # per-host reuse of unchanged sub-objects; same values and errors as decode_sample (one per worker)
        self._decoder = IncrementalDecoder(max_hosts=max_hosts)
        self.consumer = bus.consumer([topic], group)
        # checked once: isinstance against a runtime Protocol costs 60-130 µs (every attribute is
        # looked up), which at a paced load's few-record batches was a large part of each batch
        self._rebalancing: RebalancingConsumer | None = (
            self.consumer if isinstance(self.consumer, RebalancingConsumer) else None)
        self.pending: list[Outgoing] = []
        self._stop = False
        self._host_tp: dict[str, TP] = {}  # host -> its partition, least recently fed first
        self._next: dict[TP, int] = {}  # partition -> offset after the last record fed (live or replayed)
        self._hw_ts: dict[TP, float] = {}  # partition -> largest sample ts fed (live or replayed)
        self._last_ts = 0.0  # largest sample ts fed live
        self._last_mono = 0.0  # monotonic time a batch last brought samples
        self._last_tick = 0.0
        # feeding each batch grouped by host gives the same output as record order (see _feed_batch) for
        # the rules and for detectors the engine flushes at fleet-time epochs (engine.order_free)
        self.group_hosts = self.engine.order_free if group_hosts is None else group_hosts
        self._tagged: list[tuple[int, Outgoing]] | None = None  # a grouped batch's messages, by record index
        self._at = -1  # the record a grouped batch is on
        self._batch: dict[str, bool] | None = None  # hosts admitted in this grouped batch -> new to the engine
        self._batch_new = 0

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
        fed = self._feed_batch(records, now) if self.group_hosts else self._feed_in_order(records, now)
        if fed:
            self._last_mono = self.monotonic()
            if self.metrics is not None:
                self.metrics.fed(fed)
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

    def _feed_in_order(self, records: list[Record], now: float) -> int:
        """Admit and feed each record in turn (engines with a detector whose findings follow the
        cross-host order: not ``engine.order_free``)."""
        fed = 0
        engine = self.engine
        for rec in records:
            self._next[(rec.topic, rec.partition)] = rec.offset + 1
            sample = self._admit(rec, now)
            if sample is None:
                continue
            base = self._decoder.base
            self._seen(sample, (rec.topic, rec.partition))
            if sample.ts >= engine.epoch_due:  # here, not in feed: a sample that breaks a rule keeps them
                self._queue(engine.advance_epoch(sample.ts))
            try:
                self._queue(self.engine.feed(sample, base))
            except Exception as exc:  # a sample that breaks a rule must not stop the fleet's detection
                log.exception("engine failed on a sample from %s", sample.host)
                self._dead(rec, f"detector failure: {type(exc).__name__}: {exc}", "engine", now)
                continue
            self.stats.samples += 1
            fed += 1
        return fed

    def _feed_batch(self, records: list[Record], now: float) -> int:
        """The batch grouped by host (each host's own order kept): a host's state, decoder cache and
        rule memory stay warm in the CPU caches over its run of samples, where record order touches
        every host's cold memory once a sample (about a third of decode + engine time at 256 hosts).

        The same result as feeding in record order, because every cross-host decision is taken in
        record order first: (1) decoding and the per-record checks are each record's own (the
        decoder's cache is per host); (2) admission under ``max_hosts`` (and eviction), field
        rejection, the clock-skew hold, the partitions' positions and high-water marks run in record
        order; (3) samples are fed grouped within segments cut where the record order reaches the
        engine's next fleet-time epoch (:meth:`DetectorEngine.advance_epoch`), so each fleet-baseline
        refresh sees the same rates and each scoring of the held model windows the same windows (its
        incidents go where that record's would); staleness ticks once per batch, after it, as before;
        (4) the batch's incidents and dead letters are put back in record order before they are
        queued."""
        tagged: list[tuple[int, Outgoing]] = []
        self._tagged = tagged
        try:
            return self._feed_grouped(records, now, tagged)
        finally:
            self._tagged, self._batch, self._at = None, None, -1
            tagged.sort(key=_first)  # stable: a record's own messages keep their order
            self.pending.extend(out for _, out in tagged)

    def _feed_grouped(self, records: list[Record], now: float, tagged: list[tuple[int, Outgoing]]) -> int:
        by_key: dict[str | None, list[int]] = {}
        nxt = self._next
        for i, rec in enumerate(records):
            nxt[rec.topic, rec.partition] = rec.offset + 1
            k = rec.key
            g = by_key.get(k)
            if g is None:
                by_key[k] = [i]
            else:
                g.append(i)
        # decoded grouped by key (the host; keyless records in order) where the key names a host that
        # holds state (its decoder cache is then warm over its run); a key new to this worker is decoded
        # at its turn below, so a sample its admission refuses is dropped at once: a flood of new host
        # names never holds a batch of full decodes in memory (the key only chooses when, never what:
        # each record's decode is its own)
        known = self.engine.hosts
        decode = self._decode
        decoder = self._decoder
        decoded: list[Any] = [_AT_TURN] * len(records)  # Sample, None (dead-lettered) or _AT_TURN
        bases: list[object] = [None] * len(records)  # each decode's base (IncrementalDecoder.base)
        for k, idx in by_key.items():
            if k is not None and k not in known:
                continue
            for i in idx:
                self._at = i
                decoded[i] = decode(records[i], now)
                bases[i] = decoder.base
        admitted: list[tuple[int, Sample]] = []
        append = admitted.append
        admit = self._admit_decoded
        seen = self._seen
        self._batch, self._batch_new = {}, 0
        for i, rec in enumerate(records):  # cross-host decisions: in record order
            self._at = i
            sample = decoded[i]
            if sample is _AT_TURN:
                sample = decode(rec, now)
                bases[i] = decoder.base
            else:
                decoded[i] = None
            if sample is None:
                continue
            if admit(rec, sample, now):
                seen(sample, (rec.topic, rec.partition))
                append((i, sample))
        self._at = -1
        self._batch = None
        engine = self.engine
        due = engine.epoch_due
        fed = 0
        seg: dict[str, list[tuple[int, Sample]]] = {}
        topic = self.incidents_topic
        for item in admitted:
            ts = item[1].ts
            if ts >= due:  # record order reaches a fleet-time epoch: feed what came before it first
                if seg:
                    fed += self._feed_segment(seg, records, bases, now, tagged)
                    seg = {}
                i = item[0]
                for inc in engine.advance_epoch(ts):
                    tagged.append((i, Outgoing(topic, inc.host, encode(inc), incident=inc)))
                due = engine.epoch_due
            g2 = seg.get(item[1].host)
            if g2 is None:
                seg[item[1].host] = [item]
            else:
                g2.append(item)
        if seg:
            fed += self._feed_segment(seg, records, bases, now, tagged)
        return fed

    def _feed_segment(self, seg: dict[str, list[tuple[int, Sample]]], records: list[Record], bases: list[object],
                      now: float, tagged: list[tuple[int, Outgoing]]) -> int:
        feed = self.engine.feed
        topic = self.incidents_topic
        fed = 0
        for items in seg.values():
            for i, sample in items:
                try:
                    incidents = feed(sample, bases[i])
                except Exception as exc:  # a sample that breaks a rule must not stop the fleet's detection
                    log.exception("engine failed on a sample from %s", sample.host)
                    self._at = i
                    self._dead(records[i], f"detector failure: {type(exc).__name__}: {exc}", "engine", now)
                    continue
                for inc in incidents:
                    tagged.append((i, Outgoing(topic, inc.host, encode(inc), incident=inc)))
                fed += 1
        self.stats.samples += fed
        return fed

    def _seen(self, sample: Sample, tp: TP) -> None:
        """A sample will be fed: its host moves to the end of the least-recently-fed order; the
        partition's and the stream's high-water sample times."""
        host_tp = self._host_tp
        host_tp.pop(sample.host, None)
        host_tp[sample.host] = tp  # re-inserted last: least recently fed first
        ts = sample.ts
        if ts > self._hw_ts.get(tp, 0.0):
            self._hw_ts[tp] = ts
        if ts > self._last_ts:
            self._last_ts = ts

    # ------------------------------------------------------------------ the trust boundary

    def _admit(self, rec: Record, now: float) -> Sample | None:
        """Decode one record and decide whether its sample may be fed (None: dead-lettered).

        In order, cheapest first and before any per-host state exists: the signature (with
        ``verifier``: the record key names the host whose key signed it), the allowlist on the key,
        the contract (a bad field costs that field), key == host, the allowlist on the host, room
        under ``max_hosts``; then the sample's time is held to the receive time ``now``."""
        sample = self._decode(rec, now)
        if sample is None or not self._admit_decoded(rec, sample, now):
            return None
        return sample

    def _decode(self, rec: Record, now: float) -> Sample | None:
        """The record's own checks (:meth:`_admit`'s first part): nothing in them depends on other
        hosts' records."""
        if self.verifier is not None:
            why = self.verifier.check(rec.key, rec.value, rec.headers)
            if why:
                self._dead(rec, why, "identity", now)
                return None
        allow = self.host_allowlist
        if allow is not None and rec.key is not None and rec.key not in allow:
            self._dead(rec, f"unknown host {rec.key[:256]!r}: not in the host allowlist; no state kept", "unknown_host",
                       now)
            return None
        try:
            sample = self._decoder.decode(rec.value)
        except ContractError as exc:
            self._dead(rec, str(exc), exc.kind, now)
            return None
        host = sample.host
        if rec.key is not None and rec.key != host:
            self._dead(rec, f"message key {rec.key!r} does not match host {host!r}", "key", now)
            self._forget_unfed(host)
            return None
        if allow is not None and host not in allow:
            self._dead(rec, f"unknown host {host!r}: not in the host allowlist; no state kept", "unknown_host", now)
            self._forget_unfed(host)
            return None
        return sample

    def _admit_decoded(self, rec: Record, sample: Sample, now: float) -> bool:
        """:meth:`_admit`'s second part, taken in record order: room under ``max_hosts`` (hosts
        admitted earlier in a grouped batch count as held), field rejection, the clock hold."""
        host = sample.host
        hosts = self.engine.hosts
        batch = self._batch
        if host not in hosts and (batch is None or host not in batch):
            held = len(hosts) + (self._batch_new if batch is not None else 0)
            if held >= self.max_hosts and not self._evict_one():
                self._dead(rec, f"host {host!r} refused: {self.max_hosts} hosts hold state (--max-hosts) and none "
                                "of them is silent", "host_limit", now)
                self._forget_unfed(host)
                return False
            if batch is not None:
                batch[host] = True
                self._batch_new += 1
        elif batch is not None and host not in batch:
            batch[host] = False
        if sample.source_errors and (gone := removed_fields(sample)):
            self.stats.fields_rejected += 1
            self._dead(rec, f"{len(gone)} field(s) removed, the rest of the sample was processed: " + "; ".join(gone),
                       "field", now)
        ahead = sample.ts - now
        if self.max_clock_skew > 0 and ahead > self.max_clock_skew:
            # a host's clock (or a forger) must not move the fleet's: held to the receive time
            self.stats.clock_ahead += 1
            if self.metrics is not None:
                self.metrics.clock_skew.labels("ahead").inc()
            log.warning("sample from %s stamped %.0f s ahead of receive time: corrected to it", host, ahead)
            sample.ts = now
        elif self.idle_tick and self.max_lateness > 0 and -ahead > self.max_lateness:
            self.stats.clock_behind += 1  # a spool resend is legitimately old: counted, not changed
            if self.metrics is not None:
                self.metrics.clock_skew.labels("behind").inc()
        return True

    def _forget_unfed(self, host: str) -> None:
        """A rejected sample's host keeps no decoder state unless it already had fed samples."""
        if host not in self.engine.hosts:
            self._decoder.forget(host)

    def _evict_one(self) -> bool:
        """Make room for a new host: drop the least recently fed host if it has been silent past its
        staleness limit at the fleet clock (its state, decoder cache, episodes). False: none is."""
        now = self._fleet_now()
        batch = self._batch
        for host in self._host_tp:  # least recently fed first
            if batch is not None and host in batch:
                return False  # it sent a sample in this batch (fed in order, it would be fed by now): live
            st = self.engine.hosts.get(host)
            if st is None:
                continue
            if now - st.last_ts <= self.engine.stale_limit(st):
                return False  # the least recently fed host is live: so are all the others
            self.forget_host(host)
            self.stats.hosts_evicted += 1
            if self.metrics is not None:
                self.metrics.hosts_evicted.inc()
            log.info("host %s evicted (silent %.0f s) to make room under --max-hosts %d", host, now - st.last_ts,
                     self.max_hosts)
            return True
        return False

    def forget_host(self, host: str) -> None:
        self.engine.forget_host(host)
        self._decoder.forget(host)
        self._host_tp.pop(host, None)

    def stream_now(self) -> float:
        """The largest sample ts fed, plus (live) the time elapsed since samples last arrived."""
        if not self._last_ts:
            return 0.0
        return self._last_ts + (max(0.0, self.monotonic() - self._last_mono) if self.idle_tick else 0.0)

    def _fleet_now(self) -> float:
        """The time staleness is judged at: the stream clock, held back for lagging partitions, and
        never ahead of this worker's own clock (one host's claim cannot age the others)."""
        return min(staleness_clock(self.stream_now(), self._hw_ts, self._lag()), self.clock())

    def _lag(self) -> dict[TP, int]:
        """Records each fed partition still holds beyond what was fed (Kafka: the consumer's last
        known high watermark, no network call); {} on buses without one (they are read in order)."""
        consumer = self._rebalancing
        if consumer is None:
            return {}
        out: dict[TP, int] = {}
        for tp, nxt in self._next.items():
            hw = consumer.highwater(tp)
            if hw is not None:
                out[tp] = hw - nxt
        return out

    def _tick(self) -> None:
        """Run staleness every ``engine.tick_every_s`` of :func:`staleness_clock` time."""
        if not self._last_ts:
            return
        now = self._fleet_now()
        if now - self._last_tick >= self.engine.tick_every_s:
            self._last_tick = now
            self._queue(self.engine.tick(now))

    def _queue(self, incidents: list[Incident]) -> None:
        for inc in incidents:
            self.pending.append(Outgoing(self.incidents_topic, inc.host, encode(inc), incident=inc))

    def _dead(self, rec: Record, reason: str, kind: str, now: float) -> None:
        log.warning("dead letter from %s[%s]@%s: %s", rec.topic, rec.partition, rec.offset, reason[:300])
        out = Outgoing(self.deadletter_topic, rec.key, encode(dead_letter_for(rec, reason, self.group, now)),
                       dead_kind=kind)
        if self._tagged is not None:  # a grouped batch: put back in record order before it is queued
            self._tagged.append((self._at, out))
        else:
            self.pending.append(out)

    def _deliver(self) -> bool:
        """Publish and flush the pending messages until the bus acknowledges every one; retry what it
        did not, in order, with capped backoff. False only when stop() was called first."""
        delay = self.retry_s
        while self.pending:
            handles: list[PublishAck | None] = []
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
        consumer = self._rebalancing
        if consumer is None or not consumer.assignment_changes():
            return
        owned = set(consumer.assigned())
        committed: dict[TP, int | None] = consumer.committed(sorted(owned)) if owned else {}
        # a partition needs rebuilding when this worker has not fed it up to the group's offset
        stale = {tp for tp in owned if (committed.get(tp) or 0) > self._next.get(tp, 0) or tp not in self._next}
        gone = (set(self._next) - owned) | stale
        if gone:
            dropped = [h for h, tp in self._host_tp.items() if tp in gone]
            for host in dropped:
                self.forget_host(host)
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
        wall = self.clock()
        assert self._rebalancing is not None  # only _sync_assignment calls this
        for rec in self._rebalancing.history(ends, self.rebuild_window_s):
            try:
                sample = self._decoder.decode(rec.value)
            except ContractError:
                continue  # dead-lettered by the worker that read it live
            if rec.key is not None and rec.key != sample.host:
                continue
            if self.host_allowlist is not None and sample.host not in self.host_allowlist:
                continue
            if self.verifier is not None and self.verifier.check(rec.key, rec.value, rec.headers):
                continue
            if sample.host not in self.engine.hosts and len(self.engine.hosts) >= self.max_hosts:
                continue
            if self.max_clock_skew > 0 and sample.ts - wall > self.max_clock_skew:
                sample.ts = min(rec.ts or wall, wall)  # held as live (broker time, when it has one)
            tp = (rec.topic, rec.partition)
            self._host_tp.pop(sample.host, None)
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
        started = self.monotonic()
        joining = self._rebalancing
        while not self._stop:
            try:
                n = self.run_once()
            except BusError as exc:  # poll or rebuild could not reach the bus; nothing is owed
                log.error("bus error, retrying in 1 s: %s", exc)
                self.sleep(1.0)
                continue
            if (not n and joining is not None and not joining.assigned()
                    and self.monotonic() - started < self.JOIN_GRACE_S):
                continue  # still joining the group (librdkafka's poll returns on time meanwhile): not idle
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
