"""Scrape sources: a local dcgm-exporter or node_exporter instead of NVML / the sysfs readers.

``fleethealth collect --source dcgm-exporter=http://127.0.0.1:9400/metrics`` fills the sample's
``gpus`` from dcgm-exporter's text; ``--source node-exporter=http://127.0.0.1:9100/metrics`` fills
``net_ports`` (InfiniBand / RoCE), ``edac`` and the boot id from node_exporter's. Both read the one
mapping table (``parsers/prom_map.tsv``) through :func:`parsers.prom_map.build`,
so a series means the same here, in ``diagnose`` and in ``fleethealth import prometheus``.

Each scrape has a deadline (``timeout``); a failed scrape raises :class:`ScrapeError`, which the
daemon records as a ``SourceError`` on the sample and counts (the other sources still report).
dcgm-exporter's last-value Xid gauge becomes events through the one
:class:`~parsers.prom_xid.XidGaugeTracker`, whose state is saved in the state folder
after every scrape, so a collector restart neither repeats an old Xid nor misses a change.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from fleethealth.schema import Sample
from parsers.prom import parse_metrics
from parsers.prom_map import PromMap, build, load_map
from parsers.prom_xid import XidGaugeTracker

log = logging.getLogger(__name__)

KINDS = ("dcgm-exporter", "node-exporter")
MAX_SCRAPE_BYTES = 32 << 20


class ScrapeError(RuntimeError):
    """The exporter did not answer, answered an error, or sent something that is not metrics text."""


def fetch_text(url: str, timeout: float, max_bytes: int = MAX_SCRAPE_BYTES) -> str:
    req = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the operator's URL
            data = resp.read(max_bytes + 1)
    except urllib.error.HTTPError as exc:
        raise ScrapeError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ScrapeError(f"{url}: {getattr(exc, 'reason', exc)}") from None
    if len(data) > max_bytes:
        raise ScrapeError(f"{url}: more than {max_bytes >> 20} MiB of metrics")
    return data.decode("utf-8", "replace")


@dataclass
class ScrapeStats:
    scrapes: int = 0
    errors: int = 0
    skipped_values: int = 0
    xid_events: int = 0


class PromScrapeSource:
    """One exporter, scraped once per poll. ``fill(sample)`` is the daemon's source hook."""

    def __init__(self, kind: str, url: str, *, timeout: float = 5.0, state_dir: str | Path | None = None,
                 table: PromMap | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown scrape source {kind!r}; one of {', '.join(KINDS)}")
        self.kind, self.url, self.timeout = kind, url, timeout
        self.name = kind
        # the builtin readers this source stands in for (the daemon skips them)
        self.replaces: tuple[str, ...] = ("nvml",) if kind == "dcgm-exporter" else ("infiniband", "edac")
        self.table = table or load_map()
        self.stats = ScrapeStats()
        self._state = Path(state_dir) / "xid-gauge-state.json" if state_dir and kind == "dcgm-exporter" else None
        self.tracker = self._load_tracker()

    def _load_tracker(self) -> XidGaugeTracker:
        if self._state is None:
            return XidGaugeTracker()
        try:
            return XidGaugeTracker.from_json(json.loads(self._state.read_text()))
        except (OSError, ValueError):
            return XidGaugeTracker()

    def _save_tracker(self) -> None:
        if self._state is None:
            return
        tmp = self._state.with_name(self._state.name + ".tmp")
        try:
            tmp.write_text(json.dumps(self.tracker.to_json()))
            os.replace(tmp, self._state)
        except OSError as exc:  # the next restart may repeat one Xid; the poll goes on
            log.warning("cannot save the Xid gauge state", extra={"path": str(self._state), "error": str(exc)})

    def fill(self, sample: Sample) -> None:
        self.stats.scrapes += 1
        try:
            text = fetch_text(self.url, self.timeout)
        except ScrapeError:
            self.stats.errors += 1
            raise
        readings, bad_lines = parse_metrics(text)
        if not readings:
            self.stats.errors += 1
            raise ScrapeError(f"{self.url}: no Prometheus sample lines in the answer")
        parts = build(readings, self.table, evidence=False)
        self.stats.skipped_values += bad_lines + parts.skipped
        if self.kind == "dcgm-exporter":
            self.stats.xid_events += self.tracker.apply(parts, sample.ts)
            self._save_tracker()
            sample.gpus = parts.gpus
            if parts.driver_version and not sample.driver_version:
                sample.driver_version = parts.driver_version
        else:
            sample.net_ports, sample.edac = parts.net_ports, parts.edac
            if parts.boot_id:
                sample.boot_id = parts.boot_id

    def close(self) -> None:
        self._save_tracker()


def parse_source_spec(spec: str) -> tuple[str, str]:
    """``dcgm-exporter=URL`` -> (kind, URL); raises ValueError with what to write instead."""
    kind, sep, url = spec.partition("=")
    if not sep or kind not in KINDS:
        raise ValueError(f"--source {spec!r}: use dcgm-exporter=URL or node-exporter=URL")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--source {spec!r}: the URL must start with http:// or https://")
    return kind, url
