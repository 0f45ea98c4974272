"""Adapters that let ``fleethealth run`` drive the other parts in one thread.

Each adapter wraps a part's public API (simulator, replay file, detector worker, remediation worker,
scoring) so that ``fleetcli.pipeline`` only sees: a source that yields samples, stages with
``step()``, and prometheus collectors to serve.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric

from fleethealth.bus import INCIDENTS, Bus, read_values
from fleethealth.errors import UserError
from fleethealth.recordings import meta_path
from fleethealth.schema import ContractError, Incident, Sample, decode_sample, encode

log = logging.getLogger("fleetcli.pipeline")


def parse_duration(text: str | float) -> float:
    if isinstance(text, int | float):
        return float(text)
    from simulator.plan import parse_duration as parse

    return parse(text)


# --------------------------------------------------------------------------- sources


@dataclass
class Source:
    describe: str
    total: int | None
    truth: list[dict[str, Any]] | None = None  # None: the input has no ground truth; []: a fleet with no fault
    path: Path | None = None
    skipped: int = 0
    # The fleet the input was made from, as (node, rack): the dry run's node list (the simulator's
    # spec, or the recording's meta.json spec), never the host names the samples claim.
    fleet: list[tuple[str, str]] | None = None
    _gen: Callable[[], Iterator[Sample]] | None = None

    def samples(self) -> Iterator[Sample]:
        assert self._gen is not None
        return self._gen()


def open_source(opts: Any) -> Source:
    if opts.replay:
        return _replay_source(Path(opts.replay))
    return _sim_source(opts)


def _truth_beside(path: Path) -> list[dict[str, Any]] | None:
    """The recording's ground truth; None when it has none (an empty file: a fleet with no fault)."""
    from fleethealth.recordings import read_truth, truth_path

    tp = truth_path(path)
    if not tp.exists():
        return None
    return read_truth(tp)


def _replay_source(path: Path) -> Source:
    if not path.exists():
        raise UserError(f"{path}: no such recording")
    src = Source(describe=str(path), total=None, truth=_truth_beside(path), path=path)
    meta = meta_path(path)
    if meta.exists():
        doc = json.loads(meta.read_text())
        src.total = doc.get("samples")
        hosts = (doc.get("spec") or {}).get("hosts")
        if isinstance(hosts, int) and 0 < hosts <= 100_000:
            src.fleet = _fleet(hosts)

    def gen() -> Iterator[Sample]:
        for raw in read_values(path):
            try:
                yield decode_sample(raw)
            except ContractError as exc:  # a bad line is counted and skipped, never fatal
                src.skipped += 1
                log.warning("skipping unreadable sample in %s: %s", path, exc)

    src._gen = gen
    return src


def _fleet(hosts: int) -> list[tuple[str, str]]:
    from simulator.topology import build_fleet

    return [(h.name, h.rack) for h in build_fleet(hosts)]


def _sim_source(opts: Any) -> Source:
    from simulator.engine import Simulation
    from simulator.plan import RunSpec

    spec = RunSpec(hosts=opts.hosts, duration_s=parse_duration(opts.duration), interval_s=opts.interval,
                   seed=opts.seed, fault_rate=opts.fault_rate)
    sim = Simulation(spec)
    src = Source(describe=f"simulated fleet: {spec.hosts} hosts, {spec.duration_s:g} s every {spec.interval_s:g} s, "
                          f"seed {spec.seed}, fault rate x{spec.fault_rate:g}",
                 total=spec.ticks * spec.hosts, truth=sim.truth_records(), fleet=_fleet(spec.hosts))

    def gen() -> Iterator[Sample]:
        # The simulator pushes encoded samples through a callback; a thread turns that into a stream
        # with a small bounded buffer, so samples flow (and can be paced) while it simulates.
        import queue

        q: queue.Queue[bytes | None] = queue.Queue(maxsize=4096)
        err: list[BaseException] = []

        def work() -> None:
            try:
                sim.run(q.put)
            except BaseException as exc:  # re-raised in the consuming thread
                err.append(exc)
            finally:
                q.put(None)

        t = threading.Thread(target=work, name="fleetsim", daemon=True)
        t.start()
        while (item := q.get()) is not None:
            yield decode_sample(item)
        t.join()
        src.truth = sim.truth_records()  # complete now: a fault after a GPU swap names the new board
        if err:
            raise err[0]

    src._gen = gen
    return src


# --------------------------------------------------------------------------- detection


class Detection:
    """The detect worker (``detectors.worker.worker.DetectWorker``: engine with rules, episodes, staleness;
    dead letters; its Prometheus metrics) consuming telemetry and publishing incidents. Time comes
    from the samples only: no wall-clock idle tick in a replay."""

    group = "fleethealth-detect"

    def __init__(self, bus: Bus, with_models: bool = False, models: Path | None = None) -> None:
        from detectors.engine.engine import DetectorEngine
        from detectors.worker.metrics import DetectMetrics
        from detectors.worker.worker import DetectWorker

        extra: list[Any] = []
        if with_models:  # opt-in: model-only incidents are tickets, never drains (remediation policy)
            from detectors.registry import model_detectors

            extra = model_detectors(models)
        self.bus = bus
        self.metrics = DetectMetrics()
        self.worker = DetectWorker(bus, DetectorEngine(extra_detectors=extra), group=self.group, poll_timeout=0.0,
                                   metrics=self.metrics, idle_tick=False)

    def step(self) -> int:
        n = 0
        while (k := self.worker.run_once()) > 0:
            n += k
        return n

    def finish(self, last_ts: float | None) -> None:
        """End of input: let open episodes expire / staleness rules run at the last fleet time."""
        if last_ts is None:
            return
        for inc in self.worker.engine.tick(last_ts):
            self.bus.publish(INCIDENTS, inc.host, encode(inc))
            self.metrics.incident(inc)

    def collectors(self) -> list[Any]:
        return [_RegistryProxy(self.metrics.registry)]


# --------------------------------------------------------------------------- remediation


class Remediation:
    """The remediation worker in dry-run with a SQLite ticket store, on the stream clock. The guards
    are those of ``--config`` (``[guards]``, policy, hooks: evaluated, never called) and count on the
    config's ``[guards].nodes`` or else on the input's own fleet (:attr:`Source.fleet`)."""

    group = "fleethealth-remediation"

    def __init__(self, bus: Bus, tickets: str, clock: Callable[[], float], *, config: str | Path | None = None,
                 fleet: list[tuple[str, str]] | None = None) -> None:
        from fleethealth.config import load_config
        from remediation.settings import load_settings
        from remediation.worker import RemediationWorker

        if not tickets.startswith("sqlite:"):
            raise UserError(f"--tickets {tickets!r}: use sqlite:PATH (or sqlite::memory:)")
        db = tickets[len("sqlite:"):] or ":memory:"
        settings = load_settings(load_config(config))
        settings.remediation.dry_run, settings.remediation.db, settings.remediation.group = True, db, self.group
        g = settings.guards
        if not g.nodes and fleet:
            g.nodes = [n for n, _ in fleet]
            if not g.racks:
                racks: dict[str, list[str]] = {}
                for n, r in fleet:
                    racks.setdefault(r, []).append(n)
                g.racks = racks
        self.settings = settings
        self.worker = RemediationWorker(settings, bus=bus, store=db, clock=clock)
        self.consumer = bus.consumer([INCIDENTS], self.group)

    def step(self) -> int:
        n = 0
        while records := self.consumer.poll(timeout=0, max_records=1000):
            for rec in records:
                n += len(self.worker.handle_record(rec))
            self.consumer.commit()
        n += len(self.worker.tick())
        return n

    def collectors(self) -> list[Any]:
        return [_RegistryProxy(self.worker.metrics.registry)]

    def close(self) -> None:
        self.worker.close()


# --------------------------------------------------------------------------- exporters


class _RegistryProxy:
    """Serve another registry's metrics from ours (one port for several parts' registries)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        return self.registry.collect()


class Server:
    def __init__(self, httpd: Any, thread: threading.Thread, stop: threading.Event | None = None) -> None:
        self.httpd, self.thread, self.stop = httpd, thread, stop

    def shutdown(self) -> None:
        if self.stop is not None:
            self.stop.set()
        self.httpd.shutdown()

    def server_close(self) -> None:
        self.httpd.server_close()
        self.thread.join(timeout=5)


def serve(collectors: Iterable[Any], port: int, addr: str = "127.0.0.1") -> Server:
    reg = CollectorRegistry(auto_describe=False)
    for c in collectors:
        reg.register(c)
    try:
        httpd, thread = start_http_server(port, addr=addr, registry=reg)
    except OSError as exc:
        raise UserError(f"cannot serve metrics on {addr}:{port}: {exc}") from exc
    log.info("serving metrics on http://%s:%d/metrics", addr, port)
    return Server(httpd, thread)


def serve_cached(collectors: Iterable[Any], port: int, addr: str = "127.0.0.1", every_s: float = 1.0) -> Server:
    """Serve /metrics from text rendered in the background every ``every_s``: a whole fleet's
    per-host series take longer to render than Prometheus's 1 s scrape timeout allows."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    reg = CollectorRegistry(auto_describe=False)
    for c in collectors:
        reg.register(c)
    cache = [generate_latest(reg)]
    stop = threading.Event()

    def refresh() -> None:
        while not stop.wait(every_s):
            cache[0] = generate_latest(reg)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = cache[0]
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    try:
        httpd = ThreadingHTTPServer((addr, port), Handler)
    except OSError as exc:
        raise UserError(f"cannot serve metrics on {addr}:{port}: {exc}") from exc
    httpd.daemon_threads = True
    threading.Thread(target=refresh, name=f"metrics-render-{port}", daemon=True).start()
    thread = threading.Thread(target=httpd.serve_forever, name=f"metrics-{port}", daemon=True)
    thread.start()
    log.info("serving metrics on http://%s:%d/metrics (rendered every %g s)", addr, port, every_s)
    return Server(httpd, thread, stop)


# --------------------------------------------------------------------------- scoring


def score(source: Source, incidents: list[Incident],
          host_ts: dict[str, list[float]]) -> tuple[dict[str, Any] | None, str, list[Any]]:
    """(scorecard with its matched detections, text, truth faults) from the detector part's scoring
    code, when the input has ground truth; (None, why not, []) otherwise."""
    if source.truth is None:
        return None, "no ground truth beside the input: no scorecard", []
    from fleetcli.run_scoring import scorecard

    return scorecard(source.truth, incidents, host_ts.keys(), host_ts)


def stream_clock() -> tuple[Callable[[Sample], None], Callable[[], float]]:
    """(observe, now): ``now`` is the newest sample timestamp seen (wall clock before any sample)."""
    latest = [0.0]

    def observe(s: Sample) -> None:
        latest[0] = max(latest[0], s.ts)

    return observe, lambda: latest[0] or time.time()

