"""Collector-style per-host metrics for a whole fleet, from the newest sample of each host.

``fleethealth run`` replays or simulates many hosts in one process; this collector lets Prometheus
scrape them as if every host's collector exporter were up. It reuses the collector's own catalogue
(``collectors/metrics.tsv``) and its per-sample rendering (``collectors.exporter.SampleMetrics``),
one per host, merged into one family per metric — so names, labels and help are exactly those of
``fleethealth collect``. Collector-scope values (spool depth, samples) are what an in-process
source has: nothing spooled, every sample delivered.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fleethealth.schema import Sample


class FleetSampleExporter:
    """A prometheus-client collector over one ``SampleMetrics`` per host (thread-safe)."""

    def __init__(self) -> None:
        from collectors.exporter import load_catalog

        self.specs = load_catalog()
        self._hosts: dict[str, Any] = {}
        self._stats: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def observe(self, s: Sample) -> None:
        from collectors.exporter import SampleMetrics

        with self._lock:
            sm = self._hosts.get(s.host)
            if sm is None:
                st = self._stats[s.host] = {"polls": 0, "samples_sent": 0, "spool_depth": 0, "spool_dropped": 0,
                                            "last_sample_ts": 0.0, "last_poll_seconds": 0.0,
                                            "source_errors": {}}
                sm = self._hosts[s.host] = SampleMetrics(self.specs, stats_fn=lambda st=st: st)
            st = self._stats[s.host]
            st["polls"] += 1
            st["samples_sent"] += 1
            st["last_sample_ts"] = s.ts
            for e in s.source_errors:
                st["source_errors"][e.source] = st["source_errors"].get(e.source, 0) + 1
        sm.update(s)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            hosts = [self._hosts[h] for h in sorted(self._hosts)]
        for spec in self.specs:
            cls = CounterMetricFamily if spec.type == "counter" else GaugeMetricFamily
            fam = cls(spec.metric, spec.help, labels=list(spec.labels))
            for sm in hosts:
                with sm._lock:
                    rows = list(sm.rows(spec))
                for labels, v in rows:
                    fam.add_metric(list(labels), v)
            yield fam
