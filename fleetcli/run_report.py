"""The HTML report of a ``fleethealth run``: summary, scorecard, incidents, actions, a timeline plot.

Pure rendering: :func:`render_html` takes a :class:`RunSummary` and returns text; :func:`write_report`
is the only function that touches files (temp file + ``os.replace``).
"""

from __future__ import annotations

import base64
import html
import io
import os
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleethealth.schema import ActionRecord, Incident


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
    scorecard: Mapping[str, Any] | None = None
    scorecard_text: str = ""
    dry_run: bool = True
    plots: Sequence[tuple[str, str]] = ()  # (title, base64 PNG) of the scorecard, when scored


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:.0f}"
    return "" if v is None else str(v)


def _scorecard_html(card: Mapping[str, Any] | None, text: str) -> str:
    if card is None:
        return "<p>No ground truth in the input: no scorecard.</p>"
    per_mode = card.get("per_mode") or card.get("modes") or {
        k: v for k, v in card.items() if isinstance(v, Mapping)}
    out = []
    if per_mode:
        cols = sorted({c for v in per_mode.values() for c in v if not isinstance(v.get(c), Mapping | list)})
        preferred = [c for c in ("precision", "recall", "f1", "support", "median_delay_s") if c in cols]
        cols = preferred + [c for c in cols if c not in preferred]
        out.append(_table(["failure mode", *cols], [[m, *(v.get(c) for c in cols)]
                                                    for m, v in sorted(per_mode.items())]))
    scalars = [(k, v) for k, v in card.items() if not isinstance(v, Mapping | list)]
    if scalars:
        out.append(_table(["measure", "value"], scalars))
    if text:
        out.append(f"<pre>{html.escape(text)}</pre>")
    return "".join(out)


def _timeline_png(incidents: Sequence[Incident]) -> str:
    """Incidents over stream time, one row per failure mode, as a base64 PNG ('' without matplotlib)."""
    if not incidents:
        return ""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted({i.failure_mode for i in incidents})
    t0 = min(i.first_seen for i in incidents)
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(modes) + 1.2), dpi=90)
    for y, mode in enumerate(modes):
        xs = [(i.first_seen - t0) / 60 for i in incidents if i.failure_mode == mode]
        ax.scatter(xs, [y] * len(xs), s=18)
    ax.set_yticks(range(len(modes)), modes)
    ax.set_xlabel("minutes since first incident")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#eee}pre{background:#f6f6f6;padding:1em;overflow:auto}.note{color:#555}"""


def render_html(s: RunSummary, max_rows: int = 200) -> str:
    latest: dict[str, Incident] = {}
    for inc in s.incidents:
        latest[inc.id] = inc
    episodes = sorted(latest.values(), key=lambda i: (i.first_seen, i.host, i.id))
    by_mode = Counter(i.failure_mode for i in episodes)
    states = Counter(s.host_states.values())
    act = Counter((a.kind, a.outcome) for a in s.actions)
    png = _timeline_png(episodes)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>fleethealth run</title><style>{CSS}</style>"
        "</head><body><h1>fleethealth run</h1>",
        _table(["", ""], [
            ["input", s.source], ["hosts", s.hosts], ["samples", s.samples],
            ["stream time covered (s)", s.stream_span_s], ["wall time (s)", s.wall_s],
            ["samples / s (wall)", s.samples / s.wall_s if s.wall_s > 0 else 0.0],
            ["incident episodes", len(episodes)], ["actions", len(s.actions)],
            ["dead-lettered messages", s.dead_letters],
            ["remediation", "dry-run (nothing drained)" if s.dry_run else "live"],
        ]),
        "<h2>Scorecard</h2>", _scorecard_html(s.scorecard, s.scorecard_text),
        *(f"<h3>{html.escape(t)}</h3><img alt='{html.escape(t)}' src='data:image/png;base64,{b}'>" for t, b in s.plots),
        "<h2>Host states at the end</h2>",
        _table(["state", "hosts"], sorted(states.items())),
        "<h2>Incidents by failure mode</h2>", _table(["failure mode", "episodes"], sorted(by_mode.items())),
    ]
    if png:
        parts.append(f"<img alt='incident timeline' src='data:image/png;base64,{png}'>")
    parts += [
        "<h2>Remediation actions</h2>", _table(["kind", "outcome", "count"], [[k, o, n] for (k, o), n in
                                                                             sorted(act.items())]),
        f"<h2>Incident episodes</h2><p class='note'>first {max_rows} of {len(episodes)}</p>",
        _table(["first seen", "host", "component", "failure mode", "severity", "state", "detector", "evidence"],
               [[i.first_seen, i.host, i.component, i.failure_mode, i.severity, i.state, i.detector,
                 "; ".join(e.fact for e in i.evidence[:3])] for i in episodes[:max_rows]]),
        f"<h2>Actions</h2><p class='note'>first {max_rows} of {len(s.actions)}</p>",
        _table(["ts", "host", "kind", "outcome", "reason", "incident"],
               [[a.ts, a.host, a.kind, a.outcome, a.reason, a.incident_id] for a in s.actions[:max_rows]]),
        "</body></html>\n",
    ]
    return "".join(parts)


def write_report(s: RunSummary, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "index.html"
    fd, tmp = tempfile.mkstemp(prefix=".index.html.", dir=out_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(render_html(s))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
