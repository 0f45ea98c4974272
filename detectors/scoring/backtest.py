"""``fleethealth replay FILE --report DIR`` without ground truth: what would have been raised.

Runs the detectors over a recording (an imported Prometheus history, a collector's JSONL) exactly
as ``replay --score`` does, but scores nothing: it lists each incident episode — when it opened
(UTC), on which host and component (GPU UUID / PCI address, port, DIMM), the failure mode, the
rule, the first evidence — into ``DIR/incidents.jsonl`` and the report (``DIR/index.html``,
:mod:`detectors.scoring.report`, the same page ``run`` and ``replay --score`` write, without a scorecard).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detectors.scoring.report import ReportData, utc, write_report
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
        page = write_report(ReportData(command="replay", source=str(path), samples=res.samples,
                                       hosts=len(res.hosts), first_ts=res.first_ts, last_ts=res.last_ts,
                                       incidents=res.incidents, invalid=res.invalid), out_dir)
    return res, eps, page


def format_text(res: DetectionRun, eps: list[Episode]) -> str:
    lines = [f"{res.samples} samples, {len(res.hosts)} hosts, {res.invalid} invalid; {len(eps)} incident episodes"]
    for e in eps:
        lines.append(f"  {utc(e.first_seen)}  {e.host}  {e.component}  {e.failure_mode} ({e.severity}, "
                     f"{'drain' if e.drain else 'ticket'}) [{e.detector}]")
    return "\n".join(lines)
