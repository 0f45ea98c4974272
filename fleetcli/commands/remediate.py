"""``fleethealth remediate`` and ``fleethealth tickets list|show|close``."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fleethealth.bus import INCIDENTS
from fleethealth.cliutil import flag, kafka_client_flag
from fleethealth.config import load_config, open_bus
from fleethealth.errors import UserError

REMEDIATE_HELP = """\
Consume fleet.incidents.v1 and act on each incident by the policy file: drain the node in Slurm or
Kubernetes (never a node an operator drained by hand), hand GPU reset and reboot requests to the
operator hook, open or update repair tickets. Every decision (done, refused, queued, dry-run) goes
to fleet.actions.v1 and to the append-only audit table. Safety guards, counted on the scheduler's
own node list (never on a message's cluster/rack labels): at most 10% of the cluster (or of each
partition / node group) and 2 nodes per rack unavailable at once, 1 drain per host per hour (the
rest queued, with an alert), a node the scheduler does not list refused, a kill switch, and no action
on an incident last seen more than 15 minutes ago ([guards] in the config; docs/remediation.md).
A GPU reset or reboot request goes out only once the node's drain is in place.
"""


BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def printable(text: str) -> str:
    """Telemetry text for a terminal: control characters (C0, DEL, C1) and bidi overrides escaped,
    so a host name cannot clear the screen or draw a fake row (security.md F15)."""
    return "".join(c if c.isprintable() and c not in BIDI else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def _scheduler(kind: str, settings: Any) -> Any:
    """The scheduler adapter; None for "none" (the worker then uses [guards].nodes as its list)."""
    if kind == "slurm":
        from remediation.slurm import SlurmScheduler

        return SlurmScheduler(settings.slurm)
    if kind == "kubernetes":
        from remediation.kube import KubernetesScheduler

        return KubernetesScheduler(settings.kubernetes)
    return None


def _apply_tickets_spec(spec: str | None, settings: Any) -> None:
    if not spec:
        return
    if spec.startswith("sqlite:"):
        settings.remediation.db = spec[len("sqlite:"):] or settings.remediation.db
    elif spec.startswith(("webhook:", "http://", "https://")):
        settings.tickets.webhook = spec[len("webhook:"):] if spec.startswith("webhook:") else spec
    else:
        raise UserError(f"--tickets {spec!r}: use sqlite:PATH or webhook:URL")


def cmd_remediate(args: argparse.Namespace) -> int:
    from remediation.metrics import RemediationMetrics
    from remediation.policy import load_policy
    from remediation.settings import check_guards, load_settings
    from remediation.store import RemediationStore
    from remediation.tickets import WebhookSink
    from remediation.worker import RemediationWorker

    cfg = load_config(args.config)
    s = load_settings(cfg)
    if args.policy:
        s.remediation.policy = args.policy
    if args.state_db:
        s.remediation.db = args.state_db
    _apply_tickets_spec(args.tickets, s)
    if args.dry_run:
        s.remediation.dry_run = True
    if args.kill_switch_file:
        s.guards.kill_switch_file = args.kill_switch_file
    if args.max_incident_age:
        s.guards.max_incident_age_s = args.max_incident_age
        check_guards(s.guards, "--max-incident-age")
    policy = load_policy(s.remediation.policy)  # validated before anything else starts
    scheduler = _scheduler(args.scheduler or s.remediation.scheduler, s)
    store = RemediationStore.open(s.remediation.db)
    sink = None
    if s.tickets.webhook:
        t = s.tickets
        sink = WebhookSink(store.conn, s.tickets.webhook, timeout_s=t.webhook_timeout_s, attempts=t.webhook_attempts,
                           backoff_s=t.webhook_backoff_s)
    metrics = RemediationMetrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_addr)
    bus = open_bus(args.bus, cfg, args.kafka_client)
    worker = RemediationWorker(s, bus=bus, store=store, scheduler=scheduler, policy=policy, ticket_sink=sink,
                               metrics=metrics)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    kw = {}
    if args.session_timeout_ms and args.bus.startswith("kafka"):
        kw = {"session_timeout_ms": args.session_timeout_ms,
              "heartbeat_interval_ms": max(100, min(3000, args.session_timeout_ms // 3))}
    consumer = bus.consumer([args.topic], args.group or s.remediation.group, **kw)
    try:
        stats = worker.run(consumer, stop=stop, exit_when_idle_s=args.exit_when_idle, poll_timeout=0.5)
    finally:
        consumer.close()
        bus.flush()
        bus.close()
        worker.close()
    print(json.dumps({"incidents": stats.incidents, "actions": stats.actions, "dead_letters": stats.dead_letters}),
          file=sys.stderr)
    return 0


def _open_tickets(args: argparse.Namespace) -> Any:
    from remediation.settings import load_settings
    from remediation.store import RemediationStore
    from remediation.tickets import TicketStore

    s = load_settings(load_config(args.config))
    _apply_tickets_spec(getattr(args, "tickets", None), s)
    path = args.state_db or s.remediation.db
    if args.tickets_cmd in ("list", "show") and path != ":memory:" and not Path(path).exists():
        return None, path  # read-only: a state DB that is not there is not created (issue 18)
    store = RemediationStore.open(path)
    return store, TicketStore(store.conn)


def cmd_tickets(args: argparse.Namespace) -> int:
    store, tickets = _open_tickets(args)
    if store is None:
        if args.tickets_cmd == "show":
            raise UserError(f"no ticket {args.id}: {tickets} does not exist (nothing was created)")
        if not args.json:
            print(f"{'ID':>5}  {'STATE':<10} {'PRIO':<7} {'HOST':<20} {'COMPONENT':<28} {'MODE':<22} N")
        print(f"no state DB at {tickets}: no tickets (nothing was created)", file=sys.stderr)
        return 0
    try:
        if args.tickets_cmd == "list":
            rows = tickets.list(state=args.state, host=args.host)
            if args.json:
                for t in rows:
                    print(json.dumps(t.as_dict(), sort_keys=True))
            else:
                print(f"{'ID':>5}  {'STATE':<10} {'PRIO':<7} {'HOST':<20} {'COMPONENT':<28} {'MODE':<22} N")
                for t in rows:
                    print(f"{t.id:>5}  {t.state:<10} {t.priority:<7} {printable(t.host):<20} "
                          f"{printable(t.component)[:28]:<28} {printable(t.failure_mode):<22} {t.occurrences}")
            return 0
        if args.tickets_cmd == "show":
            t = tickets.get(args.id)
            print(json.dumps({**t.as_dict(), "history": tickets.history(t.id)}, indent=2, sort_keys=True))
            return 0
        if args.tickets_cmd in ("close", "start-repair"):
            state = "in_repair" if args.tickets_cmd == "start-repair" else ("repaired" if args.repaired else "closed")
            with store.tx():
                t = tickets.set_state(args.id, state, time.time(), note=args.note or "")
            print(f"ticket {t.id}: {t.state}")
            return 0
        raise UserError("tickets: use list, show ID, start-repair ID or close ID [--repaired]")
    finally:
        store.close()


def register(sub: Any) -> None:
    p = sub.add_parser("remediate", help="act on incidents: drain, reset/reboot requests, repair tickets",
                       description=REMEDIATE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    flag(p, "--bus", default="memory", help="memory | jsonl:PATH | kafka[:HOST:PORT]")
    kafka_client_flag(p)
    flag(p, "--topic", default=INCIDENTS, env="FLEETHEALTH_REMEDIATE_TOPIC", help="incident topic to consume")
    flag(p, "--group", default=None, env="FLEETHEALTH_REMEDIATE_GROUP",
         help="consumer group (default from [remediation].group: fleethealth-remediation)")
    flag(p, "--policy", metavar="FILE", default=None, help="policy YAML (default remediation/policy/default.yaml)")
    flag(p, "--dry-run", action="store_true", help="decide and record, change nothing")
    flag(p, "--scheduler", choices=["slurm", "kubernetes", "none"], default=None,
         help="where drains go (default from [remediation].scheduler: none)")
    flag(p, "--tickets", metavar="SPEC", default=None, help="sqlite:PATH (the state DB) or webhook:URL (also POST)")
    flag(p, "--state-db", metavar="PATH", default=None,
         help="SQLite file with tickets, audit and idempotency keys (default fleethealth-remediation.sqlite)")
    flag(p, "--kill-switch-file", metavar="FILE", default=None, help="while this file exists, no effects")
    flag(p, "--max-incident-age", type=float, default=None, metavar="S", help="freshness bound in seconds")
    flag(p, "--session-timeout-ms", type=int, default=None, metavar="MS",
         env="FLEETHEALTH_REMEDIATE_SESSION_TIMEOUT_MS",
         help="Kafka consumer session timeout: how soon a dead worker's partitions move (default: the client's)")
    flag(p, "--metrics-port", type=int, default=9402, help="Prometheus metrics port (0 = off)")
    flag(p, "--metrics-addr", default="127.0.0.1", help="metrics listen address (0.0.0.0 in a pod)")
    flag(p, "--exit-when-idle", type=float, default=None, metavar="S",
         help="exit after S seconds with no incidents (replays, tests)")
    p.set_defaults(func=cmd_remediate)

    t = sub.add_parser("tickets", help="the repair-ticket store: list, show, close",
                       description="Repair tickets (one per host + component while open): open -> in_repair -> "
                                   "repaired | closed. Closing as --repaired lets remediation resume the node "
                                   "once it reports healthy again.")
    flag(t, "--state-db", metavar="PATH", default=None, env="FLEETHEALTH_STATE_DB", help="the state SQLite file")
    ts = t.add_subparsers(dest="tickets_cmd", metavar="ACTION")
    ls = ts.add_parser("list", help="list tickets")
    ls.add_argument("--state", choices=["open", "in_repair", "repaired", "closed"], help="only this state")
    ls.add_argument("--host", help="only this host")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    sh = ts.add_parser("show", help="one ticket with evidence and history (JSON)")
    sh.add_argument("id", type=int)
    sr = ts.add_parser("start-repair", help="mark a ticket in repair")
    sr.add_argument("id", type=int)
    sr.add_argument("--note", default="")
    cl = ts.add_parser("close", help="close a ticket; --repaired marks the fault fixed")
    cl.add_argument("id", type=int)
    cl.add_argument("--repaired", action="store_true", help="the fault was repaired: the node may be resumed")
    cl.add_argument("--note", default="", help="free text kept in the ticket history")
    t.set_defaults(func=cmd_tickets)
