"""Prometheus text exposition dumps: dcgm-exporter and node_exporter (pure, lenient).

What each series means comes from the one mapping table (``prom_map.tsv``, :mod:`.prom_map`), the
same the collector's scrape sources and ``fleethealth import prometheus`` read. A sample line whose
value does not parse (dcgm-exporter prints ``ERROR - FAILED TO CONVERT TO STRING`` for some fields)
is skipped and counted; it never fails the scrape. MIG series (with a ``GPU_I_ID`` label) repeat the
parent GPU's device fields and are folded into the GPU. A series the dump does not carry leaves its
field ``None`` (not available), never 0.
"""

from __future__ import annotations

import re

from parsers.base import Parsed, ParseError, new_parsed
from parsers.prom_map import PromMap, build, load_map

FORMAT = "dcgm-exporter"
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'(?P<k>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<v>(?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> tuple[list[tuple[str, dict[str, str], float, str]], int]:
    """Every valid sample as (name, labels, value, raw line), plus the number of lines skipped."""
    samples: list[tuple[str, dict[str, str], float, str]] = []
    skipped = 0
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = _SAMPLE.match(s)
        if m is None:
            skipped += 1
            continue
        try:
            value = float(m["value"])
        except ValueError:
            skipped += 1
            continue
        labels = {lm["k"]: lm["v"] for lm in _LABEL.finditer(m["labels"] or "")}
        samples.append((m["name"], labels, value, s))
    return samples, skipped


def parse(text: str, table: PromMap | None = None) -> Parsed:
    samples, skipped = parse_metrics(text)
    if not samples:
        raise ParseError(FORMAT, "no Prometheus sample lines")
    parts = build(samples, table or load_map())
    out = new_parsed(FORMAT, parts.gpus)
    out.sample.net_ports, out.sample.edac = parts.net_ports, parts.edac
    out.sample.boot_id, out.sample.driver_version = parts.boot_id, parts.driver_version
    out.facts = parts.facts
    out.skipped_lines = skipped + parts.skipped
    if skipped:
        out.warnings.append(f"{skipped} sample line(s) with an unparseable value skipped")
    if parts.skipped:
        out.warnings.append(f"{parts.skipped} value(s) out of range or without a GPU/port label skipped")
    return out
