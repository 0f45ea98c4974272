"""Wait for the local Kafka broker to answer a metadata request, then make sure fleethealth's topics exist.

Used by scripts/services.sh (run with the project's .venv, which has kafka-python):

    python scripts/kafka_topics.py --bootstrap 127.0.0.1:9092 --timeout 90

Exit 0 once every topic is listed in the broker's metadata; 1 on timeout.
"""

from __future__ import annotations

import argparse
import sys
import time

TOPICS = ("fleet.telemetry.v1", "fleet.incidents.v1", "fleet.actions.v1", "fleet.deadletter.v1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()

    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import KafkaConfigurationError, KafkaError, TopicAlreadyExistsError

    deadline = time.monotonic() + args.timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        admin = None
        try:
            admin = KafkaAdminClient(
                bootstrap_servers=args.bootstrap,
                client_id="fleethealth-services",
                request_timeout_ms=5000,
            )
            existing = set(admin.list_topics())
            missing = [t for t in TOPICS if t not in existing]
            if missing:
                try:
                    admin.create_topics(
                        [NewTopic(t, num_partitions=args.partitions, replication_factor=1) for t in missing]
                    )
                except TopicAlreadyExistsError:
                    pass
                existing = set(admin.list_topics())
            if all(t in existing for t in TOPICS):
                print("kafka: topics ready: " + ", ".join(TOPICS))
                return 0
        except KafkaConfigurationError:
            raise
        except (KafkaError, OSError) as exc:  # broker still starting
            last_error = exc
        finally:
            if admin is not None:
                admin.close()
        time.sleep(0.5)
    print(f"kafka: broker at {args.bootstrap} did not answer in {args.timeout:.0f}s: {last_error!r}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
