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
                 identity_key: bytes | None = None, client_id: str = "fleethealth-collector",
                 client: str | None = None, **kw: Any) -> None:
        from fleethealth.config import kafka_bus

        self.bus = kafka_bus(bootstrap, client, client_id=client_id, request_timeout_ms=10000, max_block_ms=5000, **kw)
        self.topic = topic
        self.ack_timeout = ack_timeout
        self.identity_key = identity_key

    def send_batch(self, records: list[tuple[str, bytes]]) -> int:
        from fleethealth.identity import HEADER, sign

        key = self.identity_key
        acks = []
        err: BusError | None = None
        try:
            for k, v in records:
                acks.append(self.bus.publish(self.topic, k, v, ((HEADER, sign(key, k, v)),) if key else ()))
            self.bus.flush(self.ack_timeout)
        except BusError as exc:
            err = exc
        done = 0
        for a in acks:  # the acknowledged prefix: a record after a failed one is re-sent from the spool
            if not (a.is_done and a.succeeded()):
                break
            done += 1
        if done < len(records):
            # the rest is re-sent from the spool; a fresh producer, because one that timed out
            # across a broker restart can stay stuck (every later batch timed out with the broker up)
            self.bus.reset_producer()
            if err is not None and not done:
                raise err
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
