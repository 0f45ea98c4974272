"""The scorecard as a self-contained HTML page: plots embedded as base64 PNG (matplotlib, Agg).

* a timeline per host: truth faults as bars, detections as markers (colour = failure mode);
* a confusion matrix: truth mode (rows, plus "none" for false positives) vs detected mode;
* per-mode precision / recall bars.
Written to ``DIR/index.html`` through a temp file and ``os.replace``.
"""

from __future__ import annotations

import base64
import html
import io
import os
from pathlib import Path
from typing import Any

from detectors.scoring.scoring import DetectionRun, TruthFault, format_scorecard
from fleethealth.taxonomy import FAULT_LABELS

MAX_TIMELINE_HOSTS = 60


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _colors(modes: list[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return {m: cmap(i % 20) for i, m in enumerate(modes)}


def timeline(card: dict[str, Any], truth: list[TruthFault], res: DetectionRun) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dets = card["_detections"]
    hosts = sorted({f.host for f in truth} | {d.host for d in dets})[:MAX_TIMELINE_HOSTS]
    row = {h: i for i, h in enumerate(hosts)}
    col = _colors(list(FAULT_LABELS))
    t0 = res.first_ts or min([f.onset for f in truth] + [d.first_seen for d in dets] + [0.0])
    fig, ax = plt.subplots(figsize=(12, max(3, 0.25 * len(hosts) + 1)))
    for f in truth:
        if f.host in row:
            ax.barh(row[f.host], (f.end - f.onset) / 3600, left=(f.onset - t0) / 3600, height=0.6,
                    color=col[f.mode], alpha=0.35)
    for d in dets:
        if d.host in row:
            ax.plot((d.first_seen - t0) / 3600, row[d.host], marker="x" if d.verdict == "fp" else "|",
                    color="red" if d.verdict == "fp" else col.get(d.mode, "k"), markersize=9)
    ax.set_yticks(range(len(hosts)), hosts, fontsize=6)
    ax.set_xlabel("hours since the start of the recording")
    ax.set_title("faults (bars) vs detections (| matched, red x false positive)")
    used = sorted({f.mode for f in truth})
    if used:  # a fleet with no fault (a driver roll-out) has only detections to show, if any
        ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=col[m], alpha=0.5) for m in used], labels=used,
                  fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig)


def confusion(card: dict[str, Any], truth: list[TruthFault]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    by_id = {f.id: f for f in truth}
    modes = [m for m in FAULT_LABELS if m in card["modes"]]
    rows = [*modes, "none"]
    idx = {m: i for i, m in enumerate(modes)}
    mat = np.zeros((len(rows), len(modes)), dtype=int)
    for d in card["_detections"]:
        if d.mode not in idx:
            continue
        f = by_id.get(d.matched)
        r = idx.get(f.mode, len(modes)) if f is not None else len(modes)
        mat[r, idx[d.mode]] += 1
    fig, ax = plt.subplots(figsize=(max(5, 0.45 * len(modes) + 2), max(4, 0.4 * len(rows) + 2)))
    ax.imshow(np.log1p(mat), cmap="Blues")
    for (i, j), v in np.ndenumerate(mat):
        if v:
            ax.text(j, i, str(v), ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(modes)), modes, rotation=70, fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_xlabel("detected mode")
    ax.set_ylabel("truth mode of the matched fault")
    ax.set_title("confusion matrix (detections)")
    return _png(fig)


def bars(card: dict[str, Any]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    modes = list(card["modes"])
    x = np.arange(len(modes))
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(modes) + 2), 4))
    ax.bar(x - 0.2, [card["modes"][m]["precision"] for m in modes], 0.4, label="precision")
    ax.bar(x + 0.2, [card["modes"][m]["recall"] for m in modes], 0.4, label="recall")
    ax.axhline(0.95, color="grey", lw=0.8, ls="--")
    ax.set_xticks(x, modes, rotation=70, fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    ax.set_title("per failure mode")
    return _png(fig)


def write_report(out_dir: Path, card: dict[str, Any], truth: list[TruthFault], res: DetectionRun) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    imgs = [("Timeline", timeline(card, truth, res)), ("Confusion matrix", confusion(card, truth)),
            ("Precision and recall", bars(card))]
    fps = "".join(f"<tr><td>{html.escape(f['host'])}</td><td>{html.escape(f['component'])}</td>"
                  f"<td>{f['failure_mode']}</td><td>{f['first_seen']:.0f}</td><td>{html.escape(f['detector'])}</td></tr>"
                  for f in card.get("false_positive_examples", []))
    body = (f"<h1>fleethealth replay scorecard</h1><p>{html.escape(str(card.get('recording', '')))}: "
            f"{card.get('samples', 0)} samples, {card['faults']} faults, {card['detections']} detections</p>"
            f"<pre>{html.escape(format_scorecard(card))}</pre>"
            + "".join(f"<h2>{t}</h2><img alt='{t}' src='data:image/png;base64,{b}'>" for t, b in imgs)
            + "<h2>False positives</h2><table border=1 cellspacing=0><tr><th>host</th><th>component</th>"
              f"<th>mode</th><th>first seen</th><th>detector</th></tr>{fps}</table>")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>fleethealth scorecard</title>"
            f"<style>body{{font-family:sans-serif;margin:2em}}img{{max-width:100%}}</style></head>"
            f"<body>{body}</body></html>")
    path = out_dir / "index.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, path)
    return path
