"""``fleethealth fleet-metrics``: the fleet dashboards' series in the multi-machine deployment.

Under ``fleethealth run`` the pipeline layer folds the in-process bus into a
:class:`fleetcli.fleet_metrics.FleetState`. With Kafka, this service does the same from the
topics, in its own consumer groups, and serves the very same collector (``FleetStateCollector``):

* incidents + actions: every partition read from the oldest retained message at every start,
  outside any consumer group (``kafka_bus.KafkaTopicReader``), so host states and open incidents
  are a fold of the whole history (both topics are small); run one replica per fleet, or the
  dashboards' sums count twice;
* telemetry (group ``<group>``, committed): only each sample's host, rack and timestamp are decoded
  (a partial msgspec decode, not the whole contract), for last-sample age, stale hosts and the set
  of hosts that are healthy; a sample that does not decode is counted and skipped;
* Kafka offsets, every ``offsets_every`` seconds (not at scrape time: scrapes time out after 1 s):
  messages per topic = the sum of the topic's end offsets, and each watched group's lag =
  end offset minus its committed offset (beginning offset where a partition has no commit).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from prometheus_client.core import CounterMetricFamily, Metric

from fleetcli.fleet_metrics import FleetState, FleetStateCollector
from fleethealth.bus import ACTIONS, DEADLETTER, INCIDENTS, TELEMETRY, Bus, BusError, Consumer
from fleethealth.schema import ContractError

log = logging.getLogger("fleetcli.fleet_service")

DEFAULT_GROUP = "fleethealth-fleet-metrics"


class _Head(msgspec.Struct):
    """The three fields of a Sample this service needs; the rest of the message is skipped unparsed."""

    host: str
    ts: float
    rack: str = ""


_head_json = msgspec.json.Decoder(_Head)
_head_mp = msgspec.msgpack.Decoder(_Head)


def sample_head(value: bytes) -> _Head:
    """host / ts / rack of an encoded sample (JSON, or a msgpack map); ContractError otherwise."""
    packed = bool(value) and (0x80 <= value[0] <= 0x8F or value[0] in (0xDE, 0xDF))
    try:
        head = (_head_mp if packed else _head_json).decode(value)
    except msgspec.DecodeError as exc:
        raise ContractError("sample", str(exc)) from None
    if not head.host:
        raise ContractError("sample", "empty host", "$.host")
    return head


@dataclass
class Topics:
    telemetry: str = TELEMETRY
    incidents: str = INCIDENTS
    actions: str = ACTIONS
    deadletter: str = DEADLETTER

    def all(self) -> list[str]:
        return [self.telemetry, self.incidents, self.actions, self.deadletter]


@dataclass
class OffsetView:
    """The last Kafka offsets read: messages per topic and (group, topic, lag) rows."""

    counts: dict[str, int] = field(default_factory=dict)
    lag: list[tuple[str, str, int]] = field(default_factory=list)


def offset_view(offsets: Any, topics: Sequence[str], watch: Sequence[tuple[str, str]]) -> OffsetView:
    """Pure over ``offsets`` (``ends(topics)``, ``committed(group)``, as ``kafka_bus.KafkaOffsets``)."""
    ends = offsets.ends(list(topics))
    counts: Counter[str] = Counter({t: 0 for t in topics})
    for (topic, _), (_, end) in ends.items():
        counts[topic] += end
    lag = []
    for group, topic in watch:
        committed = offsets.committed(group)
        parts = {tp: be for tp, be in ends.items() if tp[0] == topic}
        if not parts or not any(tp in committed for tp in parts):
            continue  # a group that never committed on this topic is not running: no series
        lag.append((group, topic, sum(max(0, end - committed.get(tp, begin)) for tp, (begin, end) in parts.items())))
    return OffsetView(dict(counts), lag)


class _Skipped:
    """fleethealth_fleet_metrics_skipped_total{topic}: messages this service could not decode."""

    def __init__(self, counts: Counter[str]) -> None:
        self.counts = counts

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        c = CounterMetricFamily("fleethealth_fleet_metrics_skipped", "Messages the fleet-metrics service "
                                "could not decode and skipped.", labels=["topic"])
        for topic, n in sorted(self.counts.items()):
            c.add_metric([topic], n)
        yield c


class FleetMetricsService:
    """Folds the bus into a FleetState and keeps Kafka offsets fresh; ``collectors()`` to serve."""

    def __init__(self, bus: Bus, *, topics: Topics | None = None, group: str = DEFAULT_GROUP,
                 watch: Sequence[tuple[str, str]] = (), offsets: Any = None, offsets_every: float = 5.0,
                 telemetry_from: str = "latest", clock: Callable[[], float] = time.time) -> None:
        self.bus, self.topics, self.group = bus, topics or Topics(), group
        self.watch = [(self.group, self.topics.telemetry), *watch]
        self.offsets, self.offsets_every, self.clock = offsets, offsets_every, clock
        self.state = FleetState()
        self.view = OffsetView()
        self.skipped: Counter[str] = Counter()
        self._offsets_at = float("-inf")
        self._commit_at = 0.0
        history = [self.topics.incidents, self.topics.actions]
        self.history: Consumer
        if hasattr(bus, "bootstrap"):  # Kafka: incidents + actions outside any group, from the oldest message
            from fleethealth.kafka_bus import KafkaTopicReader

            self.history = KafkaTopicReader(bus, history)  # type: ignore[arg-type]
            # a short metadata age: a telemetry topic created after start joins the assignment soon
            self.telemetry: Consumer = bus.consumer([self.topics.telemetry], group,  # type: ignore[call-arg]
                                                    auto_offset_reset=telemetry_from, metadata_max_age_ms=10_000)
        else:
            self.history = bus.consumer(history, f"{group}-state")
            self.telemetry = bus.consumer([self.topics.telemetry], group)
        self._lock = threading.Lock()

    def collectors(self) -> list[Any]:
        names = {"telemetry": self.topics.telemetry, "deadletter": self.topics.deadletter}
        counts = (lambda: dict(self.view.counts)) if self.offsets is not None else None
        lag = (lambda: list(self.view.lag)) if self.offsets is not None else None
        return [FleetStateCollector(self.state, lag=lag, counts=counts, clock=self.clock, topics=names),
                _Skipped(self.skipped)]

    def step(self, timeout: float = 0.5) -> int:
        """One round: incidents/actions, telemetry heads, offsets when due. Returns messages folded."""
        n = 0
        # a zero timeout would never let kafka-python finish joining the group
        for rec in self.history.poll(timeout=min(timeout, 0.1), max_records=5000):
            try:
                self.state.observe_message(rec.topic, rec.value, incidents=self.topics.incidents,
                                           actions=self.topics.actions)
            except ContractError as exc:
                self._skip(rec.topic, exc)
            n += 1
        now = self.clock()
        for rec in self.telemetry.poll(timeout=timeout, max_records=5000):
            try:
                head = sample_head(rec.value)
            except ContractError as exc:
                self._skip(rec.topic, exc)
                continue
            self.state.observe_host(head.host, head.rack, head.ts, now)
            n += 1
        if now - self._commit_at >= 1.0:
            self.telemetry.commit()
            self._commit_at = now
        mono = time.monotonic()
        if self.offsets is not None and mono - self._offsets_at >= self.offsets_every:
            self._offsets_at = mono
            try:
                self.view = offset_view(self.offsets, self.topics.all(), self.watch)
            except Exception as exc:  # advisory (BusError, a client quirk): keep the last view, keep folding
                log.warning("fleet-metrics: reading Kafka offsets failed: %r (keeping the last ones)", exc)
        return n

    def _skip(self, topic: str, exc: Exception) -> None:
        self.skipped[topic] += 1
        log.warning("fleet-metrics: skipping a message on %s: %s", topic, exc)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.step()
            except BusError as exc:  # broker away: retry, never exit a long-running service
                log.warning("fleet-metrics: %s; retrying in 2 s", exc)
                stop.wait(2.0)

    def close(self) -> None:
        for c in (self.history, self.telemetry):
            c.close()
        if self.offsets is not None:
            self.offsets.close()


# --------------------------------------------------------------------------- CLI

FLEET_METRICS_HELP = """\
Serve the fleet dashboards' series (fleethealth_fleet_*: host states, open incidents, incident
messages; fleethealth_pipeline_*: messages per topic, samples, dead letters, consumer lag per group,
last-sample age per host, stale hosts) when the pipeline runs as separate services on Kafka. These
are the same series, from the same code, as `fleethealth run --metrics-port 9403` serves.

It reads fleet.incidents.v1 and fleet.actions.v1 from the oldest retained message at every start
(outside any group, nothing committed), the host / rack / timestamp of each telemetry sample (group
<group>, committed), and topic end offsets and the detect / remediate groups' commits every few seconds.
Run one per fleet. The default port, 9403, is the one deploy/prometheus/prometheus.yml scrapes for
`run`: do not run both on one machine.

  fleethealth fleet-metrics --bus kafka:127.0.0.1:9092 --metrics-port 9403
"""


def register(sub: Any) -> None:
    import argparse

    from fleethealth.cliutil import flag

    p = sub.add_parser("fleet-metrics", help="fleet-state and pipeline-health metrics from Kafka (port 9403)",
                       description=FLEET_METRICS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    flag(p, "--bus", default="kafka", env="FLEETHEALTH_FLEET_METRICS_BUS", help="kafka[:HOST:PORT] (or memory)")
    flag(p, "--metrics-port", type=int, default=9403, env="FLEETHEALTH_FLEET_METRICS_PORT",
         help="serve /metrics on ADDR:PORT (Prometheus scrapes 9403)")
    flag(p, "--metrics-addr", default="127.0.0.1", env="FLEETHEALTH_FLEET_METRICS_ADDR", help="listen address")
    flag(p, "--group", default=DEFAULT_GROUP, env="FLEETHEALTH_FLEET_METRICS_GROUP",
         help="this service's consumer group on the telemetry topic")
    flag(p, "--detect-group", default="fleethealth-detect", help="the detect workers' group, for its lag")
    flag(p, "--remediate-group", default="fleethealth-remediation", help="the remediate workers' group, for its lag")
    flag(p, "--telemetry-topic", default=TELEMETRY, env="FLEETHEALTH_FLEET_METRICS_TELEMETRY_TOPIC",
         help="telemetry topic")
    flag(p, "--incidents-topic", default=INCIDENTS, env="FLEETHEALTH_FLEET_METRICS_INCIDENTS_TOPIC",
         help="incidents topic")
    flag(p, "--actions-topic", default=ACTIONS, env="FLEETHEALTH_FLEET_METRICS_ACTIONS_TOPIC", help="actions topic")
    flag(p, "--deadletter-topic", default=DEADLETTER, env="FLEETHEALTH_FLEET_METRICS_DEADLETTER_TOPIC",
         help="dead-letter topic")
    flag(p, "--offsets-every", type=float, default=5.0, metavar="S", help="read Kafka offsets every S seconds")
    flag(p, "--telemetry-from", choices=["latest", "earliest"], default="latest",
         help="where a new group starts reading telemetry")
    flag(p, "--exit-after", type=float, default=0.0, metavar="S", env="FLEETHEALTH_FLEET_METRICS_EXIT_AFTER",
         help="stop after S seconds (tests, one-off looks; 0: run until SIGTERM)")
    p.set_defaults(func=_cmd)


def _cmd(args: Any) -> int:
    import signal

    from fleetcli.run_parts import serve
    from fleethealth.config import load_config, open_bus

    bus = open_bus(args.bus, load_config(args.config))
    offsets = None
    if hasattr(bus, "bootstrap"):
        from fleethealth.kafka_bus import KafkaOffsets

        offsets = KafkaOffsets(bus)  # type: ignore[arg-type]
    topics = Topics(args.telemetry_topic, args.incidents_topic, args.actions_topic, args.deadletter_topic)
    svc = FleetMetricsService(bus, topics=topics, group=args.group, offsets=offsets,
                              offsets_every=args.offsets_every, telemetry_from=args.telemetry_from,
                              watch=[(args.detect_group, topics.telemetry), (args.remediate_group, topics.incidents)])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if args.exit_after > 0:
        timer = threading.Timer(args.exit_after, stop.set)
        timer.daemon = True
        timer.start()
    server = serve(svc.collectors(), args.metrics_port, addr=args.metrics_addr)
    log.info("fleet-metrics: group %s on %s, serving on %s:%d", args.group, args.bus, args.metrics_addr,
             args.metrics_port)
    try:
        svc.run(stop)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
        svc.close()
        bus.close()
    return 0
