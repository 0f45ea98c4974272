"""Dead letters (``fleet.deadletter.v1``): the one builder every consumer uses.

The detect worker, the remediation worker and ``fleethealth replay`` build their dead letters with
:func:`dead_letter` / :func:`dead_letter_for`, so the bounds are the same everywhere and a letter
always fits its own contract (``Text`` is at most 8192 characters; an oversized key or reason is
cut). The decode-or-dead-letter loops are the workers' own (with their counters and delivery).
"""

from __future__ import annotations

import time

from fleethealth.bus import Record
from fleethealth.schema import DeadLetter

EXCERPT_BYTES = 512  # payload bytes kept (as repr text: at most 4 characters a byte)
REASON_CHARS = 4000
KEY_CHARS = 256


def dead_letter(value: bytes, reason: str, consumer: str, ts: float, *, source_topic: str,
                partition: int | None = None, offset: int | None = None, key: str | None = None) -> DeadLetter:
    """A dead letter for ``value`` (the undecodable payload), bounded to fit the contract."""
    return DeadLetter(
        source_topic=source_topic[:256],
        partition=partition,
        offset=offset,
        key=key[:KEY_CHARS] if key else None,
        reason=reason[:REASON_CHARS],
        consumer=consumer[:256],
        ts=ts,
        payload_excerpt=repr(bytes(value[:EXCERPT_BYTES]))[:4 * EXCERPT_BYTES + 3],
        payload_size=len(value),
    )


def dead_letter_for(rec: Record, reason: str, consumer: str, now: float | None = None) -> DeadLetter:
    """The dead letter of one bus record."""
    return dead_letter(rec.value, reason, consumer, time.time() if now is None else now, source_topic=rec.topic,
                       partition=rec.partition, offset=rec.offset, key=rec.key)
