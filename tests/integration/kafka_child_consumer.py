"""A consumer process for the kill-mid-stream test: consume, record, commit after each batch.

Usage: python -m tests.integration.kafka_child_consumer BOOTSTRAP TOPIC GROUP OUTFILE [CLIENT]
Each processed record is appended to OUTFILE as "host seq" and fsync'd *before* the commit, the
order a real worker uses (process, then commit), so a kill between the two re-delivers, never loses.
"""

from __future__ import annotations

import os
import sys

from fleethealth.config import kafka_bus
from fleethealth.schema import decode_sample


def main() -> None:
    bootstrap, topic, group, out = sys.argv[1:5]
    client = sys.argv[5] if len(sys.argv) > 5 else None
    # short session so the group notices the kill quickly (the broker's minimum is 6 s)
    consumer = kafka_bus(bootstrap, client).consumer([topic], group, session_timeout_ms=6000, heartbeat_interval_ms=1000)
    with open(out, "a") as fh:
        while True:
            batch = consumer.poll(timeout=1.0, max_records=50)
            for rec in batch:
                s = decode_sample(rec.value)
                fh.write(f"{s.host} {s.seq}\n")
            fh.flush()
            os.fsync(fh.fileno())
            if batch:
                consumer.commit()


if __name__ == "__main__":
    main()
