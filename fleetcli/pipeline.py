"""The whole pipeline in one process (``fleethealth run``, ``fleethealth demo``): composition root.

    source (simulated fleet | replay file) --TELEMETRY--> detectors --INCIDENTS--> remediation (dry-run,
    SQLite tickets) --ACTIONS-->  all on one InProcessBus, wrapped in a CountingBus

Exporters: collector-style per-host metrics for the whole fleet being run (``--exporter-port``, the
port Prometheus scrapes for the collector, 9404) and the fleet services' own metrics
(``--metrics-port``, 9403): detector and remediation registries plus the fleet-state collector.
The stages run in this thread, interleaved with publishing, so a run is deterministic for a seed.
How each colleague part is driven lives in ``fleetcli.run_parts``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetcli.fleet_exporter import FleetSampleExporter
from fleetcli.fleet_metrics import CountingBus, FleetState, FleetStateCollector
from fleethealth.bus import ACTIONS, DEADLETTER, INCIDENTS, TELEMETRY, InProcessBus
from fleethealth.cliutil import flag
from fleethealth.errors import UserError
from fleethealth.schema import ActionRecord, Incident, encode

log = logging.getLogger("fleetcli.pipeline")

OBSERVER_GROUP = "run-observer"
DEMO_DATASET = "replay_data/smoke-64h.jsonl.gz"
PROMETHEUS_URL = "http://127.0.0.1:9090"
REPO = Path(__file__).resolve().parents[1]


@dataclass
class RunOptions:
    replay: Path | None = None
    simulate: bool = False
    hosts: int = 16
    duration: str | float = "10m"
    interval: float = 10.0
    fault_rate: float = 1.0
    seed: int = 0
    speed: float = 0.0  # 0: as fast as possible
    score: bool = False
    report: Path | None = None
    tickets: str = ""
    metrics_port: int = 0
    exporter_port: int = 0
    keep_serving: float = 0.0
    quiet: bool = False
    batch: int = 256
    ports_optional: bool = False  # demo: a busy port is a warning, not an error
    with_models: bool = False  # also run the ML detectors (detectors/models)
    models: Path | None = None  # --models DIR: load the models from DIR (implies with_models)
    config: str | None = None  # --config: [guards], policy and hooks of the (dry-run) remediation
    command: str = "run"  # how the report names what wrote it ("run", "demo")


@dataclass
class RunSummary:
    source: str
    hosts: int
    samples: int
    wall_s: float
    stream_span_s: float
    incidents: Sequence[Incident] = ()
    actions: Sequence[ActionRecord] = ()
    host_states: Mapping[str, str] = field(default_factory=dict)
    dead_letters: int = 0
    scorecard: Mapping[str, Any] | None = None  # the public scorecard, with ground truth
    scorecard_text: str = ""
    dry_run: bool = True


@dataclass
class RunResult:
    summary: RunSummary
    report_path: Path | None = None
    incidents: list[Incident] = field(default_factory=list)
    actions: list[ActionRecord] = field(default_factory=list)


def _progress(total: int | None, quiet: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="sample", file=sys.stderr, disable=quiet or not sys.stderr.isatty(),
                desc="run", mininterval=0.5)


def run(opts: RunOptions, *, ready: Any = None, on_finished: Any = None, stop: Any = None) -> RunResult:
    """Run the pipeline to the end of the input. ``ready`` (a threading.Event) is set once the exporters
    listen; ``on_finished(result)`` is called when the input is done, before ``keep_serving``, which
    ``stop`` (an Event) cuts short."""
    from detectors.scoring.report import ReportData, write_report
    from detectors.scoring.scoring import public
    from fleetcli import run_parts

    if bool(opts.replay) == bool(opts.simulate):
        raise UserError("give exactly one of --replay PATH or --simulate")
    inproc = InProcessBus(retain_consumed=True)  # a long run holds only what a consumer still owes
    bus = CountingBus(inproc)
    state = FleetState()
    source = run_parts.open_source(opts)
    tickets = opts.tickets or "sqlite::memory:"
    observe_ts, stream_now = run_parts.stream_clock()
    detect = run_parts.Detection(bus, with_models=opts.with_models or opts.models is not None,
                                 models=opts.models)
    remediate = run_parts.Remediation(bus, tickets, clock=stream_now, config=opts.config, fleet=source.fleet)
    fleet_exporter = FleetSampleExporter()
    groups = [(detect.group, TELEMETRY), (remediate.group, INCIDENTS)]
    servers: list[Any] = []
    try:
        lag = lambda: [(g, t, inproc.lag(g, t)) for g, t in groups]  # noqa: E731
        services = [FleetStateCollector(state, bus, lag=lag), *detect.collectors(), *remediate.collectors()]
        for port, start in ((opts.exporter_port, lambda p: run_parts.serve_cached([fleet_exporter], p)),
                            (opts.metrics_port, lambda p: run_parts.serve(services, p))):
            if not port:
                continue
            try:
                servers.append(start(port))
            except UserError as exc:
                if not opts.ports_optional:
                    raise
                log.warning("%s; running without it", exc)
        if ready is not None:
            ready.set()
        observer = bus.consumer([INCIDENTS, ACTIONS], OBSERVER_GROUP)
        incidents: list[Incident] = []
        actions: list[ActionRecord] = []

        def pump() -> None:
            detect.step()
            remediate.step()
            for rec in observer.poll(timeout=0, max_records=100_000):
                msg = state.observe_message(rec.topic, rec.value)
                if isinstance(msg, Incident):
                    incidents.append(msg)
                elif msg is not None:
                    actions.append(msg)
            observer.commit()

        t0 = time.monotonic()
        first_ts = last_ts = None
        n = 0
        host_ts: dict[str, list[float]] = {}
        bar = _progress(source.total, opts.quiet)
        for sample in _paced(source.samples(), opts.speed):
            bus.publish(TELEMETRY, sample.host, encode(sample))
            observe_ts(sample)
            host_ts.setdefault(sample.host, []).append(sample.ts)
            state.observe_sample(sample, received_at=time.time())
            fleet_exporter.observe(sample)
            first_ts = sample.ts if first_ts is None else first_ts
            last_ts = sample.ts
            n += 1
            bar.update(1)
            if n % opts.batch == 0 or opts.speed:
                pump()
        pump()
        detect.finish(last_ts)
        remediate.step()
        pump()
        bar.close()
        wall = time.monotonic() - t0

        card: dict[str, Any] | None = None
        card_text, faults = "", list[Any]()
        if opts.score or opts.report:  # the report carries the scorecard whenever there is ground truth
            card, card_text, faults = run_parts.score(source, incidents, host_ts)
        summary = RunSummary(
            source=source.describe, hosts=len(state.hosts), samples=n, wall_s=round(wall, 3),
            stream_span_s=round((last_ts or 0) - (first_ts or 0), 3), incidents=incidents, actions=actions,
            host_states=state.host_states(), dead_letters=bus.counts().get(DEADLETTER, 0),
            scorecard=public(card) if opts.score and card is not None else None,
            scorecard_text=card_text if opts.score else "", dry_run=True)
        result = RunResult(summary, incidents=incidents, actions=actions)
        if opts.report:
            result.report_path = write_report(ReportData(
                command=opts.command, source=source.describe, samples=n, hosts=len(state.hosts),
                first_ts=first_ts or 0.0, last_ts=last_ts or 0.0, incidents=incidents, card=card, faults=faults,
                actions=actions, host_states=summary.host_states, dead_letters=summary.dead_letters,
                wall_s=wall), opts.report)
        if on_finished is not None:
            on_finished(result)
        if opts.keep_serving > 0 and servers:
            log.info("run finished; serving metrics for %.0f s more", opts.keep_serving)
            if stop is not None:
                stop.wait(opts.keep_serving)
            else:
                time.sleep(opts.keep_serving)
        return result
    finally:
        for srv in servers:
            srv.shutdown()
            srv.server_close()
        remediate.close()


def _paced(samples: Iterator[Any], speed: float) -> Iterator[Any]:
    """Yield samples; with speed > 0, wait so that stream time passes ``speed`` times faster than real."""
    if speed <= 0:
        yield from samples
        return
    start_wall = start_ts = None
    for s in samples:
        if start_ts is None:
            start_wall, start_ts = time.monotonic(), s.ts
        else:
            due = start_wall + (s.ts - start_ts) / speed
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        yield s


# --------------------------------------------------------------------------- CLI


def _add_run_flags(p: argparse.ArgumentParser, demo: bool = False) -> None:
    if not demo:
        flag(p, "--replay", type=Path, metavar="PATH", help="a recorded fleet (.jsonl / .jsonl.gz) to run")
        flag(p, "--simulate", action="store_true", help="run a simulated fleet instead of a recording")
        flag(p, "--hosts", type=int, default=16, help="simulated hosts")
        flag(p, "--duration", default="10m", help="simulated time, e.g. 600, 10m, 2h")
        flag(p, "--interval", type=float, default=10.0, help="simulated seconds between samples of a host")
        flag(p, "--fault-rate", type=float, default=1.0, help="multiplier on the default fault rates")
        flag(p, "--seed", type=int, default=0, help="simulation seed")
        flag(p, "--score", action="store_true", help="print the scorecard (needs ground truth)")
        flag(p, "--report", type=Path, metavar="DIR", help="write an HTML report to DIR/index.html")
    flag(p, "--speed", type=float, default=0.0,
         help="stream time runs this many times faster than real time (0: as fast as possible)")
    flag(p, "--tickets", default="", metavar="sqlite:PATH",
         help="ticket store (default: an in-memory SQLite store for the run)")
    flag(p, "--metrics-port", type=int, default=0 if not demo else 9403,
         help="serve the fleet services' metrics on 127.0.0.1:PORT (0: off; Prometheus scrapes 9403)")
    flag(p, "--exporter-port", type=int, default=0 if not demo else 9404,
         help="serve collector-style per-host metrics of the fleet on 127.0.0.1:PORT (0: off; 9404)")
    flag(p, "--keep-serving", type=float, default=0.0, metavar="S",
         help="after the run, keep the exporters up S seconds (for Prometheus / Grafana)")
    flag(p, "--quiet", action="store_true", help="no progress bar")
    flag(p, "--with-models", action="store_true",
         help="also run the ML detectors shipped in detectors/models (their incidents open tickets, never drains)")
    flag(p, "--models", type=Path, default=None, metavar="DIR", help="load the ML detectors' models from DIR (what `fleethealth train --out DIR` wrote); implies --with-models")


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="the whole pipeline in one process (simulated fleet or replay)",
                       description="Run collectors' input (a simulated fleet or a recording), detectors, "
                                   "remediation in dry-run with a SQLite ticket store, and the Prometheus "
                                   "exporters, in one process on the in-process bus. Prints the scorecard "
                                   "with --score and writes an HTML report with --report.")
    _add_run_flags(p)
    p.set_defaults(func=_cmd_run)
    d = sub.add_parser("demo", help="`run` on the shipped 64-host smoke set, scored, with an HTML report",
                       description=f"fleethealth run --replay {DEMO_DATASET} --score --report reports/demo")
    flag(d, "--dataset", type=Path, default=REPO / DEMO_DATASET, help="the recording to run")
    flag(d, "--report", type=Path, default=Path("reports/demo"), help="HTML report folder")
    _add_run_flags(d, demo=True)
    d.set_defaults(func=_cmd_demo)

    from fleetcli.fleet_service import register as register_fleet_metrics

    register_fleet_metrics(sub)  # the same fleet series, from Kafka, for the split deployment


def _opts(args: argparse.Namespace, **over: Any) -> RunOptions:
    from fleetcli.run_parts import parse_duration

    o = RunOptions(
        replay=getattr(args, "replay", None), simulate=getattr(args, "simulate", False),
        hosts=getattr(args, "hosts", 16), duration=parse_duration(getattr(args, "duration", "10m")),
        interval=getattr(args, "interval", 10.0), fault_rate=getattr(args, "fault_rate", 1.0),
        seed=getattr(args, "seed", 0), speed=args.speed, score=getattr(args, "score", False),
        report=getattr(args, "report", None), tickets=args.tickets, metrics_port=args.metrics_port,
        exporter_port=args.exporter_port, keep_serving=args.keep_serving, quiet=args.quiet,
        with_models=args.with_models, models=getattr(args, "models", None), config=getattr(args, "config", None))
    for k, v in over.items():
        setattr(o, k, v)
    return o


def _print_result(res: RunResult) -> None:
    s = res.summary
    from detectors.scoring.report import drain_counts

    would, held = drain_counts(res.actions)
    print(f"fleethealth run: {s.samples} samples from {s.hosts} hosts in {s.wall_s:.1f} s "
          f"({s.stream_span_s:.0f} s of fleet time); {len({i.id for i in res.incidents})} incident episodes, "
          f"{len(res.actions)} actions (dry-run: nothing drained; would drain {would}, {held} drains queued "
          f"behind a guard), {s.dead_letters} dead letters")
    if s.scorecard_text:
        print(s.scorecard_text)
    if res.report_path:
        print(f"report: {res.report_path}")


def _quiet_per_action_logs() -> None:
    """One INFO line per action floods a run of thousands; keep them at --log-level debug."""
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("remediation").setLevel(logging.WARNING)


def _cmd_run(args: argparse.Namespace) -> int:
    _quiet_per_action_logs()
    res = run(_opts(args))
    _print_result(res)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    if not args.dataset.exists():
        raise UserError(f"{args.dataset}: demo dataset not found (replay_data/ ships it)")
    _quiet_per_action_logs()
    res = run(_opts(args, replay=args.dataset, score=True, report=args.report, ports_optional=True,
                         command="demo"))
    _print_result(res)
    prov = REPO / "deploy" / "grafana" / "provisioning"
    print(f"Grafana: provision {prov}/datasources and {prov}/dashboards (dashboards in {REPO / 'dashboards/json'}),"
          f" datasource Prometheus at {PROMETHEUS_URL} (scripts/services.sh up prometheus)"
          + ("; metrics were not served (--exporter-port/--metrics-port 0)"
             if not (args.exporter_port or args.metrics_port) else
             f"; metrics were served on 127.0.0.1:{args.exporter_port} (collector) and :{args.metrics_port} (services)"
             + (f" and stay up {args.keep_serving:.0f} s" if args.keep_serving else
                " during the run (--keep-serving S keeps them up)")))
    return 0
