"""Where samples go: stdout, a JSONL file, or Kafka. All deliver a batch in order."""

from __future__ import annotations

import socket
import sys
from typing import IO, Any

from fleethealth.bus import TELEMETRY, BusError, JsonlBus


class StdoutSink:
    def __init__(self, stream: IO[bytes] | None = None) -> None:
        self.stream = stream or sys.stdout.buffer

    def send_batch(self, records: list[tuple[str, bytes]]) -> int:
        for _key, value in records:
            self.stream.write(value + b"\n")
        self.stream.flush()
        return len(records)

    def close(self) -> None:
        self.stream.flush()


class JsonlSink:
    def __init__(self, path: str, topic: str = TELEMETRY) -> None:
        self.bus = JsonlBus(path)
        self.topic = topic

    def send_batch(self, records: list[tuple[str, bytes]]) -> int:
        for key, value in records:
            self.bus.publish(self.topic, key, value)
        self.bus.flush()
        return len(records)

    def close(self) -> None:
        self.bus.close()


class KafkaSink:
    """Sends a batch, then waits for every ack; the count returned is the acked prefix.

    ``security`` is the ``[kafka].security`` table (SASL/TLS, as every other client uses it);
    ``identity_key`` (this host's key, ``fleethealth identity-key HOST``) signs each record in the
    ``fh-sig`` header, so the detect worker can tell it came from this host (fleethealth.identity)."""

    def __init__(self, bootstrap: str, topic: str = TELEMETRY, *, ack_timeout: float = 20.0,
                 identity_key: bytes | None = None, client_id: str = "fleethealth-collector", **kw: Any) -> None:
        from fleethealth.kafka_bus import KafkaBus

        self.bus = KafkaBus(bootstrap, client_id=client_id, request_timeout_ms=10000, max_block_ms=5000, **kw)
        self.topic = topic
        self.ack_timeout = ack_timeout
        self.identity_key = identity_key

    def send_batch(self, records: list[tuple[str, bytes]]) -> int:
        from kafka.errors import KafkaError

        from fleethealth.identity import HEADER, sign

        key = self.identity_key
        try:
            producer = self.bus.producer
            futures = [producer.send(self.topic, key=k.encode(), value=v,
                                     headers=[(HEADER, sign(key, k, v))] if key else None) for k, v in records]
            producer.flush(self.ack_timeout)
        except KafkaError as exc:
            self.bus.reset_producer()
            raise BusError(f"Kafka send to {self.topic} failed: {exc}") from exc
        done = 0
        for f in futures:
            try:
                f.get(0.01 if f.is_done else self.ack_timeout)
            except KafkaError:
                break
            done += 1
        if done < len(futures):
            # the rest is re-sent from the spool; a fresh producer, because one that timed out
            # across a broker restart can stay stuck (every later batch timed out with the broker up)
            self.bus.reset_producer()
        return done

    def reachable(self, timeout: float = 1.0) -> bool:
        """Whether a TCP connection to some bootstrap address opens: the stop drain waits on a
        reachable broker and gives up quickly on one that is down."""
        for addr in self.bus.bootstrap.split(","):
            host, _, port = addr.strip().rpartition(":")
            try:
                with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout):
                    return True
            except (OSError, ValueError):
                continue
        return False

    def close(self) -> None:
        try:
            self.bus.close()
        except Exception:  # noqa: BLE001
            pass
