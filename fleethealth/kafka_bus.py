"""Kafka implementation of the bus (kafka-python).

Producer: keyed by host, ``acks=all``, compression, retries, bounded in-flight so retries keep
per-partition order. Consumer: a consumer group with auto-commit off; :meth:`KafkaConsumerAdapter.commit`
commits only what the caller has processed (call it after a batch). Security settings (SASL/SSL)
pass straight through from config.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fleethealth.bus import BusError, Record

log = logging.getLogger(__name__)

# kafka-python option names that may come from config, passed through unchanged.
SECURITY_KEYS = (
    "security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
    "sasl_kerberos_service_name", "sasl_oauth_token_provider", "ssl_cafile", "ssl_certfile",
    "ssl_keyfile", "ssl_password", "ssl_check_hostname", "ssl_crlfile",
)


def _security(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    extra = dict(extra or {})
    unknown = set(extra) - set(SECURITY_KEYS)
    if unknown:
        raise BusError(f"unknown Kafka security option(s): {', '.join(sorted(unknown))}")
    return extra


class KafkaBus:
    def __init__(
        self,
        bootstrap: str = "127.0.0.1:9092",
        *,
        client_id: str = "fleethealth",
        compression: str | None = "gzip",
        security: Mapping[str, Any] | None = None,
        request_timeout_ms: int = 15000,
        max_block_ms: int = 10000,
        linger_ms: int = 5,
    ) -> None:
        self.bootstrap = bootstrap
        self.client_id = client_id
        self._security = _security(security)
        self._producer_args = dict(
            bootstrap_servers=bootstrap.split(","),
            client_id=client_id,
            acks="all",
            compression_type=compression,
            retries=10,
            max_in_flight_requests_per_connection=1,  # retries must not reorder a host's samples
            linger_ms=linger_ms,
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

    def publish(self, topic: str, key: str | None, value: bytes) -> None:
        from kafka.errors import KafkaError

        try:
            self.producer.send(topic, key=key.encode() if key else None, value=value)
        except KafkaError as exc:
            raise BusError(f"Kafka send to {topic} failed: {exc}") from exc

    def publish_sync(self, topic: str, key: str | None, value: bytes, timeout: float = 10.0) -> Any:
        """Send one message and wait for the broker's ack (used by the collector's spool drain)."""
        from kafka.errors import KafkaError

        try:
            return self.producer.send(topic, key=key.encode() if key else None, value=value).get(timeout)
        except KafkaError as exc:
            raise BusError(f"Kafka send to {topic} failed: {exc}") from exc

    def flush(self, timeout: float | None = None) -> None:
        from kafka.errors import KafkaError

        if self._producer is not None:
            try:
                self._producer.flush(timeout)
            except KafkaError as exc:
                raise BusError(f"Kafka flush failed: {exc}") from exc

    def consumer(
        self, topics: Sequence[str], group: str, *, auto_offset_reset: str = "earliest", **kwargs: Any
    ) -> KafkaConsumerAdapter:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        try:
            c = KafkaConsumer(
                *topics,
                bootstrap_servers=self.bootstrap.split(","),
                client_id=self.client_id,
                group_id=group,
                enable_auto_commit=False,
                auto_offset_reset=auto_offset_reset,
                **self._security,
                **kwargs,
            )
        except KafkaError as exc:
            raise BusError(f"cannot join group {group!r} at {self.bootstrap}: {exc}") from exc
        return KafkaConsumerAdapter(c)

    def close(self) -> None:
        if self._producer is not None:
            try:
                self._producer.flush(10)
                self._producer.close(10)
            finally:
                self._producer = None


class KafkaConsumerAdapter:
    def __init__(self, consumer: Any) -> None:
        self._c = consumer

    @property
    def raw(self) -> Any:
        return self._c

    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[Record]:
        batches = self._c.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        out: list[Record] = []
        for tp, msgs in batches.items():
            for m in msgs:
                key = m.key.decode(errors="replace") if m.key is not None else None
                ts = m.timestamp / 1000.0 if m.timestamp and m.timestamp > 0 else None
                out.append(Record(tp.topic, tp.partition, m.offset, key, m.value or b"", ts))
        return out

    def commit(self) -> None:
        self._c.commit()

    def close(self) -> None:
        self._c.close()


def ensure_topics(bootstrap: str, topics: Sequence[str], partitions: int = 8) -> None:
    """Create topics that do not exist yet (idempotent)."""
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
    finally:
        admin.close()
