"""``fleethealth dashboards build|check|queries``: dashboards as code."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fleethealth.cliutil import flag


def register(sub: Any) -> None:  # sub: argparse._SubParsersAction
    p = sub.add_parser("dashboards", help="build the Grafana dashboards from code",
                       description="Grafana dashboards as code (grafanalib). `build` regenerates "
                                   "dashboards/json; `check` exits 1 when the committed JSON is stale; "
                                   "`queries` lists every PromQL expression the dashboards run.")
    dsub = p.add_subparsers(dest="dashboards_command", metavar="ACTION", required=True)
    b = dsub.add_parser("build", help="write deterministic dashboard JSON")
    flag(b, "--out", type=Path, default=None, help="output folder (default: dashboards/json in the source tree)")
    flag(b, "--alerts-out", type=Path, default=None,
         help="folder for the Prometheus alert-rule file (default: dashboards/alerts in the source tree)")
    b.set_defaults(func=_build)
    c = dsub.add_parser("check", help="exit 1 when committed JSON differs from what the code builds")
    flag(c, "--out", type=Path, default=None, help="folder to compare (default: dashboards/json)")
    flag(c, "--alerts-out", type=Path, default=None, help="alert-rule folder to compare (default: dashboards/alerts)")
    c.set_defaults(func=_check)
    q = dsub.add_parser("queries", help="print every PromQL query, one per line (JSON with --json)")
    flag(q, "--json", action="store_true", help="one JSON object per dashboard")
    q.set_defaults(func=_queries)


def _build(args: argparse.Namespace) -> int:
    from dashboards.alerts import RULE_FILE
    from dashboards.build import (
        DEFAULT_ALERTS_OUT,
        DEFAULT_OUT,
        RULES_CONFIGMAP,
        build_all,
        write_alerts,
        write_all,
    )

    out = args.out or DEFAULT_OUT
    changed = write_all(out)
    for name in build_all():
        mark = "updated" if out / name in changed else "unchanged"
        print(f"{out / name}: {mark}")
    alerts_out = args.alerts_out or DEFAULT_ALERTS_OUT
    changed = write_alerts(alerts_out)
    for path in (alerts_out / RULE_FILE, RULES_CONFIGMAP):
        print(f"{path}: {'updated' if path in changed else 'unchanged'}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from dashboards.build import DEFAULT_ALERTS_OUT, DEFAULT_OUT, stale, stale_alerts

    bad = stale(args.out or DEFAULT_OUT) + stale_alerts(args.alerts_out or DEFAULT_ALERTS_OUT)
    for name in bad:
        print(f"stale: {name} (run `fleethealth dashboards build`)")
    return 1 if bad else 0


def _queries(args: argparse.Namespace) -> int:
    from dashboards.build import all_queries

    qs = all_queries()
    if args.json:
        print(json.dumps({k: [{"where": w, "expr": e} for w, e in v] for k, v in qs.items()}, indent=2))
    else:
        for name, items in qs.items():
            for where, expr in items:
                print(f"{name}\t{where}\t{expr}")
    return 0
