"""A benchmark figure and the table `make bench` prints."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    area: str
    figure: str
    value: float
    unit: str
    covers: str = ""  # what fleet size / conditions this figure covers


def machine() -> str:
    return f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, Python {platform.python_version()}"


def render(rows: list[Row]) -> str:
    head = ("area", "figure", "value", "unit", "what it covers")
    cells = [head] + [(r.area, r.figure, _fmt(r.value), r.unit, r.covers) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = [" | ".join(c[i].ljust(widths[i]) if i != 2 else c[i].rjust(widths[i]) for i in range(len(head)))
             for c in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.4f}"
