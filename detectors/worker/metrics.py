"""Prometheus metrics of the detect worker (``--metrics-port``, default 9401, bound to 127.0.0.1).

fleethealth_detect_samples_total                      samples fed to the engine
fleethealth_detect_samples_dropped_total{reason}      duplicates / out-of-order samples (by seq)
fleethealth_detect_incidents_total{failure_mode,state}
fleethealth_detect_dead_letters_total{reason}
fleethealth_detect_last_sample_age_seconds{host}      fleet time minus the host's last sample time
fleethealth_detect_open_episodes{failure_mode}
fleethealth_detect_consumer_lag{partition}            Kafka only: end offset minus position
fleethealth_detect_batch_seconds                      histogram: poll-to-commit time of one batch
fleethealth_detect_publish_retries_total              publish+flush attempts that the bus did not acknowledge
fleethealth_detect_rebuilt_samples_total              samples re-fed silently to rebuild state after an assignment
fleethealth_detect_rebuilds_total                     partitions whose host state was rebuilt from the stream
fleethealth_detect_clock_skew_total{direction}        samples stamped past --max-clock-skew ahead of receive
                                                      time (corrected to it) or --max-lateness behind (counted)
fleethealth_detect_seq_restarts_total                 a host's seq went back with newer time (its count restarted)
fleethealth_detect_hosts                              hosts this worker keeps state for (bounded by --max-hosts)
fleethealth_detect_hosts_evicted_total                silent hosts dropped to make room under --max-hosts
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client import Counter as PCounter
from prometheus_client.core import GaugeMetricFamily

from fleethealth.schema import Incident


class DetectMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.samples = PCounter("fleethealth_detect_samples", "samples fed to the detector engine", registry=r)
        self.incidents = PCounter("fleethealth_detect_incidents", "incidents published",
                                  ["failure_mode", "state"], registry=r)
        self.dead = PCounter("fleethealth_detect_dead_letters", "messages sent to the dead-letter topic",
                             ["reason"], registry=r)
        self.batch_s = Histogram("fleethealth_detect_batch_seconds", "poll-to-commit time of one batch",
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.publish_retries = PCounter("fleethealth_detect_publish_retries",
                                        "publish+flush attempts that the bus did not acknowledge", registry=r)
        self.rebuilt_samples = PCounter("fleethealth_detect_rebuilt_samples",
                                        "samples re-fed silently to rebuild host state after a partition assignment",
                                        registry=r)
        self.rebuilds = PCounter("fleethealth_detect_rebuilds", "partitions whose host state was rebuilt",
                                 registry=r)
        self.clock_skew = PCounter("fleethealth_detect_clock_skew",
                                   "samples stamped far from receive time (ahead: corrected; behind: counted)",
                                   ["direction"], registry=r)
        self.seq_restarts = PCounter("fleethealth_detect_seq_restarts",
                                     "a host's seq went back with newer time (its count restarted)", registry=r)
        self.hosts_evicted = PCounter("fleethealth_detect_hosts_evicted",
                                      "silent hosts dropped to make room under --max-hosts", registry=r)
        self._restarts_seen = 0
        self._engine: Any = None
        self._consumer: Any = None
        self._lag: dict[int, int] = {}
        self._lag_at = 0.0
        self._dropped_seen: Counter[str] = Counter()
        self.dropped = PCounter("fleethealth_detect_samples_dropped", "samples skipped by seq order",
                                ["reason"], registry=r)
        r.register(_Live(self))

    def fed(self, n: int) -> None:
        """``n`` samples of a batch were fed (once a batch: a Prometheus counter's inc takes a lock,
        1-2 us, which per sample was about a tenth of the worker's own cost)."""
        self.samples.inc(n)

    def incident(self, inc: Incident) -> None:
        self.incidents.labels(inc.failure_mode, inc.state).inc()

    def dead_letter(self, reason: str) -> None:
        self.dead.labels(reason).inc()

    def batch(self, n: int, seconds: float, engine: Any, consumer: Any) -> None:
        self.batch_s.observe(seconds)
        self._engine, self._consumer = engine, consumer
        for reason in ("duplicate", "out_of_order"):
            new = engine.stats.get(reason, 0) - self._dropped_seen[reason]
            if new > 0:
                self.dropped.labels(reason).inc(new)
                self._dropped_seen[reason] += new
        restarts = engine.stats.get("seq_restart", 0)
        if restarts > self._restarts_seen:
            self.seq_restarts.inc(restarts - self._restarts_seen)
            self._restarts_seen = restarts
        if time.monotonic() - self._lag_at > 10:
            self._lag_at = time.monotonic()
            self._lag = consumer_lag(consumer)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        start_http_server(port, addr=addr, registry=self.registry)


def consumer_lag(consumer: Any) -> dict[int, int]:
    """Per-partition lag for a Kafka consumer (``raw`` is kafka-python's KafkaConsumer); {} otherwise."""
    raw = getattr(consumer, "raw", None)
    if raw is None:
        return {}
    try:
        parts = raw.assignment()
        ends = raw.end_offsets(list(parts))
        return {tp.partition: max(0, ends[tp] - raw.position(tp)) for tp in parts}
    except Exception:  # lag is advisory: a metadata hiccup must not stop the worker
        return {}


class _Live:
    """Gauges computed at scrape time from the engine (bounded by the hosts this worker owns)."""

    def __init__(self, m: DetectMetrics) -> None:
        self.m = m

    def collect(self) -> Any:
        eng = self.m._engine
        age = GaugeMetricFamily("fleethealth_detect_last_sample_age_seconds",
                                "fleet time minus the host's last sample time", labels=["host"])
        opened = GaugeMetricFamily("fleethealth_detect_open_episodes", "open incident episodes",
                                   labels=["failure_mode"])
        lag = GaugeMetricFamily("fleethealth_detect_consumer_lag", "messages behind the end of the partition",
                                labels=["partition"])
        hosts = GaugeMetricFamily("fleethealth_detect_hosts", "hosts this worker keeps state for",
                                  value=len(eng.hosts) if eng is not None else 0)
        if eng is not None:
            for host, st in sorted(eng.hosts.items()):
                age.add_metric([host], max(0.0, eng.fleet_ts - st.last_ts))
            by_mode = Counter(k[2] for k in eng.episodes.open)
            for mode, n in sorted(by_mode.items()):
                opened.add_metric([mode], n)
        for p, n in sorted(self.m._lag.items()):
            lag.add_metric([str(p)], n)
        yield hosts
        yield age
        yield opened
        yield lag
