"""Fleet-level metrics derived from what flows on the bus, for dashboards.

:class:`FleetState` is pure: it takes samples, incidents and actions (contract values) and answers
"which hosts are healthy, suspect, drained, in repair; what is open; how old are the tickets".
:class:`FleetStateCollector` is a prometheus-client collector that reads it at scrape time, so
the exported numbers are never older than the last message. :class:`CountingBus` wraps any bus to
count messages per topic (throughput, dead letters) without touching the parts that publish.

Actions, drained / queued nodes, tickets by age and guard refusals are the remediation worker's own
metrics (``remediation/metrics.py``); FleetState folds actions only to tell host states apart.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fleethealth import metrics_names as m
from fleethealth.bus import ACTIONS, DEADLETTER, INCIDENTS, TELEMETRY, Bus, Consumer, Headers
from fleethealth.schema import ActionRecord, Incident, Sample, decode_action, decode_incident

DRAIN_OUTCOMES = {"done": "live", "dry_run": "dry_run"}


@dataclass
class _Host:
    rack: str = ""
    last_ts: float = 0.0
    received_at: float = 0.0


@dataclass
class FleetState:
    """Everything the fleet dashboards need, folded from the three topics. Thread-safe."""

    stale_after_s: float = m.STALE_AFTER_S
    hosts: dict[str, _Host] = field(default_factory=dict)
    open_incidents: dict[str, Incident] = field(default_factory=dict)
    incident_messages: Counter[tuple[str, str]] = field(default_factory=Counter)
    drained: dict[str, str] = field(default_factory=dict)  # host -> live | dry_run
    queued: set[str] = field(default_factory=set)
    tickets: dict[str, tuple[str, float]] = field(default_factory=dict)  # incident id -> (host, opened)
    stream_ts: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # ---------------------------------------------------------------- folding
    def observe_sample(self, s: Sample, received_at: float) -> None:
        self.observe_host(s.host, s.rack, s.ts, received_at)

    def observe_host(self, host: str, rack: str, ts: float, received_at: float) -> None:
        """A sample of ``host`` taken at ``ts`` arrived at ``received_at`` (what a sample tells FleetState)."""
        with self._lock:
            h = self.hosts.setdefault(host, _Host())
            h.rack = rack or h.rack
            h.last_ts = max(h.last_ts, ts)
            h.received_at = max(h.received_at, received_at)
            self.stream_ts = max(self.stream_ts, ts)

    def observe_message(self, topic: str, value: bytes, *, incidents: str = INCIDENTS,
                        actions: str = ACTIONS) -> Incident | ActionRecord | None:
        """Fold one incidents / actions bus message (``ContractError`` when it does not decode); the
        one entry point for ``fleethealth run`` and ``fleethealth fleet-metrics``. Other topics: None."""
        if topic == incidents:
            inc = decode_incident(value)
            self.observe_incident(inc)
            return inc
        if topic == actions:
            act = decode_action(value)
            self.observe_action(act)
            return act
        return None

    def observe_incident(self, inc: Incident) -> None:
        with self._lock:
            self.incident_messages[(inc.failure_mode, inc.state)] += 1
            self.hosts.setdefault(inc.host, _Host(rack=inc.rack))
            if inc.state == "resolved":
                self.open_incidents.pop(inc.id, None)
            else:
                self.open_incidents[inc.id] = inc

    def observe_action(self, a: ActionRecord) -> None:
        with self._lock:
            if a.kind == "drain" and a.outcome in DRAIN_OUTCOMES:
                self.drained[a.host] = DRAIN_OUTCOMES[a.outcome]
                self.queued.discard(a.host)
            elif a.kind == "drain" and a.outcome == "queued" or a.kind == "queued":
                self.queued.add(a.host)
            elif a.kind == "resume" and a.outcome in DRAIN_OUTCOMES:
                self.drained.pop(a.host, None)
            elif a.kind == "ticket_opened" and a.outcome in ("done", "dry_run"):
                self.tickets.setdefault(a.incident_id, (a.host, a.ts))

    def close_ticket(self, incident_id: str) -> None:
        with self._lock:
            self.tickets.pop(incident_id, None)

    # ---------------------------------------------------------------- reading
    def host_states(self) -> dict[str, str]:
        with self._lock:
            open_hosts = {i.host for i in self.open_incidents.values()}
            ticket_hosts = {h for h, _ in self.tickets.values()}
            out = {}
            for host in self.hosts:
                if host in self.drained:
                    out[host] = "in_repair" if host in ticket_hosts else "drained"
                elif host in open_hosts or host in ticket_hosts:
                    out[host] = "suspect"
                else:
                    out[host] = "healthy"
            return out

    def sample_ages(self, now: float) -> dict[str, tuple[str, float, float]]:
        """host -> (rack, last sample ts, seconds since its last sample arrived)."""
        with self._lock:
            return {h: (v.rack, v.last_ts, max(0.0, now - v.received_at))
                    for h, v in self.hosts.items() if v.received_at}


# --------------------------------------------------------------------------- bus accounting


class CountingBus:
    """A :class:`fleethealth.bus.Bus` that counts every published message per topic."""

    def __init__(self, inner: Bus) -> None:
        self.inner = inner
        self.published: Counter[str] = Counter({TELEMETRY: 0, DEADLETTER: 0})
        self._lock = threading.Lock()

    def publish(self, topic: str, key: str | None, value: bytes, headers: Headers = ()) -> None:
        self.inner.publish(topic, key, value, headers)
        with self._lock:
            self.published[topic] += 1

    def flush(self, timeout: float | None = None) -> None:
        self.inner.flush(timeout)

    def consumer(self, topics: Sequence[str], group: str) -> Consumer:
        return self.inner.consumer(topics, group)

    def close(self) -> None:
        self.inner.close()

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.published)


# --------------------------------------------------------------------------- prometheus

LagFn = Callable[[], Iterable[tuple[str, str, int]]]  # -> (group, topic, lag)
CountsFn = Callable[[], dict[str, int]]  # -> messages published per topic (ever)


class FleetStateCollector:
    """Reads a FleetState (and optional message counts per topic / lag) at scrape time. Counts come
    from ``counts`` or, in one process, from a CountingBus; with Kafka, from topic end offsets."""

    def __init__(self, state: FleetState, bus: CountingBus | None = None, lag: LagFn | None = None,
                 clock: Callable[[], float] = time.time, counts: CountsFn | None = None,
                 topics: dict[str, str] | None = None) -> None:
        self.state, self.lag, self.clock = state, lag, clock
        self.counts = counts or (bus.counts if bus is not None else None)
        # the topic names counted as telemetry / dead letters (tests and deployments may rename them)
        self.topics = {"telemetry": TELEMETRY, "deadletter": DEADLETTER, **(topics or {})}

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: names are only known at collect time

    def collect(self) -> Iterable[Metric]:
        st = self.state
        states = st.host_states()
        g = GaugeMetricFamily(m.HOSTS, "Hosts by health state (drained includes dry-run drains).",
                              labels=["state"])
        counts = Counter(states.values())
        for s in m.HOST_STATES:
            g.add_metric([s], counts.get(s, 0))
        yield g

        with st._lock:
            open_incidents = list(st.open_incidents.values())
            messages = dict(st.incident_messages)
        g = GaugeMetricFamily(m.INCIDENTS_OPEN, "Open incident episodes.",
                              labels=["host", "rack", "failure_mode", "severity"])
        per: Counter[tuple[str, str, str, str]] = Counter(
            (i.host, i.rack, i.failure_mode, i.severity) for i in open_incidents)
        for key, n in sorted(per.items()):
            g.add_metric(list(key), n)
        yield g

        c = CounterMetricFamily(m.INCIDENT_MESSAGES, "Incident messages by failure mode and state.",
                                labels=["failure_mode", "state"])
        for (mode, state), n in sorted(messages.items()):
            c.add_metric([mode, state], n)
        yield c

        now = self.clock()
        ages = st.sample_ages(now)
        ts_g = GaugeMetricFamily(m.LAST_SAMPLE_TS, "Timestamp of the newest sample per host.",
                                 labels=["host", "rack"])
        age_g = GaugeMetricFamily(m.LAST_SAMPLE_AGE, "Seconds since the newest sample of a host arrived.",
                                  labels=["host", "rack"])
        for host, (rack, ts, age) in sorted(ages.items()):
            ts_g.add_metric([host, rack], ts)
            age_g.add_metric([host, rack], round(age, 3))
        yield ts_g
        yield age_g
        yield GaugeMetricFamily(m.STALE_HOSTS, f"Hosts silent for more than {st.stale_after_s:g} s.",
                                value=sum(1 for _, _, a in ages.values() if a > st.stale_after_s))

        if self.counts is not None:
            published = self.counts()
            c = CounterMetricFamily(m.MESSAGES, "Messages published on the bus by topic.", labels=["topic"])
            for topic, n in sorted(published.items()):
                c.add_metric([topic], n)
            yield c
            yield CounterMetricFamily(m.SAMPLES, "Telemetry samples that entered the pipeline.",
                                      value=published.get(self.topics["telemetry"], 0))
            yield CounterMetricFamily(m.DEAD_LETTERS, "Messages dead-lettered by any consumer.",
                                      value=published.get(self.topics["deadletter"], 0))
        if self.lag is not None:
            g = GaugeMetricFamily(m.CONSUMER_LAG, "Messages published but not yet committed by a group.",
                                  labels=["group", "topic"])
            for group, topic, lag in self.lag():
                g.add_metric([group, topic], lag)
            yield g
