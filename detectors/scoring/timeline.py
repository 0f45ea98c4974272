"""The report's incident timeline: one row per host, time (UTC) across, as inline SVG (no script,
no external file, so the page opens offline).

An incident episode is a bar from its first to its last sighting in its family's colour (solid when
the mode is drain-worthy, hatched when it only opens a ticket), labelled with the mode where the bar
is wide enough; a false positive (scored runs) has a thick black outline. A ground-truth fault is a
dashed box behind the bars. Every mark carries a ``<title>`` (the tooltip) with the details.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from detectors.scoring.palette import FAMILIES, mode_colour, text_on
from fleethealth.schema import Incident
from fleethealth.taxonomy import info

WIDTH = 1200
LABEL_W = 190  # room for the host names on the left
ROW_H = 24
AXIS_H = 34
BAR_H = 14
MIN_BAR_W = 6.0  # an episode seen once is still a visible mark
CHAR_W = 6.6  # px per character of the 11 px label font, to decide whether a label fits in its bar
STEPS_S = (60, 300, 600, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400)


def utc(ts: float) -> str:
    """``2026-12-01 17:04:05 UTC``: the one way the report writes a time."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _tick_step(span: float, max_ticks: int = 10) -> int:
    return next((s for s in STEPS_S if span / s <= max_ticks), STEPS_S[-1])


def _esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _hatch_id(colour: str) -> str:
    return "hatch-" + colour.lstrip("#")


def _defs() -> str:
    pats = []
    for _, colour, _ in FAMILIES:
        pats.append(f'<pattern id="{_hatch_id(colour)}" width="6" height="6" patternUnits="userSpaceOnUse" '
                    f'patternTransform="rotate(45)"><rect width="6" height="6" fill="#FFFFFF"/>'
                    f'<rect width="3.5" height="6" fill="{colour}"/></pattern>')
    return "<defs>" + "".join(pats) + "</defs>"


def render(episodes: Sequence[Incident], t0: float, t1: float, *, faults: Sequence[Any] = (),
           verdicts: dict[str, str] | None = None, found: set[str] | None = None,
           max_hosts: int = 100) -> tuple[str, int, int]:
    """(svg, hosts drawn, hosts with something to draw). ``faults`` are scoring's ``TruthFault``s;
    ``verdicts`` maps an incident id to tp / secondary / precursor / fp, ``found`` holds the ids of
    the faults a detection matched (scored runs only; a fault not in it is labelled "missed")."""
    lo = min([t0, *(e.first_seen for e in episodes), *(f.onset for f in faults)])
    hi = max([t1, *(e.last_seen for e in episodes), *(min(f.end, t1 or f.end) for f in faults)])
    if hi <= lo:
        hi = lo + 60.0
    hosts_all = sorted({e.host for e in episodes} | {f.host for f in faults})
    hosts = hosts_all[:max_hosts]
    row = {h: i for i, h in enumerate(hosts)}
    plot_w = WIDTH - LABEL_W - 20
    height = AXIS_H + ROW_H * max(1, len(hosts)) + 8

    def x(ts: float) -> float:
        return LABEL_W + (ts - lo) / (hi - lo) * plot_w

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" id="timeline-svg" role="img" width="100%" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="system-ui,sans-serif" font-size="12">',
           "<title>Incident timeline per host (time in UTC)</title>", _defs()]
    step = _tick_step(hi - lo)
    first_tick = (int(lo) // step + 1) * step
    last_day = ""
    for ts in range(first_tick, int(hi) + 1, step):
        d = datetime.fromtimestamp(ts, UTC)
        day = d.strftime("%Y-%m-%d")
        label = d.strftime("%H:%M") if day == last_day else d.strftime("%m-%d %H:%M")
        last_day = day
        xx = x(ts)
        out.append(f'<line x1="{xx:.1f}" y1="{AXIS_H - 4}" x2="{xx:.1f}" y2="{height - 8}" stroke="#D0D0D0"/>'
                   f'<text x="{xx:.1f}" y="{AXIS_H - 8}" text-anchor="middle" fill="#222222">{label}</text>')
    out.append(f'<text x="{LABEL_W - 8}" y="{AXIS_H - 8}" text-anchor="end" fill="#222222" '
               f'font-weight="bold">host \u2193 / time (UTC) \u2192</text>')
    for h, i in row.items():
        y = AXIS_H + i * ROW_H
        out.append(f'<g class="host-row" data-host="{_esc(h)}">'
                   + (f'<rect x="0" y="{y}" width="{WIDTH}" height="{ROW_H}" fill="#F4F4F4"/>' if i % 2 else "")
                   + f'<text x="{LABEL_W - 8}" y="{y + ROW_H / 2 + 4}" text-anchor="end" fill="#000000">'
                     f'{_esc(h)}</text>')
        for f in (f for f in faults if f.host == h):
            fx, fw = x(f.onset), max(3.0, x(min(f.end, hi)) - x(f.onset))
            out.append(f'<rect class="fault" x="{fx:.1f}" y="{y + 2}" width="{fw:.1f}" height="{ROW_H - 4}" '
                       f'fill="none" stroke="#000000" stroke-width="1.2" stroke-dasharray="4 3">'
                       f'<title>fault (ground truth): {_esc(f.mode)} on {_esc(f.component)}, '
                       f'{utc(f.onset)} to {utc(f.end)}</title></rect>')
            if found is not None and f.id not in found and fw > CHAR_W * (len(f.mode) + 8) + 8:
                out.append(f'<text class="missed" x="{fx + 4:.1f}" y="{y + ROW_H / 2 + 4:.1f}" font-size="11" '
                           f'fill="#000000">missed: {_esc(f.mode)}</text>')
        row_eps = sorted((e for e in episodes if e.host == h), key=lambda e: e.first_seen)
        label_end = 0.0  # right edge of the last label drawn on this row: labels never overlap
        for k, e in enumerate(row_eps):
            colour = mode_colour(e.failure_mode)
            drain = info(e.failure_mode).drain if e.failure_mode != "healthy" else False
            fill = colour if drain else f"url(#{_hatch_id(colour)})"
            verdict = (verdicts or {}).get(e.id, "")
            bx, bw = x(e.first_seen), max(MIN_BAR_W, x(e.last_seen) - x(e.first_seen))
            by = y + (ROW_H - BAR_H) / 2
            stroke = ' stroke="#000000" stroke-width="2.5"' if verdict == "fp" else ' stroke="#000000" stroke-width="0.6"'
            tip = (f"{e.failure_mode} on {e.component} ({e.severity}, {'drain' if drain else 'ticket'}), "
                   f"{utc(e.first_seen)} to {utc(e.last_seen)}; {e.detector}"
                   + (f"; {'FALSE POSITIVE' if verdict == 'fp' else verdict}" if verdict else ""))
            out.append(f'<rect class="episode" data-mode="{_esc(e.failure_mode)}" x="{bx:.1f}" y="{by:.1f}" '
                       f'width="{bw:.1f}" height="{BAR_H}" fill="{fill}"{stroke}><title>{_esc(tip)}</title></rect>')
            label = e.failure_mode + (" (false positive)" if verdict == "fp" else "")
            text_w = CHAR_W * len(label) + 8
            nxt = x(row_eps[k + 1].first_seen) if k + 1 < len(row_eps) else WIDTH
            if bw > text_w and bx >= label_end:  # inside the bar
                ink = text_on(colour) if drain else "#000000"
                bg = "" if drain else (f'<rect x="{bx + 2:.1f}" y="{by + 1:.1f}" width="{text_w - 4:.1f}" '
                                       f'height="{BAR_H - 2}" fill="#FFFFFF"/>')
                out.append(f'{bg}<text x="{bx + 4:.1f}" y="{by + BAR_H - 3:.1f}" font-size="11" fill="{ink}">'
                           f'{_esc(label)}</text>')
                label_end = bx + text_w
            elif bx + bw + text_w <= min(nxt, WIDTH) and bx + bw >= label_end:  # beside it, on the right
                out.append(f'<text x="{bx + bw + 4:.1f}" y="{by + BAR_H - 3:.1f}" font-size="11" '
                           f'fill="#000000">{_esc(label)}</text>')
                label_end = bx + bw + text_w
            elif bx - text_w >= max(label_end, LABEL_W):  # no room on the right (the end of the axis): left
                out.append(f'<text x="{bx - 4:.1f}" y="{by + BAR_H - 3:.1f}" font-size="11" text-anchor="end" '
                           f'fill="#000000">{_esc(label)}</text>')
                label_end = bx
            label_end = max(label_end, bx + bw)  # nor cover an earlier bar
        out.append("</g>")
    out.append("</svg>")
    return "".join(out), len(hosts), len(hosts_all)


def legend(modes_seen: set[str]) -> str:
    """An HTML legend: the colour of each family with the modes of it that appear."""
    items = []
    for name, colour, modes in FAMILIES:
        shown = [m for m in modes if m in modes_seen]
        if not shown:
            continue
        items.append(f'<li><span class="swatch" style="background:{colour}"></span><b>{_esc(name)}</b>: '
                     f'{_esc(", ".join(shown))}</li>')
    items.append('<li><span class="swatch solid"></span>solid: drain-worthy mode; '
                 '<span class="swatch hatched"></span>hatched: ticket only</li>')
    return f'<ul class="legend">{"".join(items)}</ul>'
