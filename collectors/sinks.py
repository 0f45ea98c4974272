"""Where samples go: stdout, a JSONL file, or Kafka. All deliver a batch in order.

Each sink says which encoding it wants new samples in (``wire``): JSON for stdout and JSONL (read
by people and by ``replay``), msgpack on Kafka unless ``--kafka-wire json`` / ``[kafka].wire`` says
otherwise. A record spooled under another sink keeps its bytes: Kafka takes either (the consumer
tells them apart by the bytes), and the JSON sinks write a msgpack record out as JSON."""

from __future__ import annotations

import logging
import socket
import sys
from typing import IO, Any

from fleethealth.bus import TELEMETRY, BusError, JsonlBus
from fleethealth.schema import ContractError, as_json

log = logging.getLogger(__name__)


def _json_records(records: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """The batch as JSON (a msgpack record spooled while the sink was Kafka, transcoded); a record
    that cannot be is dropped with a warning, not written as bytes no JSONL reader takes."""
    out = []
    for k, v in records:
        try:
            out.append((k, as_json(v)))
        except ContractError as exc:
            log.warning("dropping a spooled record that is not JSON or msgpack", extra={"error": str(exc)})
    return out


class StdoutSink:
    wire = "json"

    def __init__(self, stream: IO[bytes] | None = None) -> None:
        self.stream = stream or sys.stdout.buffer

    def send_batch(self, records: list[tuple[str, bytes]]) -> int:
        for _key, value in _json_records(records):
            self.stream.write(value + b"\n")
        self.stream.flush()
        return len(records)

    def close(self) -> None:
        self.stream.flush()


class JsonlSink:
    wire = "json"

    def __init__(self, path: str, topic: str = TELEMETRY) -> None:
        self.bus = JsonlBus(path)
        self.topic = topic

    def send_batch(self, records: list[tuple[str, bytes]]) -> int:
        for key, value in _json_records(records):
            self.bus.publish(self.topic, key, value)
        self.bus.flush()
        return len(records)

    def close(self) -> None:
        self.bus.close()


class KafkaSink:
    """Sends a batch, then waits for every ack; the count returned is the acked prefix.

    ``security`` is the ``[kafka].security`` table (SASL/TLS, as every other client uses it);
    ``identity_key`` (this host's key, ``fleethealth identity-key HOST``) signs each record in the
    ``fh-sig`` header, so the detect worker can tell it came from this host (fleethealth.identity).
    ``wire`` is the encoding new samples are spooled in (:func:`fleethealth.config.kafka_wire`);
    what is already spooled is sent as it was written (no header names the format)."""

    def __init__(self, bootstrap: str, topic: str = TELEMETRY, *, ack_timeout: float = 20.0,
                 identity_key: bytes | None = None, client_id: str = "fleethealth-collector",
                 client: str | None = None, wire: str | None = None, **kw: Any) -> None:
        from fleethealth.config import DEFAULT_KAFKA_WIRE, kafka_bus

        self.bus = kafka_bus(bootstrap, client, client_id=client_id, request_timeout_ms=10000, max_block_ms=5000, **kw)
        self.topic = topic
        self.ack_timeout = ack_timeout
        self.identity_key = identity_key
        self.wire = wire or DEFAULT_KAFKA_WIRE

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
