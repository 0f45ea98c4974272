"""``fleethealth replay FILE --report DIR`` without ground truth: what would have been raised.

Runs the detectors over a recording (an imported Prometheus history, a collector's JSONL) exactly
as ``replay --score`` does, but scores nothing: it lists each incident episode — when it opened
(UTC), on which host and component (GPU UUID / PCI address, port, DIMM), the failure mode, the
rule, the first evidence — into ``DIR/incidents.jsonl`` and a readable ``DIR/index.html``.
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from detectors.scoring.scoring import DetectionRun, run_recording
from fleethealth.errors import UserError
from fleethealth.schema import Incident
from fleethealth.taxonomy import info


@dataclass
class Episode:
    id: str
    host: str
    component: str
    failure_mode: str
    severity: str
    detector: str
    first_seen: float
    last_seen: float
    state: str
    drain: bool
    evidence: str
    xid: int | None = None

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["first_seen_utc"] = utc(self.first_seen)
        return d


def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def episodes(incidents: list[Incident]) -> list[Episode]:
    """One row per incident episode (its latest update), in order of first seen."""
    by_id: dict[str, Incident] = {}
    for inc in incidents:
        by_id[inc.id] = inc
    out = []
    for inc in by_id.values():
        ev = inc.evidence[0] if inc.evidence else None
        out.append(Episode(inc.id, inc.host, inc.component, inc.failure_mode, inc.severity, inc.detector,
                           inc.first_seen, inc.last_seen, inc.state, info(inc.failure_mode).drain,
                           (ev.fact + (f" | {ev.line}" if ev.line else "")) if ev else "", inc.xid))
    return sorted(out, key=lambda e: (e.first_seen, e.host, e.component, e.failure_mode))


def backtest(path: Path, out_dir: Path | None, progress: Any = None,
             engine: Any = None) -> tuple[DetectionRun, list[Episode], Path | None]:
    if not path.exists():
        raise UserError(f"{path}: no such recording")
    res = run_recording(path, engine, progress=progress)
    eps = episodes(res.incidents)
    page = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / "incidents.jsonl", "w", encoding="utf-8") as fh:
            for e in eps:
                fh.write(json.dumps(e.as_dict(), sort_keys=True) + "\n")
        page = write_page(out_dir, path, res, eps)
    return res, eps, page


def write_page(out_dir: Path, path: Path, res: DetectionRun, eps: list[Episode]) -> Path:
    span = f"{utc(res.first_ts)} to {utc(res.last_ts)}" if res.samples else "no samples"
    rows = "".join(
        f"<tr><td>{utc(e.first_seen)}</td><td>{html.escape(e.host)}</td><td>{html.escape(e.component)}</td>"
        f"<td>{e.failure_mode}</td><td>{e.severity}</td><td>{'drain' if e.drain else 'ticket'}</td>"
        f"<td>{html.escape(e.detector)}</td><td>{html.escape(e.evidence[:300])}</td></tr>" for e in eps)
    body = (f"<h1>What fleethealth would have raised</h1><p>{html.escape(str(path))}: {res.samples} samples from "
            f"{len(res.hosts)} hosts, {span} (UTC); {res.invalid} invalid lines skipped; no ground truth, so "
            f"nothing is scored.</p><p>{len(eps)} incident episodes on "
            f"{len({(e.host, e.component) for e in eps})} components; {sum(e.drain for e in eps)} would drain.</p>"
            "<table border=1 cellspacing=0 cellpadding=3><tr><th>first seen (UTC)</th><th>host</th><th>component</th>"
            "<th>failure mode</th><th>severity</th><th>action</th><th>rule</th><th>evidence</th></tr>"
            f"{rows}</table>")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>fleethealth backtest</title>"
            f"<style>body{{font-family:sans-serif;margin:2em}}td{{font-size:90%}}</style></head>"
            f"<body>{body}</body></html>")
    p = out_dir / "index.html"
    tmp = p.with_suffix(".html.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, p)
    return p


def format_text(res: DetectionRun, eps: list[Episode]) -> str:
    lines = [f"{res.samples} samples, {len(res.hosts)} hosts, {res.invalid} invalid; {len(eps)} incident episodes"]
    for e in eps:
        lines.append(f"  {utc(e.first_seen)}  {e.host}  {e.component}  {e.failure_mode} ({e.severity}, "
                     f"{'drain' if e.drain else 'ticket'}) [{e.detector}]")
    return "\n".join(lines)
