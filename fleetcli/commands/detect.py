"""Subcommands of the detectors part (registered into the fleethealth command)."""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path
from typing import Any

from fleethealth.bus import DEADLETTER, INCIDENTS, TELEMETRY
from fleethealth.cliutil import flag, kafka_client_flag

log = logging.getLogger("fleethealth.detect")

DETECT_HELP = """\
Consume fleet.telemetry.v1 as a member of a consumer group, keep per-host state (counter deltas
across resets and wraps, rates over windows, flaps, staleness, fleet baselines), run the rules in
detectors/engine/rules/*.yaml (validated at start-up, file:line in every error) and any registered
detectors, and publish incident episodes (open / updated / resolved) to fleet.incidents.v1, keyed
by host. Offsets are committed only after the broker acknowledged a batch's incidents and dead
letters (while it is away, the worker retries with capped backoff and reads nothing new). Messages
that do not decode go to fleet.deadletter.v1 with the reason. Several workers with the same --group
share the partitions; a host's state lives with the worker that owns its partition, and a worker
that is assigned a partition rebuilds its hosts' state from the last --rebuild-window of the stream
before the committed offset, so ongoing episodes keep their ids.

  fleethealth detect --bus kafka:127.0.0.1:9092 --group fleethealth-detect --metrics-port 9401
  fleethealth detect --bus jsonl:fleet.jsonl.gz --from-beginning --exit-when-idle
  fleethealth detect --topic drill.telemetry --incidents-topic drill.incidents --session-timeout-ms 6000

Time comes from the samples: quiet periods run on each host's own sample time; staleness
(host_unreachable) on the stream time (largest sample ts, advanced by the time elapsed since samples
last arrived, so a replayed old recording behaves as live), held back while a partition still has
records waiting, and never ahead of this worker's clock. A sample stamped past --max-clock-skew ahead
of receive time is counted and corrected to it; the trust boundary (host signatures, allowlist,
host bound, field-level rejection): docs/security.md.
"""


def register(sub: Any) -> None:  # sub: argparse._SubParsersAction
    p = sub.add_parser("detect", help="the streaming detectors (a Kafka consumer group)", description=DETECT_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    flag(p, "--bus", default="kafka", help="memory | jsonl:PATH | kafka[:HOST:PORT]")
    kafka_client_flag(p)
    flag(p, "--group", default="fleethealth-detect", help="consumer group name (workers of one group share partitions)")
    flag(p, "--topic", default=TELEMETRY, env="FLEETHEALTH_DETECT_TOPIC", help="telemetry topic to consume")
    flag(p, "--incidents-topic", default=INCIDENTS, env="FLEETHEALTH_DETECT_INCIDENTS_TOPIC",
         help="topic the incident episodes are published to")
    flag(p, "--deadletter-topic", default=DEADLETTER, env="FLEETHEALTH_DETECT_DEADLETTER_TOPIC",
         help="topic undecodable messages are published to")
    flag(p, "--session-timeout-ms", type=int, default=None, metavar="MS", env="FLEETHEALTH_DETECT_SESSION_TIMEOUT_MS",
         help="Kafka consumer session timeout: how soon the group moves a dead worker's partitions "
              "(default: the client's; the broker's minimum is usually 6000)")
    flag(p, "--from-beginning", action="store_true",
         help="a new group starts at the oldest telemetry instead of the newest")
    flag(p, "--metrics-port", type=int, default=9401, help="Prometheus metrics port (0 = off)")
    flag(p, "--metrics-addr", default="127.0.0.1", help="metrics listen address (0.0.0.0 in a pod)")
    flag(p, "--rules", metavar="DIR", help="rule directory instead of the shipped detectors/engine/rules")
    flag(p, "--exit-when-idle", action="store_true", help="stop after the input has been idle for a few polls")
    flag(p, "--with-models", action="store_true", help="also run the ML detectors of detectors.registry")
    flag(p, "--models", type=Path, default=None, metavar="DIR", help="load the ML detectors' models from DIR (what `fleethealth train --out DIR` wrote); implies --with-models")
    flag(p, "--rebuild-window", type=float, default=7200.0, metavar="SECONDS",
         help="on a partition assignment, rebuild its hosts' state from this much stream before the "
              "committed offset (silently: episodes keep their ids)")
    flag(p, "--max-clock-skew", type=float, default=300.0, metavar="SECONDS",
         help="a sample stamped more than this ahead of receive time is counted (fleethealth_detect_clock_skew"
              "_total{direction=ahead}) and its time corrected to the receive time (0 = off)")
    flag(p, "--max-lateness", type=float, default=3600.0, metavar="SECONDS",
         help="a sample stamped more than this behind receive time is counted (direction=behind), not changed: "
              "a spool resend after an outage is legitimately old (0 = off)")
    flag(p, "--host-allowlist", metavar="FILE",
         help="the hosts telemetry may come from, one per line (# comments), e.g. from `sinfo -N -h -o %%N`; "
              "a sample for any other host is dead-lettered and keeps no state")
    flag(p, "--max-hosts", type=int, default=25_000, metavar="N",
         help="hosts this worker keeps state for; a new host past it evicts the least recently heard host if "
              "that one is silent past its staleness limit, else it is dead-lettered (about 85 KiB a host)")
    flag(p, "--identity-secret", metavar="FILE",
         help="the operator secret (hex, mode 600): every record must carry the fh-sig signature of the host "
              "its key names (collect --identity-key; keys from fleethealth identity-key HOST)")
    p.set_defaults(func=cmd_detect)
    k = sub.add_parser("identity-key", help="print a host's telemetry signing key (from the operator secret)",
                       description="Derive HOST's key from the operator secret (HMAC-SHA256; fleethealth.identity) "
                                   "and print it as hex: install it on HOST as the file collect --identity-key "
                                   "reads (mode 600). detect --identity-secret holds only the secret.")
    k.add_argument("host", metavar="HOST")
    flag(k, "--secret-file", required=False, metavar="FILE", env="FLEETHEALTH_IDENTITY_SECRET",
         help="the operator secret (at least 16 bytes; hex or raw)")
    k.set_defaults(func=cmd_identity_key)


def read_allowlist(path: str) -> frozenset[str]:
    from fleethealth.errors import UserError

    try:
        text = open(path, encoding="utf-8").read()  # noqa: SIM115
    except OSError as exc:
        raise UserError(f"--host-allowlist {path}: {exc.strerror or exc}") from None
    hosts = frozenset(h for line in text.splitlines() if (h := line.split("#", 1)[0].strip()))
    if not hosts:
        raise UserError(f"--host-allowlist {path}: no host names in it (one per line)")
    return hosts


def cmd_identity_key(args: argparse.Namespace) -> int:
    from fleethealth.errors import UserError
    from fleethealth.identity import host_key, read_key_file

    if not args.secret_file:
        raise UserError("identity-key needs --secret-file FILE (or FLEETHEALTH_IDENTITY_SECRET)")
    print(host_key(read_key_file(args.secret_file, "secret"), args.host).hex())
    return 0


def cmd_detect(args: argparse.Namespace) -> int:
    from detectors.engine.engine import DetectorEngine
    from detectors.engine.ruleset import RuleSet
    from detectors.worker.metrics import DetectMetrics
    from detectors.worker.worker import DetectWorker, streaming_gc
    from fleethealth.config import load_config, open_bus

    rule_files = sorted(Path(args.rules).glob("*.yaml")) if args.rules else None
    if args.rules and not rule_files:
        from fleethealth.errors import UserError

        raise UserError(f"--rules {args.rules}: no *.yaml rule files there (it must be a folder of rule files)")
    rules = RuleSet.load(rule_files)
    extra = []
    if args.with_models or args.models is not None:
        from detectors.registry import model_detectors

        extra = model_detectors(args.models)
    engine = DetectorEngine(rules, extra)
    cfg = load_config(getattr(args, "config", None))
    bus = open_bus(args.bus, cfg, args.kafka_client)
    if args.bus.startswith("kafka"):
        # both Kafka buses' consumer() take auto_offset_reset and kafka-python-named options; the worker asks through this adapter
        kw: dict[str, Any] = {"auto_offset_reset": "earliest" if args.from_beginning else "latest"}
        if args.session_timeout_ms:
            kw["session_timeout_ms"] = args.session_timeout_ms
            kw["heartbeat_interval_ms"] = max(100, min(3000, args.session_timeout_ms // 3))
        orig = bus.consumer
        bus.consumer = lambda topics, group: orig(topics, group, **kw)  # type: ignore[method-assign]
    metrics = DetectMetrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_addr)
    # a live broker going quiet means hosts went quiet: stream time keeps moving with the monotonic
    # clock; a file or in-memory bus ending is just the end of a recording
    from fleethealth.errors import UserError
    from fleethealth.identity import Verifier, read_key_file

    if args.max_hosts < 1 or args.max_clock_skew < 0 or args.max_lateness < 0:
        raise UserError("--max-hosts must be at least 1; --max-clock-skew and --max-lateness not negative")
    verifier = Verifier(read_key_file(args.identity_secret, "--identity-secret")) if args.identity_secret else None
    allow = read_allowlist(args.host_allowlist) if args.host_allowlist else None
    worker = DetectWorker(bus, engine, group=args.group, topic=args.topic, incidents_topic=args.incidents_topic,
                          deadletter_topic=args.deadletter_topic, metrics=metrics,
                          idle_tick=args.bus.startswith("kafka"), rebuild_window_s=args.rebuild_window,
                          max_clock_skew=args.max_clock_skew, max_lateness=args.max_lateness, host_allowlist=allow,
                          max_hosts=args.max_hosts, verifier=verifier)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    log.info("detect: %d rules, %d extra detectors, group %s on %s topic %s", len(rules.specs), len(extra), args.group,
             args.bus, args.topic)
    streaming_gc()  # start-up is done: freeze it, collect the young generation less often
    try:
        stats = worker.run(max_idle_polls=4 if args.exit_when_idle else None)
    except KeyboardInterrupt:
        stats = worker.stats
    finally:
        worker.close()
        bus.close()
    log.info("detect: %d samples, %d incidents, %d dead letters; clock skew: %d ahead (corrected), %d behind; "
             "%d hosts evicted", stats.samples, stats.incidents, stats.dead_letters, stats.clock_ahead,
             stats.clock_behind, stats.hosts_evicted)
    print(f"{stats.samples} samples, {stats.incidents} incidents, {stats.dead_letters} dead letters")
    return 0
