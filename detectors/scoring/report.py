"""The one HTML report of fleethealth: ``run``, ``demo``, ``replay --score --report DIR`` and
``replay FILE --report DIR`` (no ground truth) all write it through :func:`write_report`.

A single self-contained page (inline CSS and SVG, no script, nothing fetched), sections present when
their data exist:

* ``summary`` — input, telemetry span (UTC), hosts, samples, episodes, remediation outcome (always);
* ``scorecard`` — per-mode precision / recall, the quality bar, the confusion matrix and the false
  positives (only with ground truth);
* ``backtest`` — what would have been raised, nothing scored (without ground truth);
* ``timeline`` — one row per host with incidents (or faults), time in UTC (always);
* ``incidents`` — episodes by mode and the episode table with evidence (always);
* ``remediation`` — host states at the end and the dry-run actions (``run`` / ``demo``).

Times are ``2026-12-01 17:04:05 UTC``; colours are Okabe–Ito (:mod:`detectors.scoring.palette`), and
text on a coloured cell is black or white by the cell's luminance. :func:`render_html` is pure;
:func:`write_report` is the only function that touches files (temp file + ``os.replace``).
"""

from __future__ import annotations

import html
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detectors.scoring import timeline
from detectors.scoring.palette import OKABE_ITO, RAMP_FP, RAMP_OK, mode_colour, ramp, text_on
from detectors.scoring.scoring import TruthFault, meets_quality_bar
from fleethealth.atomicfile import write_atomic
from fleethealth.schema import ActionRecord, Incident
from fleethealth.taxonomy import FAULT_LABELS, info

utc = timeline.utc
MAX_ROWS = 300
SECTIONS = ("summary", "scorecard", "backtest", "timeline", "incidents", "remediation")


@dataclass
class ReportData:
    """What the report shows. ``card`` is :func:`detectors.scoring.scoring.score`'s result (with its
    ``_detections``) and ``faults`` the ground truth, when there is some; ``actions`` and
    ``host_states`` are None when no remediation ran (``replay``)."""

    command: str  # "run", "demo", "replay"
    source: str
    samples: int
    hosts: int
    first_ts: float
    last_ts: float
    incidents: Sequence[Incident] = ()
    invalid: int = 0
    card: Mapping[str, Any] | None = None
    faults: Sequence[TruthFault] = ()
    actions: Sequence[ActionRecord] | None = None
    host_states: Mapping[str, str] | None = None
    dead_letters: int | None = None
    wall_s: float | None = None
    generated_at: float | None = None  # default: now


def episodes(incidents: Sequence[Incident]) -> list[Incident]:
    """Each episode's latest update, in order of first sighting."""
    latest: dict[str, Incident] = {}
    for inc in incidents:
        latest[inc.id] = inc
    return sorted(latest.values(), key=lambda i: (i.first_seen, i.host, i.component, i.id))


def drain_counts(actions: Sequence[ActionRecord]) -> tuple[int, int]:
    """(would-drain, drains queued behind a guard) of a dry run, as the audit counts them."""
    would = sum(1 for a in actions if a.kind == "drain" and a.outcome == "dry_run" and "step" not in a.details)
    held = len({a.id for a in actions if a.kind == "drain" and a.outcome == "queued"})
    return would, held


def duration(s: float) -> str:
    s = max(0.0, s)
    if s < 120:
        return f"{s:.0f} s"
    m = round(s / 60)
    if m < 120:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m:02d} min"
    d, h = divmod(h, 24)
    return f"{d} d {h} h"


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "",
           widths: Sequence[int] = ()) -> str:
    cols = "<colgroup>" + "".join(f"<col style='width:{w}%'>" for w in widths) + "</colgroup>" if widths else ""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c if isinstance(c, _Raw) else _e(c)}</td>" for c in r) + "</tr>"
                   for r in rows)
    return (f"<table{f' class={cls!r}' if cls else ''}>{cols}<thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


class _Raw(str):
    """Markup already escaped (a table cell that carries a swatch or a badge)."""


def _facts(rows: Sequence[tuple[str, Any]]) -> str:
    return "<table class='facts'><tbody>" + "".join(
        f"<tr><th scope='row'>{_e(k)}</th><td>{v if isinstance(v, _Raw) else _e(v)}</td></tr>" for k, v in rows
    ) + "</tbody></table>"


def _mode_cell(mode: str) -> _Raw:
    return _Raw(f"<span class='swatch' style='background:{mode_colour(mode)}'></span>{_e(mode)}")


def _shown(n: int, limit: int, what: str) -> str:
    return f"all {n} {what}" if n <= limit else f"the first {limit} of {n} {what}"


def _badge(ok: bool, text: str) -> _Raw:
    bg = OKABE_ITO["bluish_green"] if ok else OKABE_ITO["vermillion"]
    return _Raw(f"<span class='badge' style='background:{bg};color:{text_on(bg)}'>{_e(text)}</span>")


# ------------------------------------------------------------------------------------------ sections
def _summary(d: ReportData, eps: list[Incident]) -> str:
    drainy = sum(1 for e in eps if info(e.failure_mode).drain)
    rows: list[tuple[str, Any]] = [
        ("command", f"fleethealth {d.command}"), ("input", d.source),
        ("telemetry", f"{utc(d.first_ts)} to {utc(d.last_ts)} ({duration(d.last_ts - d.first_ts)})"
         if d.samples else "no samples"),
        ("hosts", d.hosts),
        ("samples", f"{d.samples}" + (f" ({d.invalid} invalid lines skipped)" if d.invalid else "")),
        ("incident episodes", f"{len(eps)} on {len({e.host for e in eps})} hosts; {drainy} of a drain-worthy mode"),
    ]
    if d.actions is not None:
        would, held = drain_counts(d.actions)
        rows.append(("remediation", f"dry-run (nothing drained): would drain {would}, "
                                    f"{held} drains queued behind a guard; {len(d.actions)} actions"))
    if d.dead_letters is not None:
        rows.append(("dead-lettered messages", d.dead_letters))
    if d.card is not None:
        bad = meets_quality_bar(dict(d.card))
        rows.append(("quality bar", _badge(not bad, "PASS" if not bad else "FAIL")))
    if d.wall_s is not None:
        rows.append(("wall time", f"{d.wall_s:.1f} s"))
    rows.append(("report generated", utc(d.generated_at if d.generated_at is not None else time.time())))
    return "<section id='summary'><h2>Summary</h2>" + _facts(rows) + "</section>"


def _scorecard(card: Mapping[str, Any], faults: Sequence[TruthFault]) -> str:
    rows = []
    for m, r in card["modes"].items():
        delay = "–" if r["median_delay_s"] is None else duration(r["median_delay_s"])
        rows.append([_mode_cell(m), "yes" if r["drain_worthy"] else "no", r["support"], r["detections"],
                     r["false_positives"], f"{r['precision']:.3f}" if r["detections"] else "–",
                     f"{r['recall']:.3f}" if r["support"] else "–", f"{r['f1']:.3f}" if r["detections"] and
                     r["support"] else "–", delay])
    bad = meets_quality_bar(dict(card))
    out = ["<section id='scorecard'><h2>Scorecard against the ground truth</h2>",
           "<p>", _badge(not bad, "quality bar PASS" if not bad else "quality bar FAIL"),
           " recall ≥ 0.95 and precision ≥ 0.98 for every drain-worthy mode, and no incident on a healthy host",
           ("" if not bad else "<br>" + _e("; ".join(bad))), "</p>",
           _table(["failure mode", "drain-worthy", "faults", "detections", "false positives", "precision",
                   "recall", "F1", "median delay"], rows),
           f"<p>{card['healthy_hosts']} hosts without a fault: {card['healthy_hosts_with_incidents']} got an incident, "
           f"{card['healthy_hosts_with_drain_incidents']} a drain-worthy one."
           + (f" {len(card['unobservable_faults'])} faults fell in a telemetry gap of their host and are not scored."
              if card.get("unobservable_faults") else "") + "</p>",
           _confusion(card, faults), _false_positives(card), "</section>"]
    return "".join(out)


def _confusion(card: Mapping[str, Any], faults: Sequence[TruthFault]) -> str:
    dets = card.get("_detections") or []
    if not dets:
        return "<h3 id='confusion'>Confusion matrix</h3><p>No detections.</p>"
    by_id = {f.id: f for f in faults}
    cols = [m for m in FAULT_LABELS if any(d.mode == m for d in dets)]
    counts: Counter[tuple[str, str]] = Counter()
    for d in dets:
        f = by_id.get(d.matched) if d.verdict != "fp" else None
        counts[(f.mode if f is not None else "none", d.mode)] += 1
    rows = [m for m in FAULT_LABELS if any(r == m for r, _ in counts)] + (
        ["none"] if any(r == "none" for r, _ in counts) else [])
    top = math.log1p(max(counts.values()))
    head = "".join(f"<th scope='col' class='cm-col'><span>{_e(c)}</span></th>" for c in cols)
    body = []
    for r in rows:
        cells = []
        for c in cols:
            v = counts.get((r, c), 0)
            if not v:
                cells.append("<td class='cm-cell cm-zero'></td>")
                continue
            bg = ramp(RAMP_FP if r == "none" else RAMP_OK, 0.15 + 0.85 * math.log1p(v) / top if top else 1.0)
            cells.append(f"<td class='cm-cell' style='background:{bg};color:{text_on(bg)}'>{v}</td>")
        label = "none (false positive)" if r == "none" else r
        body.append(f"<tr><th scope='row'>{_e(label)}</th>{''.join(cells)}</tr>")
    return ("<h3 id='confusion'>Confusion matrix</h3><table class='cm'><caption>Detections (incident episodes) "
            "by the mode detected (columns) and the truth mode of the fault they were matched to (rows). "
            "The diagonal is correct; an off-diagonal cell in a fault's row is a secondary symptom of that "
            "fault (a GPU off the bus also raises PCIe fatal) or the precursor of it (a correctable-error "
            "storm before an uncorrectable error): counted as correct, not as an error. False positives, "
            "if any, are the last row (none), in vermillion.</caption>"
            f"<thead><tr><th>truth \\ detected</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def _false_positives(card: Mapping[str, Any]) -> str:
    fps = card.get("false_positive_examples") or []
    if not fps:
        return "<h3 id='false-positives'>False positives</h3><p>None.</p>"
    return ("<h3 id='false-positives'>False positives</h3>" + _table(
        ["first seen", "host", "component", "failure mode", "detector"],
        [[utc(f["first_seen"]), f["host"], f["component"], _mode_cell(f["failure_mode"]), f["detector"]]
         for f in fps]))


def _backtest(eps: list[Incident]) -> str:
    comps = len({(e.host, e.component) for e in eps})
    drain = sum(1 for e in eps if info(e.failure_mode).drain)
    return ("<section id='backtest'><h2>What fleethealth would have raised</h2><p>No ground truth beside the "
            "input, so nothing is scored: the incidents below are what the detectors raised over the "
            f"recording. {len(eps)} incident episodes on {comps} components; {drain} of them of a drain-worthy "
            "mode (live remediation would drain those hosts, subject to the guards).</p></section>")


def _timeline(d: ReportData, eps: list[Incident]) -> str:
    dets = (d.card or {}).get("_detections", [])
    verdicts = {x.id: x.verdict for x in dets} if d.card is not None else None
    found = {x.matched for x in dets if x.verdict == "tp"} if d.card is not None else None
    svg, drawn, total = timeline.render(eps, d.first_ts, d.last_ts, faults=d.faults, verdicts=verdicts,
                                        found=found)
    modes = {e.failure_mode for e in eps} | {f.mode for f in d.faults}
    note = "" if drawn == total else f"<p class='note'>The first {drawn} of {total} hosts (by name).</p>"
    extra = ("<li><span class='swatch fault'></span>dashed box: a fault in the ground truth; "
             "<span class='swatch fp'></span>thick black outline: a false positive</li>") if d.card else ""
    if not total:
        return ("<section id='timeline'><h2>Incident timeline per host</h2><p>No incident on any host"
                + (" and no fault in the ground truth" if d.card else "") + ".</p></section>")
    return ("<section id='timeline'><h2>Incident timeline per host</h2><p class='note'>One row per host with "
            "an incident" + (" or a fault" if d.card else "") + "; time in UTC. Hover a bar for its details."
            f"</p>{note}{svg}" + timeline.legend(modes).replace("</ul>", extra + "</ul>") + "</section>")


def _incidents(eps: list[Incident]) -> str:
    by_mode = Counter(e.failure_mode for e in eps)
    hosts_by_mode = {m: len({e.host for e in eps if e.failure_mode == m}) for m in by_mode}
    modes = [m for m in FAULT_LABELS if m in by_mode] + sorted(set(by_mode) - set(FAULT_LABELS))
    rows = []
    for e in eps[:MAX_ROWS]:
        facts = list(dict.fromkeys(ev.fact for ev in e.evidence))[:3]
        facts += [f"“{ev.line}”" for ev in e.evidence if ev.line][:1]  # the raw log line, where one exists
        rows.append([utc(e.first_seen), utc(e.last_seen), e.host, e.component, _mode_cell(e.failure_mode),
                     e.severity, "drain" if info(e.failure_mode).drain else "ticket", e.state, e.detector,
                     "; ".join(facts)[:500]])
    return ("<section id='incidents'><h2>Incidents</h2>"
            + (_table(["failure mode", "episodes", "hosts", "action"],
                      [[_mode_cell(m), by_mode[m], hosts_by_mode[m], "drain" if info(m).drain else "ticket"]
                       for m in modes]) if eps else "<p>No incidents.</p>")
            + (f"<h3>Incident episodes</h3><p class='note'>{_shown(len(eps), MAX_ROWS, 'episodes')}, in order "
               "of first sighting; times in UTC.</p>"
               + _table(["first seen", "last seen", "host", "component", "failure mode", "severity", "action",
                         "state", "detector", "evidence"], rows, cls="episodes",
                        widths=(9, 9, 9, 11, 12, 6, 5, 7, 9, 23)) if eps else "")
            + "</section>")


def _remediation(actions: Sequence[ActionRecord], host_states: Mapping[str, str] | None) -> str:
    states = Counter((host_states or {}).values())
    kinds = Counter((a.kind, a.outcome) for a in actions)
    outcome = {"dry_run": "would do (dry-run)", "queued": "queued behind a guard", "refused": "refused"}
    return ("<section id='remediation'><h2>Remediation (dry-run)</h2>"
            "<h3>Host states at the end</h3>"
            + (_table(["state", "hosts"], sorted(states.items())) if states else "<p>No host states.</p>")
            + "<h3>Actions by kind</h3>"
            + (_table(["action", "outcome", "count"], [[k.replace("_", " "), outcome.get(o, o.replace("_", " ")), n]
                                                     for (k, o), n in sorted(kinds.items())])
               if kinds else "<p>None.</p>")
            + (f"<h3>Actions</h3><p class='note'>{_shown(len(actions), MAX_ROWS, 'actions')}; times in UTC.</p>"
               + _table(["time", "host", "action", "outcome", "reason", "incident"],
                        [[utc(a.ts), a.host, a.kind.replace("_", " "), outcome.get(a.outcome, a.outcome), a.reason,
                          a.incident_id] for a in actions[:MAX_ROWS]], cls="episodes",
                        widths=(10, 10, 9, 10, 36, 25)) if actions else "")
            + "</section>")


CSS = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1240px;padding:0 1em;color:#111;
line-height:1.4}h1{margin-bottom:.2em}h2{border-bottom:2px solid #0072B2;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #BBB;padding:3px 8px;text-align:left;
vertical-align:top}thead th{background:#E8E8E8}table.facts th{background:#F2F2F2;font-weight:600}
table.episodes{table-layout:fixed;width:100%;font-size:90%}table.episodes td{overflow-wrap:anywhere}
table.cm td.cm-cell{text-align:center;min-width:2.4em;font-weight:600}table.cm th{font-size:90%}
table.cm th.cm-col{vertical-align:bottom;padding:6px 4px}table.cm th.cm-col span{writing-mode:vertical-rl;
transform:rotate(180deg);white-space:nowrap}
table.cm caption{caption-side:bottom;text-align:left;font-size:90%;color:#333;padding-top:.4em;max-width:60em}
.swatch{display:inline-block;width:.9em;height:.9em;margin-right:.35em;vertical-align:-.1em;border:1px solid #333}
.swatch.solid{background:#555}.swatch.hatched{background:repeating-linear-gradient(45deg,#555 0 3px,#FFF 3px 6px)}
.swatch.fault{border:1.5px dashed #000;background:none}.swatch.fp{border:2.5px solid #000;background:#FFF}
.badge{padding:1px 8px;border-radius:3px;font-weight:700}.note{color:#333;font-size:92%}
ul.legend{list-style:none;padding:0;columns:2}ul.legend li{margin:.15em 0}"""


def render_html(d: ReportData) -> str:
    eps = episodes(d.incidents)
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
             f"<meta name='generator' content='fleethealth report'><title>fleethealth {_e(d.command)}: "
             f"{_e(Path(d.source).name or d.source)}</title><style>{CSS}</style></head><body>"
             f"<h1>fleethealth report</h1><p class='note'>fleethealth {_e(d.command)} on {_e(d.source)}</p>",
             _summary(d, eps)]
    parts.append(_scorecard(d.card, d.faults) if d.card is not None else _backtest(eps))
    parts += [_timeline(d, eps), _incidents(eps)]
    if d.actions is not None:
        parts.append(_remediation(d.actions, d.host_states))
    parts.append("</body></html>\n")
    return "".join(parts)


def write_report(d: ReportData, out_dir: Path) -> Path:
    """Write ``out_dir/index.html`` (the folder is created) and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "index.html"
    write_atomic(path, render_html(d))
    return path
