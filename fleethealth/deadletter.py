"""Decode a batch of bus records; send what breaks the contract to ``fleet.deadletter.v1``.

Every consumer (detectors, remediation, tests) uses this so a malformed message never crashes a
worker and is never silently lost: it lands on the dead-letter topic with the reason and the
source position, and the caller's counter goes up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from fleethealth.bus import DEADLETTER, Bus, Record
from fleethealth.schema import ContractError, DeadLetter, encode

T = TypeVar("T")
log = logging.getLogger(__name__)
EXCERPT_BYTES = 512


def dead_letter_for(rec: Record, reason: str, consumer: str, now: float | None = None) -> DeadLetter:
    return DeadLetter(
        source_topic=rec.topic,
        partition=rec.partition,
        offset=rec.offset,
        key=rec.key[:256] if rec.key else None,
        reason=reason[:4000],
        consumer=consumer,
        ts=time.time() if now is None else now,
        payload_excerpt=repr(bytes(rec.value[:EXCERPT_BYTES]))[:4000],
        payload_size=len(rec.value),
    )


def decode_batch(
    records: Iterable[Record],
    decode: Callable[[bytes], T],
    bus: Bus,
    consumer: str,
    *,
    topic: str = DEADLETTER,
) -> tuple[list[tuple[Record, T]], int]:
    """Return (decoded, dead-lettered count). Decoding errors of any kind are caught per record."""
    good: list[tuple[Record, T]] = []
    bad = 0
    for rec in records:
        try:
            good.append((rec, decode(rec.value)))
        except ContractError as exc:
            reason = str(exc)
        except Exception as exc:  # a decoder bug must not stop the worker either
            reason = f"decoder failure: {type(exc).__name__}: {exc}"
        else:
            continue
        bad += 1
        log.warning("dead-lettered message", extra={"topic": rec.topic, "partition": rec.partition,
                                                    "offset": rec.offset, "reason": reason[:300]})
        bus.publish(topic, rec.key, encode(dead_letter_for(rec, reason, consumer)))
    return good, bad
