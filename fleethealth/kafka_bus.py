"""Kafka implementation of the bus (kafka-python).

Producer: keyed by host, ``acks=all``, compression, retries, bounded in-flight so retries keep
per-partition order. Consumer: a consumer group with auto-commit off; :meth:`KafkaConsumerAdapter.commit`
commits only what the caller has processed (call it after a batch). Security settings (SASL/SSL)
pass straight through from config.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from fleethealth.bus import BusError, Record, per_message_reports

log = logging.getLogger(__name__)

# kafka-python option names that may come from config, passed through unchanged.
SECURITY_KEYS = (
    "security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
    "sasl_kerberos_service_name", "sasl_oauth_token_provider", "ssl_cafile", "ssl_certfile",
    "ssl_keyfile", "ssl_password", "ssl_check_hostname", "ssl_crlfile",
)


def default_compression() -> str:
    """lz4 (a dependency): an order of magnitude cheaper than gzip on 14 KB samples."""
    return "lz4"


def _security(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    extra = dict(extra or {})
    unknown = set(extra) - set(SECURITY_KEYS)
    if unknown:
        raise BusError(f"unknown Kafka security option(s): {', '.join(sorted(unknown))}")
    return extra


class KafkaBus:
    client = "kafka-python"

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
        batch_size: int = 256 * 1024,
        delivery_reports: str = "each",
    ) -> None:
        self.bootstrap = bootstrap
        self._each = per_message_reports(delivery_reports)  # fleethealth.bus.DELIVERY_REPORTS
        self._failed: list[str] = []  # "failures": what the sender thread's errbacks reported
        self.client_id = client_id
        self._security = _security(security)
        if compression == "auto":
            compression = default_compression()
        elif compression in ("none", ""):
            compression = None
        self._producer_args = dict(
            bootstrap_servers=bootstrap.split(","),
            client_id=client_id,
            acks="all",
            compression_type=compression,
            retries=10,
            max_in_flight_requests_per_connection=1,  # retries must not reorder a host's samples
            linger_ms=linger_ms,
            batch_size=batch_size,  # the 16 KiB default holds one 14 KB sample; batch per partition instead
            request_timeout_ms=request_timeout_ms,
            max_block_ms=max_block_ms,
            **self._security,
        )
        self._producer: Any = None

    @property
    def producer(self) -> Any:
        if self._producer is None:
            from kafka import KafkaProducer
            from kafka.errors import KafkaError

            try:
                self._producer = KafkaProducer(**self._producer_args)
            except KafkaError as exc:
                raise BusError(f"cannot connect to Kafka at {self.bootstrap}: {exc}") from exc
        return self._producer

    def publish(self, topic: str, key: str | None, value: bytes, headers: tuple[tuple[str, bytes], ...] = ()) -> Any:
        """Hand a message to the producer; returns its future (``.is_done``, ``.succeeded()``), or
        None with ``delivery_reports="failures"`` (``flush`` raises for what was not delivered)."""
        from kafka.errors import KafkaError

        try:
            # the future tells the caller whether the broker acknowledged (flush alone does not)
            fut = self.producer.send(topic, key=key.encode() if key else None, value=value,
                                     headers=list(headers) or None)
        except KafkaError as exc:
            raise BusError(f"Kafka send to {topic} failed: {exc}") from exc
        if self._each:
            return fut
        fut.add_errback(lambda exc: self._failed.append(f"{topic}: {exc}"))  # list.append: thread-safe
        return None

    def reset_producer(self) -> None:
        """Drop the producer (its unsent records fail); the next send makes a fresh one. After a
        broker restart a producer can stay wedged (every send times out with the broker back up)."""
        p, self._producer = self._producer, None
        if p is not None:
            try:
                p.close(timeout=0)
            except Exception:  # noqa: BLE001 - a wedged producer may fail to close; it is dropped either way
                log.warning("Kafka producer close failed", exc_info=True)

    def flush(self, timeout: float | None = None) -> None:
        from kafka.errors import KafkaError

        if self._producer is not None:
            try:
                self._producer.flush(timeout)
            except KafkaError as exc:
                raise BusError(f"Kafka flush failed: {exc}") from exc
        if self._failed:
            failed, self._failed = self._failed, []
            raise BusError(f"Kafka: {len(failed)} message(s) not delivered since the last flush (first: {failed[0]})")

    def consumer(
        self, topics: Sequence[str], group: str, *, auto_offset_reset: str = "earliest", **kwargs: Any
    ) -> KafkaConsumerAdapter:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        adapter = KafkaConsumerAdapter(None, self)
        try:
            c = KafkaConsumer(
                bootstrap_servers=self.bootstrap.split(","),
                client_id=self.client_id,
                group_id=group,
                enable_auto_commit=False,
                auto_offset_reset=auto_offset_reset,
                **self._security,
                **kwargs,
            )
            c.subscribe(list(topics), listener=_listener(adapter))
        except KafkaError as exc:
            raise BusError(f"cannot join group {group!r} at {self.bootstrap}: {exc}") from exc
        adapter._c = c
        return adapter

    def close(self) -> None:
        if self._producer is not None:
            try:
                self._producer.flush(10)
                self._producer.close(10)
            finally:
                self._producer = None


class KafkaConsumerAdapter:
    """The bus Consumer over kafka-python, and a :class:`~fleethealth.bus.RebalancingConsumer`:
    ``assignment_changes()`` (events the group coordinator reported since the last call),
    ``assigned()``, ``committed(partitions)``, ``highwater(tp)`` and ``history(ends, window_s)``
    (records before the committed offsets, read by a separate group-less consumer, so the group
    position is untouched).
    """

    def __init__(self, consumer: Any, bus: KafkaBus | None = None) -> None:
        self._c = consumer
        self._bus = bus
        self._events: deque[tuple[str, frozenset[tuple[str, int]]]] = deque()

    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[Record]:
        from kafka.errors import KafkaError

        try:
            batches = self._c.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        except KafkaError as exc:
            raise BusError(f"Kafka poll failed: {exc}") from exc
        out: list[Record] = []
        for tp, msgs in batches.items():
            out.extend(_record(tp, m) for m in msgs)
        return out

    def commit(self) -> None:
        from kafka.errors import KafkaError

        try:
            self._c.commit()
        except KafkaError as exc:
            raise BusError(f"Kafka commit failed: {exc}") from exc

    def close(self) -> None:
        self._c.close(autocommit=False)

    # ------------------------------------------------------------------ rebalances

    def assignment_changes(self) -> list[tuple[str, frozenset[tuple[str, int]]]]:
        """("revoked" | "assigned", partitions) events since the last call (from the listener)."""
        out = []
        while self._events:
            out.append(self._events.popleft())
        return out

    def assigned(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self._c.assignment()}

    def highwater(self, tp: tuple[str, int]) -> int | None:
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        try:
            hw = self._c.highwater(TopicPartition(*tp))
        except KafkaError:  # no longer assigned
            return None
        return None if hw is None else int(hw)

    def committed(self, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        try:
            return {tp: self._c.committed(TopicPartition(*tp)) for tp in partitions}
        except KafkaError as exc:
            raise BusError(f"Kafka committed-offset fetch failed: {exc}") from exc

    def history(self, ends: Mapping[tuple[str, int], int], window_s: float,
                timeout: float = 60.0) -> Iterator[Record]:
        """Records of each partition from ``window_s`` (by record timestamp) before the record at
        ``end - 1`` up to ``end`` (exclusive), partition by partition in offset order."""
        from kafka import KafkaConsumer, TopicPartition
        from kafka.errors import KafkaError

        assert self._bus is not None
        bus = self._bus
        c = None
        try:
            c = KafkaConsumer(bootstrap_servers=bus.bootstrap.split(","), client_id=bus.client_id + "-rebuild",
                              group_id=None, enable_auto_commit=False, **bus._security)
            want = {TopicPartition(*tp): end for tp, end in ends.items()}
            c.assign(list(want))
            begin = c.beginning_offsets(list(want))
            want = {tp: end for tp, end in want.items() if begin[tp] < end}
            last: dict[Any, int] = {}
            for tp, end in want.items():
                c.seek(tp, end - 1)
            for tp, m in _drain(c, set(want), timeout, lambda tp, m: False):
                last.setdefault(tp, m.timestamp)
                c.pause(tp)
            c.resume(*want)
            found = c.offsets_for_times({tp: max(0, int(ts - window_s * 1000)) for tp, ts in last.items()})
            for tp in list(want):
                hit = found.get(tp)
                start = max(hit.offset if hit is not None else begin[tp], begin[tp])
                if start >= want[tp]:
                    del want[tp]
                else:
                    c.seek(tp, start)
            for tp, m in _drain(c, set(want), timeout, lambda tp, m: m.offset < want[tp] - 1):
                if m.offset < want[tp]:
                    yield _record(tp, m)
        except KafkaError as exc:
            raise BusError(f"Kafka history read failed: {exc}") from exc
        finally:
            if c is not None:
                c.close(autocommit=False)


def _record(tp: Any, m: Any) -> Record:
    key = m.key.decode(errors="replace") if m.key is not None else None
    ts = m.timestamp / 1000.0 if m.timestamp and m.timestamp > 0 else None
    return Record(tp.topic, tp.partition, m.offset, key, m.value or b"", ts, tuple(m.headers or ()))


def _drain(c: Any, left: set[Any], timeout: float, more: Any) -> Iterator[tuple[Any, Any]]:
    """Yield (tp, message) until, for every partition in ``left``, ``more(tp, m)`` turned false
    (that message is yielded, then the partition is paused). BusError when no record arrives for
    ``timeout`` seconds."""
    quiet_since = time.monotonic()
    while left:
        batches = c.poll(timeout_ms=500, max_records=5000)
        if not batches and time.monotonic() - quiet_since > timeout:
            raise BusError(f"Kafka history read: no record for {timeout:.0f} s from {sorted(map(tuple, left))}")
        for tp, msgs in batches.items():
            if tp not in left:
                continue
            quiet_since = time.monotonic()
            for m in msgs:
                yield tp, m
                if not more(tp, m):
                    left.discard(tp)
                    c.pause(tp)
                    break


def _listener(adapter: KafkaConsumerAdapter) -> Any:
    from kafka import ConsumerRebalanceListener

    class Listener(ConsumerRebalanceListener):
        """Runs on kafka-python's IO loop: only queue the change; the worker applies it after poll."""

        def on_partitions_revoked(self, revoked: Any) -> None:
            adapter._events.append(("revoked", frozenset((tp.topic, tp.partition) for tp in revoked)))

        def on_partitions_assigned(self, assigned: Any) -> None:
            adapter._events.append(("assigned", frozenset((tp.topic, tp.partition) for tp in assigned)))

        def on_partitions_lost(self, lost: Any) -> None:
            adapter._events.append(("revoked", frozenset((tp.topic, tp.partition) for tp in lost)))

    return Listener()


def ensure_topics(bootstrap: str, topics: Sequence[str], partitions: int = 8, *, ready_s: float = 30.0) -> None:
    """Create topics that do not exist yet (idempotent), then wait up to ``ready_s`` seconds until
    every partition of each of ``topics`` has a leader: until then a topic just created (or one on a
    broker just started) answers produce requests with NotLeaderForPartition. BusError if one
    still has none."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap.split(","), client_id="fleethealth-admin")
    try:
        existing = set(admin.list_topics())
        new = [NewTopic(t, partitions, 1) for t in topics if t not in existing]
        if new:
            try:
                admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass
        end = time.monotonic() + ready_s
        while waiting := _leaderless(admin, topics):
            if time.monotonic() > end:
                raise BusError(f"Kafka at {bootstrap}: no leader after {ready_s:.0f} s for {', '.join(waiting[:5])}")
            time.sleep(0.1)
    finally:
        admin.close()


def _leaderless(admin: Any, topics: Sequence[str]) -> list[str]:
    """Those of ``topics`` whose metadata lacks the topic or a leader for one of its partitions
    (kafka-python 3 names the fields ``name``/``leader_id``, 2.x ``topic``/``leader``)."""
    if not topics:
        return []
    ready = {t.get("name", t.get("topic")) for t in admin.describe_topics(list(topics))
             if t["error_code"] == 0 and t["partitions"]
             and all(p["error_code"] == 0 and p.get("leader_id", p.get("leader", -1)) >= 0 for p in t["partitions"])}
    return [t for t in topics if t not in ready]


def delete_topics(bootstrap: str, topics: Sequence[str]) -> None:
    """Delete topics (those that do not exist are ignored): benchmarks and tests clean up after themselves."""
    from kafka.admin import KafkaAdminClient
    from kafka.errors import KafkaError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap.split(","), client_id="fleethealth-admin")
    try:
        gone = set(topics) & set(admin.list_topics())
        if gone:
            try:
                admin.delete_topics(sorted(gone))
            except KafkaError as exc:
                log.warning("could not delete topics %s: %s", sorted(gone), exc)
    finally:
        admin.close()


class KafkaOffsets:
    """Topic end offsets and consumer-group commits, read without joining any group: messages ever
    published per topic (the sum of end offsets) and each group's lag, for pipeline dashboards."""

    def __init__(self, bus: KafkaBus) -> None:
        self.bus = bus
        self._consumer: Any = None
        self._admin: Any = None

    def _clients(self) -> tuple[Any, Any]:
        from kafka import KafkaAdminClient, KafkaConsumer

        if self._consumer is None:
            args = dict(bootstrap_servers=self.bus.bootstrap.split(","), client_id=f"{self.bus.client_id}-offsets",
                        **self.bus._security)
            self._consumer = KafkaConsumer(group_id=None, enable_auto_commit=False, **args)
            self._admin = KafkaAdminClient(**args)
        return self._consumer, self._admin

    def ends(self, topics: Sequence[str]) -> dict[tuple[str, int], tuple[int, int]]:
        """(topic, partition) -> (beginning offset, end offset); topics that do not exist are left out."""
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        try:
            c, _ = self._clients()
            tps = [TopicPartition(t, p) for t in topics for p in sorted(c.partitions_for_topic(t) or ())]
            if not tps:
                return {}
            begins, ends = c.beginning_offsets(tps), c.end_offsets(tps)
        except KafkaError as exc:
            raise BusError(f"Kafka offsets at {self.bus.bootstrap}: {exc}") from exc
        return {(tp.topic, tp.partition): (begins[tp], ends[tp]) for tp in tps}

    def committed(self, group: str) -> dict[tuple[str, int], int]:
        """(topic, partition) -> the group's committed offset ({} for a group that never committed)."""
        from kafka.errors import KafkaError

        try:
            _, admin = self._clients()
            if hasattr(admin, "list_group_offsets"):  # kafka-python 3.x
                got = admin.list_group_offsets({group: None}).get(group, {})
            else:  # kafka-python 2.x
                got = admin.list_consumer_group_offsets(group)
        except KafkaError as exc:
            raise BusError(f"Kafka offsets of group {group!r} at {self.bus.bootstrap}: {exc}") from exc
        return {(tp.topic, tp.partition): om.offset for tp, om in got.items() if om.offset is not None and om.offset >= 0}

    def close(self) -> None:
        for c in (self._consumer, self._admin):
            if c is not None:
                c.close()
        self._consumer = self._admin = None


class KafkaTopicReader:
    """Every partition of ``topics`` from the oldest retained message, outside any consumer group
    (nothing committed; partitions that appear later are picked up from their start). For services
    that fold a whole small topic into state at every start (``fleethealth fleet-metrics``)."""

    def __init__(self, bus: KafkaBus, topics: Sequence[str], recheck_s: float = 10.0) -> None:
        from kafka import KafkaConsumer

        self.topics, self.recheck_s = list(topics), recheck_s
        self._c = KafkaConsumer(bootstrap_servers=bus.bootstrap.split(","), client_id=f"{bus.client_id}-reader",
                                group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                                metadata_max_age_ms=int(recheck_s * 1000), **bus._security)
        self._assigned: set[Any] = set()
        self._checked = float("-inf")

    def _assign(self) -> None:
        from kafka import TopicPartition

        self._checked = time.monotonic()
        want = {TopicPartition(t, p) for t in self.topics for p in (self._c.partitions_for_topic(t) or ())}
        new = want - self._assigned
        if new:
            self._c.assign(sorted(want))
            self._c.seek_to_beginning(*new)
            self._assigned = want

    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[Record]:
        from kafka.errors import KafkaError

        try:
            if time.monotonic() - self._checked >= self.recheck_s or not self._assigned:
                self._assign()
            if not self._assigned:
                time.sleep(timeout)
                return []
            batches = self._c.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        except KafkaError as exc:
            raise BusError(f"Kafka read of {self.topics}: {exc}") from exc
        return [_record(tp, m) for tp, msgs in batches.items() for m in msgs]

    def commit(self) -> None:
        return None  # group-less: the position lives only in this process

    def close(self) -> None:
        self._c.close()
