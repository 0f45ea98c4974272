"""Build every dashboard to deterministic Grafana JSON; list every PromQL query they run.

Only this module touches files: dashboard modules return grafanalib values. Output is
``json.dumps(..., sort_keys=True, indent=2)`` plus a newline, written to a temp file and
``os.replace``d, so a reader (Grafana's file provider) never sees half a file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grafanalib._gen import DashboardEncoder

from dashboards import alerts, fleet_overview, host_drilldown, pipeline_health
from fleethealth.atomicfile import write_atomic

# file name -> module with build() -> grafanalib Dashboard
DASHBOARDS = {
    "fleet-overview.json": fleet_overview,
    "host-drilldown.json": host_drilldown,
    "pipeline-health.json": pipeline_health,
}
DEFAULT_OUT = Path(__file__).resolve().parent / "json"
DEFAULT_ALERTS_OUT = Path(__file__).resolve().parent / "alerts"
# The same rules as a ConfigMap for a Prometheus on Kubernetes (deploy/kubernetes/).
RULES_CONFIGMAP = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes" / "prometheus-rules.yaml"


def render(name: str) -> str:
    doc = DASHBOARDS[name].build().to_json_data()
    return json.dumps(doc, sort_keys=True, indent=2, cls=DashboardEncoder) + "\n"


def build_all() -> dict[str, str]:
    return {name: render(name) for name in sorted(DASHBOARDS)}


def write_all(out: Path = DEFAULT_OUT) -> list[Path]:
    """Write every dashboard; return the files whose content changed."""
    out.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, text in build_all().items():
        path = out / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            write_atomic(path, text)
            changed.append(path)
    return changed


def stale(out: Path = DEFAULT_OUT) -> list[str]:
    """Names of committed dashboards that differ from what the code builds (or are missing)."""
    bad = []
    for name, text in build_all().items():
        path = out / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            bad.append(name)
    return bad


def _write_if_changed(path: Path, text: str) -> list[Path]:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return []
    write_atomic(path, text)
    return [path]


def write_alerts(out: Path = DEFAULT_ALERTS_OUT, configmap: Path | None = RULES_CONFIGMAP) -> list[Path]:
    """Write the Prometheus alert-rule file (and its ConfigMap); return the files that changed."""
    changed = _write_if_changed(out / alerts.RULE_FILE, alerts.render())
    if configmap is not None:
        changed += _write_if_changed(configmap, alerts.render_configmap())
    return changed


def stale_alerts(out: Path = DEFAULT_ALERTS_OUT, configmap: Path | None = RULES_CONFIGMAP) -> list[str]:
    bad = []
    for path, text in ((out / alerts.RULE_FILE, alerts.render()), (configmap, alerts.render_configmap())):
        if path is not None and not (path.exists() and path.read_text(encoding="utf-8") == text):
            bad.append(path.name)
    return bad


# --------------------------------------------------------------------------- queries


def _panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in doc.get("panels", []):
        yield p
        yield from p.get("panels", [])  # collapsed rows carry their panels inside


def queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """Every PromQL expression of a built dashboard as (where, expr): panel targets, annotation
    queries and template-variable queries (``label_values(m, l)`` is returned as ``m``)."""
    out: list[tuple[str, str]] = []
    for p in _panels(doc):
        for t in p.get("targets", []):
            if t.get("expr"):
                out.append((f"panel {p.get('title')!r} {t.get('refId')}", t["expr"]))
    for a in doc.get("annotations", {}).get("list", []):
        if a.get("expr"):
            out.append((f"annotation {a.get('name')!r}", a["expr"]))
    for v in doc.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if isinstance(q, str) and q.startswith("label_values("):
            inner = q[len("label_values("):-1].rsplit(",", 1)[0].strip()
            out.append((f"variable {v.get('name')!r}", inner))
    return out


def all_queries() -> dict[str, list[tuple[str, str]]]:
    return {name: queries(json.loads(text)) for name, text in build_all().items()}
