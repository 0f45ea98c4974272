"""Kafka implementation of the bus over confluent-kafka (librdkafka, C), beside the kafka-python one
in :mod:`fleethealth.kafka_bus`: the same :class:`~fleethealth.bus.Bus` and
:class:`~fleethealth.bus.RebalancingConsumer` protocols, chosen with ``--kafka-client`` /
``[kafka].client`` (:func:`fleethealth.config.open_bus`).

Why a second client: librdkafka parses record batches, decompresses and batches sends in C on its
own threads, where kafka-python does it in Python on the caller's core; what it saves per record is
measured in ``benchmarks/bench_kafka_capacity.py`` (docs/scaling.md).

Same semantics as the kafka-python bus: producer keyed by host, ``acks=all``, lz4, retries that keep
per-partition order (the idempotent producer); ``publish`` returns a handle whose ``is_done`` /
``succeeded()`` say whether the broker acknowledged (delivery reports are served by ``flush`` and
by every ``publish``), or with ``delivery_reports="failures"`` returns None and ``flush`` raises for
what was not delivered (:data:`fleethealth.bus.DELIVERY_REPORTS`); consumer groups with auto-commit off, ``commit()`` commits what ``poll``
returned so far. ``[kafka].security`` keeps kafka-python's option names (one config for both
clients); :data:`SECURITY_NAMES` maps them to librdkafka's.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from fleethealth.bus import BusError, Headers, Record, per_message_reports
from fleethealth.kafka_bus import _security, default_compression

log = logging.getLogger(__name__)
TP = tuple[str, int]

# kafka-python option name (what [kafka].security holds) -> librdkafka property
SECURITY_NAMES = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
    "sasl_kerberos_service_name": "sasl.kerberos.service.name",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
    "ssl_password": "ssl.key.password",
    "ssl_crlfile": "ssl.crl.location",
}


def rdkafka_security(security: Mapping[str, Any]) -> dict[str, Any]:
    """``[kafka].security`` (kafka-python names, checked by kafka_bus) as librdkafka properties."""
    out: dict[str, Any] = {}
    for k, v in _security(security).items():
        if k == "ssl_check_hostname":
            out["ssl.endpoint.identification.algorithm"] = "https" if v else "none"
        elif k == "sasl_oauth_token_provider":
            raise BusError("[kafka].security.sasl_oauth_token_provider is a kafka-python object; the confluent "
                           "client takes OAUTHBEARER settings of its own: use --kafka-client kafka-python")
        else:
            out[SECURITY_NAMES[k]] = v
    return out


# consumer properties fleethealth sets over librdkafka's defaults (a caller's keyword still wins)
CONSUMER_DEFAULTS: dict[str, Any] = {
    # librdkafka stops fetching a partition while the local queue is over queued.max.messages.kbytes
    # (64 MB: ~6,000 10.9 KB samples) and looks again only after this long (default 1000 ms), so a
    # worker draining a backlog sat idle once its queue ran dry: detect (rules) on a pre-filled topic
    # of 115k msgpack samples spent 110-125 us wall a sample at 54-57 us CPU; at 100 ms, 59-64 us wall
    # at the same CPU (54.5-57.6), consume alone 53-62 -> 12-14 us wall (13.3-14.5 -> 13.0-14.0 CPU),
    # interleaved, 3 rounds, load 2.1-2.6. Costs: a queue-full partition is re-checked 10 times a
    # second instead of once (a timer, no request); the queue's bounds, hence memory, are unchanged
    "fetch.queue.backoff.ms": 100,
}


def _consumer_option(k: str, v: Any) -> tuple[str, Any]:
    """A kafka-python consumer keyword (what callers pass: session_timeout_ms, auto_offset_reset ...)
    as its librdkafka property (the same words joined by dots)."""
    return k.replace("_", "."), v


class ConfluentAck:
    """One message's delivery report (the bus's PublishAck)."""

    __slots__ = ("error", "is_done")

    def __init__(self) -> None:
        self.is_done = False
        self.error: Any = None

    def __call__(self, err: Any, msg: Any) -> None:
        self.error = err
        self.is_done = True

    def succeeded(self) -> bool:
        return self.is_done and self.error is None


class ConfluentBus:
    """The bus over confluent-kafka. ``bootstrap``, ``client_id`` and ``_security`` (kafka-python
    names) are what the group-less readers of :mod:`fleethealth.kafka_bus` (KafkaOffsets,
    KafkaTopicReader) read, so they work beside either client."""

    client = "confluent"

    def __init__(
        self,
        bootstrap: str = "127.0.0.1:9092",
        *,
        client_id: str = "fleethealth",
        compression: str | None = "auto",
        security: Mapping[str, Any] | None = None,
        request_timeout_ms: int = 15000,
        max_block_ms: int = 10000,
        linger_ms: int = 5,
        batch_size: int = 1024 * 1024,
        delivery_timeout_ms: int = 120000,
        delivery_reports: str = "each",
    ) -> None:
        self.bootstrap = bootstrap
        self.client_id = client_id
        self._security = _security(security)
        self._rd_security = rdkafka_security(self._security)
        if compression == "auto":
            compression = default_compression()
        elif compression in ("none", "", None):
            compression = "none"
        self._max_block_s = max_block_ms / 1000
        self._producer_conf = {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "acks": "all",
            "enable.idempotence": True,  # retries keep a host's order with up to 5 requests in flight
            "compression.type": compression,
            "linger.ms": linger_ms,
            "batch.size": batch_size,
            # what may wait unsent: kafka-python's buffer_memory default. librdkafka's own (1 GiB) let
            # replay queue a whole recording in fresh memory, whose page faults cost more than the produce
            # call of a 14 KB sample (and RSS grew with the recording); a full queue blocks publish as before
            "queue.buffering.max.kbytes": 32 * 1024,
            "request.timeout.ms": request_timeout_ms,
            "delivery.timeout.ms": max(delivery_timeout_ms, request_timeout_ms + linger_ms),
            **self._rd_security,
        }
        # "failures": librdkafka reports only what failed, to one callback; a report per message costs
        # a 14 KB sample ~6 us in Python (a Message object holding a copy of the value, a call)
        self._each = per_message_reports(delivery_reports)
        self._failed = 0
        self._failure = ""
        if not self._each:
            self._producer_conf["delivery.report.only.error"] = True
            self._producer_conf["on_delivery"] = self._on_failure
        self._producer: Any = None
        self._kafka_exception: Any = None

    @property
    def producer(self) -> Any:
        if self._producer is None:
            from confluent_kafka import KafkaException, Producer

            try:
                self._producer = Producer(self._producer_conf)
            except (KafkaException, ValueError, TypeError) as exc:
                raise BusError(f"cannot make a Kafka producer for {self.bootstrap}: {exc}") from exc
            self._kafka_exception = KafkaException
        return self._producer

    def _on_failure(self, err: Any, msg: Any) -> None:
        """The one delivery callback of ``delivery_reports="failures"`` (run inside poll/flush)."""
        if err is not None:
            self._failed += 1
            self._failure = self._failure or f"{msg.topic()}: {err}"

    def publish(self, topic: str, key: str | None, value: bytes, headers: Headers = ()) -> ConfluentAck | None:
        ack = ConfluentAck() if self._each else None
        p = self._producer if self._producer is not None else self.producer
        k = key.encode() if key else None
        h = list(headers) if headers else None
        end = 0.0
        while True:
            try:
                p.produce(topic, value, k, headers=h, on_delivery=ack)
                break
            except BufferError:  # the local queue is full: serve delivery reports until it has room
                now = time.monotonic()
                end = end or now + self._max_block_s
                if now > end:
                    raise BusError(f"Kafka send to {topic}: the producer queue stayed full for "
                                   f"{self._max_block_s:.0f} s (broker away?)") from None
                # each report of a delivery wakes poll; with "failures" none comes: wait briefly
                p.poll(0.05 if self._each else 0.005)
            except self._kafka_exception as exc:
                raise BusError(f"Kafka send to {topic} failed: {exc}") from exc
        p.poll(0)  # serve delivery reports that have arrived (cheap)
        return ack

    def reset_producer(self) -> None:
        """Drop the producer (its unsent records fail); the next send makes a fresh one."""
        p, self._producer = self._producer, None
        if p is not None:
            p.purge()
            p.flush(0)

    def flush(self, timeout: float | None = None) -> None:
        if self._producer is None:
            return
        left = self._producer.flush(-1 if timeout is None else timeout)
        if left:
            raise BusError(f"Kafka flush: {left} message(s) not delivered within {timeout} s")
        if self._failed:
            n, why, self._failed, self._failure = self._failed, self._failure, 0, ""
            raise BusError(f"Kafka: {n} message(s) not delivered since the last flush (first: {why})")

    def consumer(self, topics: Sequence[str], group: str, *, auto_offset_reset: str = "earliest",
                 **kwargs: Any) -> ConfluentConsumer:
        from confluent_kafka import Consumer, KafkaException

        conf = {
            "bootstrap.servers": self.bootstrap,
            "client.id": self.client_id,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": auto_offset_reset,
            **CONSUMER_DEFAULTS,
            **self._rd_security,
            **dict(_consumer_option(k, v) for k, v in kwargs.items()),
        }
        adapter = ConfluentConsumer(None, self)
        try:
            c = Consumer(conf)
            c.subscribe(list(topics), on_assign=adapter._on_assign, on_revoke=adapter._on_revoke,
                        on_lost=adapter._on_revoke)
        except (KafkaException, ValueError, TypeError) as exc:
            raise BusError(f"cannot join group {group!r} at {self.bootstrap}: {exc}") from exc
        adapter._c = c
        return adapter

    def close(self) -> None:
        if self._producer is not None:
            try:
                self.flush(10)
            finally:
                self._producer = None


class ConfluentConsumer:
    """The bus Consumer over confluent-kafka, and a RebalancingConsumer (assignment events from the
    rebalance callbacks, which librdkafka runs inside ``poll``)."""

    def __init__(self, consumer: Any, bus: ConfluentBus) -> None:
        self._c = consumer
        self._bus = bus
        self._events: deque[tuple[str, frozenset[TP]]] = deque()
        self._polled = False  # something returned since the last commit

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._events.append(("assigned", frozenset((tp.topic, tp.partition) for tp in partitions)))

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self._events.append(("revoked", frozenset((tp.topic, tp.partition) for tp in partitions)))

    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[Record]:
        from confluent_kafka import KafkaException

        try:
            # librdkafka's batch consume waits for a full batch or the timeout; poll(timeout) returns
            # with the first record: wait with it, then take what else is already fetched
            c = self._c
            msgs = c.consume(max_records, 0)
            if not msgs and timeout > 0:
                first = c.poll(timeout)
                msgs = [] if first is None else [first, *(c.consume(max_records - 1, 0) if max_records > 1 else ())]
        except (KafkaException, RuntimeError) as exc:
            raise BusError(f"Kafka poll failed: {exc}") from exc
        out = [_record(m) for m in msgs if m.error() is None]
        if len(out) < len(msgs):
            for m in msgs:
                err = m.error()
                if err is not None and (err.fatal() or not err.retriable()):
                    log.warning("Kafka consumer: %s", err)
        if out:
            self._polled = True
        return out

    def commit(self) -> None:
        """Commit the offset after the last record ``poll`` returned on each partition (librdkafka
        stores it when consume hands the record over), synchronously."""
        from confluent_kafka import KafkaError, KafkaException

        if not self._polled:
            return
        try:
            self._c.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError._NO_OFFSET:
                return
            raise BusError(f"Kafka commit failed: {exc}") from exc
        self._polled = False

    def close(self) -> None:
        try:
            self._c.close()
        except RuntimeError:  # already closed
            pass

    def assignment_changes(self) -> list[tuple[str, frozenset[TP]]]:
        out = []
        while self._events:
            out.append(self._events.popleft())
        return out

    def assigned(self) -> set[TP]:
        return {(tp.topic, tp.partition) for tp in self._c.assignment()}

    def highwater(self, tp: TP) -> int | None:
        """From the last fetch response (``cached``: no network call)."""
        from confluent_kafka import KafkaException, TopicPartition

        try:
            _, hw = self._c.get_watermark_offsets(TopicPartition(*tp), cached=True)
        except KafkaException:
            return None
        return None if hw is None or hw < 0 else int(hw)

    def committed(self, partitions: Sequence[TP]) -> dict[TP, int | None]:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            got = self._c.committed([TopicPartition(*tp) for tp in partitions], timeout=30)
        except KafkaException as exc:
            raise BusError(f"Kafka committed-offset fetch failed: {exc}") from exc
        return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in got}

    def history(self, ends: Mapping[TP, int], window_s: float, timeout: float = 60.0) -> Iterator[Record]:
        """Records of each partition from ``window_s`` (by record timestamp) before the record at
        ``end - 1`` up to ``end`` (exclusive), partition by partition in offset order; read by a
        separate consumer that never joins the group nor commits."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        bus = self._bus
        c = None
        try:
            c = Consumer({"bootstrap.servers": bus.bootstrap, "client.id": bus.client_id + "-rebuild",
                          "group.id": f"{bus.client_id}-rebuild-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                          **CONSUMER_DEFAULTS, **bus._rd_security})
            want: dict[TP, int] = {}
            for tp, end in ends.items():
                low, _ = c.get_watermark_offsets(TopicPartition(*tp), timeout=timeout)
                if low < end:
                    want[tp] = end
            if not want:
                return
            last_ts = {tp: m.timestamp()[1] for tp, m in _read(c, {tp: end - 1 for tp, end in want.items()},
                                                                 {tp: end - 1 for tp, end in want.items()}, timeout)}
            found = c.offsets_for_times([TopicPartition(tp[0], tp[1], max(0, ts - int(window_s * 1000)))
                                         for tp, ts in last_ts.items()], timeout=timeout)
            starts = {}
            for f in found:
                tp = (f.topic, f.partition)
                start = f.offset if f.offset >= 0 else want[tp]
                if start < want[tp]:
                    starts[tp] = start
            for _, m in _read(c, starts, {tp: want[tp] - 1 for tp in starts}, timeout):
                yield _record(m)
        except KafkaException as exc:
            raise BusError(f"Kafka history read failed: {exc}") from exc
        finally:
            if c is not None:
                c.close()


def _read(c: Any, starts: Mapping[TP, int], last: Mapping[TP, int], timeout: float) -> Iterator[tuple[TP, Any]]:
    """Assign ``starts`` and yield (tp, message) in offset order until each partition reached its
    ``last`` offset (inclusive). BusError when no record arrives for ``timeout`` seconds."""
    from confluent_kafka import TopicPartition

    if not starts:
        return
    c.assign([TopicPartition(tp[0], tp[1], off) for tp, off in starts.items()])
    left = set(starts)
    quiet_since = time.monotonic()
    while left:
        msgs = c.consume(5000, 0.5)
        if not msgs and time.monotonic() - quiet_since > timeout:
            raise BusError(f"Kafka history read: no record for {timeout:.0f} s from {sorted(left)}")
        for m in msgs:
            if m.error() is not None:
                continue
            tp = (m.topic(), m.partition())
            if tp not in left:
                continue
            quiet_since = time.monotonic()
            if m.offset() <= last[tp]:
                yield tp, m
            if m.offset() >= last[tp]:
                left.discard(tp)
                c.pause([TopicPartition(*tp)])
    parts = [TopicPartition(*tp) for tp in starts]
    c.resume(parts)  # a paused partition stays paused across assign() in librdkafka
    c.unassign()


_new = tuple.__new__


def _record(m: Any) -> Record:
    """A consumed message as a bus Record, made in one C call (Record's own ``__new__`` is Python)."""
    key = m.key()
    kind, ts = m.timestamp()
    h = m.headers()
    return _new(Record, (m.topic(), m.partition(), m.offset(), None if key is None else key.decode(errors="replace"),
                         m.value() or b"", ts / 1000.0 if kind and ts > 0 else None, tuple(h) if h else ()))
