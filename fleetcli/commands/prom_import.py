"""``fleethealth import prometheus``: a fleet's DCGM / node_exporter history -> a contract recording.

Reads every series the mapping table (``parsers/prom_map.tsv``) names through
Prometheus' HTTP API (``/api/v1/series`` to size the work, ``/api/v1/query_range`` in bounded
chunks), groups them per host (``Hostname`` label, else ``instance`` without its port) and per GPU
(``gpu`` / ``UUID`` / ``pci_bus_id``), and writes one contract sample per host per step to a
``.jsonl.gz`` recording that ``fleethealth replay FILE --report DIR`` judges. The last-value Xid
gauge becomes events through the one :class:`XidGaugeTracker`.

Bounded memory: a chunk holds at most ``max_points`` points (series x steps). Resumable: after each
chunk the output is flushed (one gzip member per chunk) and ``OUT.progress.json`` records where to
go on, the output's size, the per-host sequence numbers and the Xid tracker state; the same
command again continues from there (a torn tail past the recorded size is cut off). Every failure
a user can fix — wrong URL, not a Prometheus, refused credentials, no matching series, a bad time —
is one :class:`UserError` line (exit 2).
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleethealth import __version__
from fleethealth.errors import UserError
from fleethealth.schema import Sample, encode
from parsers.prom_map import PromMap, Series, build_resolved, host_of, load_map, resolve
from parsers.prom_xid import XidGaugeTracker

MAX_POINTS_PER_SERIES = 11_000  # Prometheus refuses a range query above this many steps per series
_DUR = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)?$")
_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}


def parse_duration(text: str) -> float:
    m = _DUR.match(text.strip())
    if not m:
        raise UserError(f"{text!r} is not a duration (e.g. 30s, 5m, 1h, 30d)")
    return float(m.group(1)) * _UNIT[m.group(2)]


def parse_time(text: str, now: float | None = None) -> float:
    """``now``, ``now-30d``, unix seconds or ISO 8601 (``2026-11-01T00:00:00Z``) -> unix seconds."""
    t = text.strip()
    now = time.time() if now is None else now
    if t == "now":
        return now
    if t.startswith("now-"):
        return now - parse_duration(t[4:])
    try:
        return float(t)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"{text!r} is not a time: use now, now-30d, unix seconds or 2026-11-01T00:00:00Z") from None
    if dt.tzinfo is None:
        raise UserError(f"{text!r} has no time zone: add Z (UTC) or +HH:MM")
    return dt.timestamp()


class PromClient:
    """The two Prometheus HTTP API calls the importer needs, with auth and one-line errors."""

    def __init__(self, url: str, *, timeout: float = 30.0, bearer_token: str | None = None,
                 basic_auth: str | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise UserError(f"--url {url!r}: give Prometheus' base URL, e.g. http://prometheus:9090")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.headers = {"Accept": "application/json", "User-Agent": f"fleethealth/{__version__}"}
        if bearer_token and basic_auth:
            raise UserError("give --bearer-token or --basic-auth, not both")
        if bearer_token:
            self.headers["Authorization"] = f"Bearer {bearer_token}"
        elif basic_auth:
            if ":" not in basic_auth:
                raise UserError("--basic-auth must be USER:PASSWORD")
            self.headers["Authorization"] = "Basic " + base64.b64encode(basic_auth.encode()).decode()
        self.requests = 0

    def get(self, path: str, params: list[tuple[str, str]]) -> Any:
        body = urllib.parse.urlencode(params).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=body, headers={
            **self.headers, "Content-Type": "application/x-www-form-urlencoded"})
        self.requests += 1
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - the user's URL
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise UserError(f"Prometheus at {self.url} refused the credentials (HTTP {exc.code}): "
                                "check --bearer-token / --basic-auth") from None
            if exc.code in (404, 405, 501):
                raise UserError(f"{self.url} is not a Prometheus API (HTTP {exc.code} for {path}): give the server's "
                                "base URL, e.g. http://prometheus:9090") from None
            detail = _error_text(exc.read())
            raise UserError(f"Prometheus at {self.url} answered HTTP {exc.code} for {path}"
                            + (f": {detail}" if detail else "")) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise UserError(f"cannot reach Prometheus at {self.url}: {getattr(exc, 'reason', exc)}") from None
        try:
            doc = json.loads(raw)
        except ValueError:
            raise UserError(f"{self.url}{path} did not answer JSON: is this Prometheus?") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise UserError(f"Prometheus at {self.url} answered an error for {path}: {_error_text(raw)}")
        return doc.get("data")

    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        data = self.get("/api/v1/series", [("match[]", match), ("start", f"{start:.3f}"), ("end", f"{end:.3f}")])
        return [d for d in data or [] if isinstance(d, dict)]

    def query_range(self, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query_range", [("query", query), ("start", f"{start:.3f}"), ("end", f"{end:.3f}"),
                                                 ("step", f"{step:g}")])
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise UserError(f"Prometheus at {self.url} answered a {data.get('resultType') if isinstance(data, dict) else '?'}"
                            " for a range query, not a matrix")
        return list(data.get("result") or [])


def _error_text(raw: bytes) -> str:
    try:
        d = json.loads(raw)
        return " ".join(str(d.get("error") or d).split())[:300]
    except ValueError:
        return " ".join(re.sub(r"<[^>]*>", " ", raw[:2000].decode("utf-8", "replace")).split())[:200]


def default_matches(table: PromMap) -> list[str]:
    return [f'{{__name__=~"{table.name_regex("DCGM_")}"}}', f'{{__name__=~"{table.name_regex("node_")}"}}']


@dataclass
class ImportSpec:
    url: str
    start: float
    end: float
    step: float = 60.0
    matches: list[str] = field(default_factory=list)
    cluster: str = "default"
    host_labels: tuple[str, ...] = ("Hostname", "instance")
    max_points: int = 200_000

    def key(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("max_points")
        d["host_labels"] = list(self.host_labels)
        return d


@dataclass
class ImportStats:
    series: int = 0
    points: int = 0
    samples: int = 0
    hosts: int = 0
    chunks: int = 0
    requests: int = 0
    xid_events: int = 0
    skipped_values: int = 0
    unhosted_series: int = 0
    seconds: float = 0.0
    resumed_from: float | None = None
    peak_chunk_points: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_import(spec: ImportSpec, out: Path, client: PromClient, *, table: PromMap | None = None,
               progress: Callable[[int], None] | None = None, total: Callable[[int], None] | None = None,
               force: bool = False, stop_after_chunks: int | None = None) -> ImportStats:
    """Import ``spec`` into ``out`` (resuming a previous run of the same spec); see the module doc."""
    table = table or load_map()
    if spec.end <= spec.start:
        raise UserError("--end must be after --start")
    if spec.step <= 0:
        raise UserError("--step must be positive")
    if not out.name.endswith(".jsonl.gz"):
        raise UserError(f"--out {out}: the recording must end in .jsonl.gz")
    matches = spec.matches or default_matches(table)
    t0 = time.perf_counter()
    st = ImportStats()
    prog_path = out.with_name(out.name + ".progress.json")
    state = _load_progress(prog_path, spec) if not force else None
    if out.exists() and state is None and not force:
        raise UserError(f"{out} exists and is not a resumable import of the same query: remove it or pass --force")
    if state is not None and state.get("done"):
        st.samples, st.points = state.get("samples", 0), state.get("points", 0)
        return st
    n_series = 0
    for m in matches:
        n_series += len(client.series(m, spec.start, spec.end))
    if n_series == 0:
        raise UserError(f"no DCGM or node_exporter series in Prometheus at {client.url} between "
                        f"{_iso(spec.start)} and {_iso(spec.end)}" + (f" matching {' '.join(spec.matches)}"
                                                                       if spec.matches else "")
                        + ": is dcgm-exporter (or node_exporter) scraped there?")
    st.series = n_series
    steps_per_chunk = max(1, min(MAX_POINTS_PER_SERIES, spec.max_points // max(n_series, 1)))
    n_steps = int(math.floor((spec.end - spec.start) / spec.step)) + 1
    if total:
        total(n_steps)
    seq: dict[str, int] = {}
    trackers: dict[str, XidGaugeTracker] = {}
    next_i = 0
    mode = "wb"
    if state is not None:
        next_i = int(state["next_step"])
        seq = {str(k): int(v) for k, v in state["seq"].items()}
        trackers = {h: XidGaugeTracker.from_json(j) for h, j in state["xid"].items()}
        st.samples, st.points = int(state.get("samples", 0)), int(state.get("points", 0))
        st.resumed_from = spec.start + next_i * spec.step
        with open(out, "r+b") as fh:  # cut off what a killed run wrote after its last checkpoint
            fh.truncate(int(state["bytes"]))
        mode = "ab"
        if progress and next_i:
            progress(next_i)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, mode) as fh:
        while next_i < n_steps:
            i1 = min(n_steps, next_i + steps_per_chunk)
            c_start, c_end = spec.start + next_i * spec.step, spec.start + (i1 - 1) * spec.step
            buckets: dict[float, dict[str, list[tuple[Series, float]]]] = {}
            chunk_points = 0
            for m in matches:
                for series in client.query_range(m, c_start, c_end, spec.step):
                    labels = {str(k): str(v) for k, v in (series.get("metric") or {}).items()}
                    name = labels.pop("__name__", "")
                    host = host_of(labels, spec.host_labels)
                    if not host or not name:
                        st.unhosted_series += 1
                        continue
                    sr = resolve(table, name, labels)
                    if sr is None:  # a --match selector may bring series the table does not map
                        continue
                    for ts, val in series.get("values") or ():
                        try:
                            v = float(val)
                        except (TypeError, ValueError):
                            st.skipped_values += 1
                            continue
                        by_host = buckets.get(ts)
                        if by_host is None:
                            by_host = buckets[ts] = {}
                        pts = by_host.get(host)
                        if pts is None:
                            pts = by_host[host] = []
                        pts.append((sr, v))
                        chunk_points += 1
            st.points += chunk_points
            st.peak_chunk_points = max(st.peak_chunk_points, chunk_points)
            lines: list[bytes] = []
            for ts_key in sorted(buckets):
                ts = round(float(ts_key), 3)
                for host in sorted(buckets[ts_key]):
                    parts = build_resolved(buckets[ts_key][host], table)
                    st.skipped_values += parts.skipped
                    tr = trackers.get(host)
                    if tr is None:
                        tr = trackers[host] = XidGaugeTracker()
                    st.xid_events += tr.apply(parts, ts)
                    s = Sample(host=host, cluster=spec.cluster, ts=ts, seq=seq.get(host, 0),
                               collector_version=f"import-prometheus/{__version__}", boot_id=parts.boot_id,
                               driver_version=parts.driver_version, gpus=parts.gpus, net_ports=parts.net_ports,
                               edac=parts.edac)
                    seq[host] = s.seq + 1
                    lines.append(encode(s))
            del buckets
            if lines:
                with gzip.GzipFile(fileobj=fh, mode="wb", compresslevel=1) as gz:  # one member per chunk
                    gz.write(b"\n".join(lines) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
            st.samples += len(lines)
            st.chunks += 1
            if progress:
                progress(i1 - next_i)
            next_i = i1
            _save_progress(prog_path, spec, next_i, fh.tell(), seq, trackers, st, done=next_i >= n_steps)
            if stop_after_chunks is not None and st.chunks >= stop_after_chunks and next_i < n_steps:
                break
    st.hosts = len(seq)
    st.requests = client.requests
    st.seconds = time.perf_counter() - t0
    return st


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _load_progress(path: Path, spec: ImportSpec) -> dict[str, Any] | None:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict) or d.get("spec") != spec.key():
        return None
    return d


def _save_progress(path: Path, spec: ImportSpec, next_step: int, size: int, seq: dict[str, int],
                   trackers: dict[str, XidGaugeTracker], st: ImportStats, done: bool) -> None:
    d = {"spec": spec.key(), "next_step": next_step, "bytes": size, "seq": seq, "done": done,
         "xid": {h: t.to_json() for h, t in trackers.items()}, "samples": st.samples, "points": st.points}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(d))
    os.replace(tmp, path)


# --------------------------------------------------------------------------- the command

IMPORT_HELP = """\
Read a fleet's dcgm-exporter and node_exporter history out of Prometheus into a contract recording,
then ask what fleethealth would have raised:

  fleethealth import prometheus --url http://prometheus:9090 --start now-30d --end now --out last-month.jsonl.gz
  fleethealth replay last-month.jsonl.gz --report backtest/

Range queries run in chunks of at most --max-points points (series x steps); the same command
again resumes an interrupted import (OUT.progress.json). Hosts come from the Hostname label
(dcgm-exporter), else instance without its port; --match replaces the default selectors (every
series the mapping table parsers/prom_map.tsv names). Exit 2 with one line for a wrong
URL, refused credentials or no matching series.
"""


def register(sub: Any) -> None:
    from fleethealth.cliutil import flag

    imp = sub.add_parser("import", help="import telemetry history from another system (Prometheus)",
                         description=IMPORT_HELP, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    isub = imp.add_subparsers(dest="import_source", metavar="SOURCE")
    p = isub.add_parser("prometheus", help="DCGM / node_exporter series from Prometheus' HTTP API",
                        description=IMPORT_HELP, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    flag(p, "--url", env="FLEETHEALTH_PROM_URL", required="FLEETHEALTH_PROM_URL" not in os.environ,
         help="Prometheus base URL, e.g. http://prometheus:9090")
    flag(p, "--start", required=True, help="now-30d, unix seconds or 2026-11-01T00:00:00Z")
    flag(p, "--end", default="now", help="as --start")
    flag(p, "--step", default="60s", help="one sample per host per step (30s, 1m, 5m)")
    p.add_argument("--match", action="append", default=[], metavar="SELECTOR",
                   help='PromQL series selector, repeatable (default: every mapped DCGM_ and node_ series), '
                        'e.g. --match \'{__name__=~"DCGM_.*",cluster="a"}\'')
    flag(p, "--out", required=True, help="recording to write (.jsonl.gz)")
    flag(p, "--cluster", default="default", help="cluster name in the samples")
    flag(p, "--host-label", default="Hostname,instance", help="labels naming the host, first present wins")
    flag(p, "--max-points", type=int, default=200_000, help="points held in memory per chunk (series x steps)")
    flag(p, "--timeout", type=float, default=60.0, help="seconds per HTTP request")
    # secrets: read from the environment, never echoed by --help
    p.add_argument("--bearer-token", default=os.environ.get("FLEETHEALTH_PROM_BEARER_TOKEN"), metavar="TOKEN",
                   help="Authorization: Bearer TOKEN [env: FLEETHEALTH_PROM_BEARER_TOKEN]")
    p.add_argument("--basic-auth", default=os.environ.get("FLEETHEALTH_PROM_BASIC_AUTH"), metavar="USER:PASSWORD",
                   help="HTTP basic auth [env: FLEETHEALTH_PROM_BASIC_AUTH]")
    flag(p, "--force", action="store_true", help="overwrite OUT instead of resuming")
    flag(p, "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_import_prometheus)
    imp.set_defaults(func=lambda _a: (imp.print_help(), 2)[1])


def cmd_import_prometheus(args: Any) -> int:
    import sys

    from tqdm import tqdm

    if args.max_points < 1:
        raise UserError("--max-points must be at least 1")
    spec = ImportSpec(url=args.url, start=parse_time(args.start), end=parse_time(args.end),
                      step=parse_duration(args.step), matches=list(args.match), cluster=args.cluster,
                      host_labels=tuple(x.strip() for x in args.host_label.split(",") if x.strip()),
                      max_points=args.max_points)
    client = PromClient(args.url, timeout=args.timeout, bearer_token=args.bearer_token, basic_auth=args.basic_auth)
    bar = tqdm(unit="steps", file=sys.stderr, disable=args.quiet or not sys.stderr.isatty(), desc="import")
    try:
        st = run_import(spec, Path(args.out), client, progress=bar.update,
                        total=lambda n: setattr(bar, "total", n), force=args.force)
    finally:
        bar.close()
    rate = st.points / st.seconds if st.seconds else 0.0
    print(f"imported {st.samples} host-samples ({st.points} points from {st.series} series, {st.hosts} hosts, "
          f"{st.xid_events} Xid events) to {args.out} in {st.seconds:.1f} s ({rate:.0f} points/s)"
          + (f"; resumed at {_iso(st.resumed_from)}" if st.resumed_from else ""))
    print(f"next: fleethealth replay {args.out} --report DIR")
    return 0
