"""Prometheus exporter for the collector, driven by the metric catalogue ``metrics.tsv``.

:func:`parse_catalog` (pure) validates the file with file:line errors, including Prometheus
naming rules; :class:`SampleMetrics` turns the latest :class:`Sample` plus the daemon's own stats
into metric families on each scrape; :func:`start_exporter` serves them on 127.0.0.1 by default.
"""

from __future__ import annotations

import errno
import re
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleethealth.errors import UserError
from fleethealth.schema import Sample

CATALOG = Path(__file__).with_name("metrics.tsv")
COLUMNS = ("metric", "type", "unit", "source", "labels", "help")
SCOPES = {
    "gpu": ("host", "gpu", "uuid"), "port": ("host", "device", "port"), "aer": ("host", "pci"),
    "edac": ("host", "mc"), "dimm": ("host", "mc", "dimm"), "xid": ("host", "gpu", "uuid"),
    "kernel": ("host",), "collector": ("host",),
}
UNITS = {"seconds", "bytes", "celsius", "watts", "ratio", "bytes_per_second", "volts", "joules"}
_NAME = re.compile(r"^fleethealth_[a-z][a-z0-9_]*[a-z0-9]$")
_LABEL = re.compile(r"^[a-z][a-z0-9_]*$")


class CatalogError(UserError):
    pass


@dataclass(frozen=True)
class MetricSpec:
    metric: str
    type: str
    unit: str
    scope: str
    path: str
    enums: dict[str, tuple[str, ...]]  # label -> values that {label} in the path expands over
    attrs: dict[str, str]  # label -> attribute of the object (name=@attr)
    iter_label: str | None  # the [label] in the path
    help: str
    line: int

    @property
    def labels(self) -> tuple[str, ...]:
        extra = [*self.enums, *self.attrs] + ([self.iter_label] if self.iter_label else [])
        return (*SCOPES[self.scope], *extra)


def parse_catalog(text: str, source: str = "metrics.tsv") -> list[MetricSpec]:
    specs: list[MetricSpec] = []
    seen: set[str] = set()
    header = False
    for no, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.startswith("#"):
            continue
        cols = raw.split("\t")
        if not header:
            if tuple(cols) != COLUMNS:
                raise CatalogError(f"{source}:{no}: header must be {' '.join(COLUMNS)} (tab-separated)")
            header = True
            continue
        if len(cols) != len(COLUMNS):
            raise CatalogError(f"{source}:{no}: expected {len(COLUMNS)} tab-separated columns, got {len(cols)}")
        specs.append(_spec(dict(zip(COLUMNS, cols, strict=True)), source, no, seen))
    if not specs:
        raise CatalogError(f"{source}: no metrics")
    return specs


def _spec(c: dict[str, str], source: str, no: int, seen: set[str]) -> MetricSpec:
    def bad(msg: str) -> CatalogError:
        return CatalogError(f"{source}:{no}: {c['metric']}: {msg}")

    name, typ, unit = c["metric"], c["type"], c["unit"]
    if not _NAME.match(name) or "__" in name:
        raise bad("metric names are snake_case and start with fleethealth_")
    if name in seen:
        raise bad("duplicate metric")
    seen.add(name)
    if typ not in ("counter", "gauge"):
        raise bad(f"type must be counter or gauge, not {typ!r}")
    if (typ == "counter") != name.endswith("_total"):
        raise bad("counters, and only counters, end in _total")
    if unit != "-":
        if unit not in UNITS:
            raise bad(f"unit {unit!r} is not a base unit ({', '.join(sorted(UNITS))})")
        stem = name[: -len("_total")] if name.endswith("_total") else name
        if not stem.endswith("_" + unit):
            raise bad(f"a metric in {unit} must end in _{unit}")
    for wrong in ("_milliseconds", "_celsius_", "_kilo", "_mega", "_percent", "_ms"):
        if wrong in name + "_" and not (wrong == "_celsius_" and name.endswith("_celsius")):
            raise bad(f"not a base unit: {wrong.strip('_')}")
    scope, _, path = c["source"].partition(":")
    if scope not in SCOPES or not path:
        raise bad(f"source must be <scope>:<path> with scope in {', '.join(SCOPES)}")
    enums: dict[str, tuple[str, ...]] = {}
    attrs: dict[str, str] = {}
    plain: list[str] = []
    for item in filter(None, (x.strip() for x in c["labels"].split(","))) if c["labels"] != "-" else []:
        lab, eq, val = item.partition("=")
        if not _LABEL.match(lab):
            raise bad(f"bad label name {lab!r}")
        if not eq:
            plain.append(lab)
        elif val.startswith("@"):
            attrs[lab] = val[1:]
        else:
            enums[lab] = tuple(val.split("|"))
    for ph in re.findall(r"\{(\w+)\}", path):
        if ph not in enums:
            raise bad(f"placeholder {{{ph}}} has no value list in the labels column")
    m = re.search(r"\[(\w+)\]", path)
    iter_label = m.group(1) if m else (plain[0] if scope in ("xid", "kernel") and plain else None)
    return MetricSpec(name, typ, unit, scope, path, enums, attrs, iter_label, c["help"], no)


def load_catalog(path: Path = CATALOG) -> list[MetricSpec]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the metric catalogue: {exc}") from exc
    return parse_catalog(text, str(path))


# --------------------------------------------------------------------------- evaluation

def _num(v: Any) -> float | None:
    if v is None or isinstance(v, str):
        return None
    return float(v)


def _resolve(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if obj is None:
            return None
        obj = getattr(obj, part, None)
    return obj


def _expand(path: str, enums: dict[str, tuple[str, ...]]) -> Iterator[tuple[str, tuple[str, ...]]]:
    """``ecc.{location}_{type}`` -> (concrete path, enum label values) for each combination."""
    keys = list(enums)
    if not keys:
        yield path, ()
        return

    def rec(i: int, p: str, vals: tuple[str, ...]) -> Iterator[tuple[str, tuple[str, ...]]]:
        if i == len(keys):
            yield p, vals
            return
        for v in enums[keys[i]]:
            yield from rec(i + 1, p.replace("{" + keys[i] + "}", v), (*vals, v))

    yield from rec(0, path, ())


def spec_values(spec: MetricSpec, obj: Any) -> Iterator[tuple[tuple[str, ...], float]]:
    """(extra label values, value) rows of one metric for one object (a GPU, a port, ...)."""
    attr_vals = []
    for attr in spec.attrs.values():
        v = getattr(obj, attr, None)
        if v in (None, ""):
            return
        attr_vals.append(str(v))
    path, scale = spec.path, 1.0
    if "*" in path:
        path, _, k = path.partition("*")
        scale = float(k)
    for concrete, enum_vals in _expand(path, spec.enums):
        if concrete.startswith("="):
            yield (*enum_vals, *attr_vals), float(concrete[1:])
            continue
        m = re.search(r"\[(\w+)\]$", concrete)
        if m:
            coll = _resolve(obj, concrete[: m.start()])
            items: Iterable[tuple[Any, Any]] = coll.items() if isinstance(coll, dict) else enumerate(coll or [])
            for k, v in items:
                n = _num(v)
                if n is not None:
                    yield (*enum_vals, *attr_vals, str(k)), n * scale
            continue
        n = _num(_resolve(obj, concrete))
        if n is not None:
            yield (*enum_vals, *attr_vals), n * scale


class SampleMetrics:
    """A prometheus_client custom collector over the latest sample and the daemon's stats."""

    def __init__(self, specs: list[MetricSpec], stats_fn: Any = None) -> None:
        self.specs = specs
        self.stats_fn = stats_fn  # () -> dict of collector-scope values
        self._lock = threading.Lock()
        self._sample: Sample | None = None
        self._xids: Counter[tuple[str, str, str, str]] = Counter()
        self._kernel: Counter[tuple[str, str]] = Counter()

    def update(self, sample: Sample) -> None:
        with self._lock:
            self._sample = sample
            for g in sample.gpus:
                for x in g.xids:
                    self._xids[(sample.host, str(g.index), g.uuid, str(x.xid))] += 1
            for ev in sample.kernel_events:
                self._kernel[(sample.host, ev.kind)] += 1

    def rows(self, spec: MetricSpec) -> Iterator[tuple[tuple[str, ...], float]]:
        s = self._sample
        host = s.host if s else ""
        if spec.scope == "collector":
            stats = self.stats_fn() if self.stats_fn else {}
            for labels, v in spec_values(spec, _Obj(stats)):
                yield (host, *labels), v
            return
        if s is None:
            return
        if spec.scope == "xid":
            yield from ((k, float(v)) for k, v in self._xids.items())
            return
        if spec.scope == "kernel":
            yield from ((k, float(v)) for k, v in self._kernel.items())
            return
        if spec.scope == "gpu":
            objs: list[tuple[tuple[str, ...], Any]] = [((host, str(g.index), g.uuid), g) for g in s.gpus]
        elif spec.scope == "port":
            objs = [((host, p.device, str(p.port)), p) for p in s.net_ports]
        elif spec.scope == "aer":
            objs = [((host, a.pci_addr), a) for a in s.aer]
        elif spec.scope == "edac":
            objs = [((host, str(m.mc)), m) for m in s.edac]
        else:  # dimm
            objs = [((host, str(m.mc), d.label), d) for m in s.edac for d in m.dimms]
        for base, obj in objs:
            for labels, v in spec_values(spec, obj):
                yield (*base, *labels), v

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            for spec in self.specs:
                cls = CounterMetricFamily if spec.type == "counter" else GaugeMetricFamily
                fam = cls(spec.metric, spec.help, labels=list(spec.labels))
                for labels, v in self.rows(spec):
                    fam.add_metric(list(labels), v)
                yield fam


class _Obj:
    def __init__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)


DEFAULT_PORT = 9404  # off dcgm-exporter's 9400 (and 9401-9403, the fleet services' own metrics)
DEFAULT_ADDRESS = "127.0.0.1"


def start_exporter(metrics: SampleMetrics, port: int, addr: str = DEFAULT_ADDRESS) -> Any:
    """Serve /metrics on ``addr:port`` (``0.0.0.0`` / ``::`` for every interface, so a central
    Prometheus can scrape it); returns the server (``.shutdown()``) or None when port is 0.
    A port in use or an address that cannot be bound is a :class:`UserError` naming both (the CLI
    prints one line and exits 2), never a traceback."""
    if not port:
        return None
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    try:
        server, _thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        why = "the port is in use (dcgm-exporter listens on 9400)" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise UserError(f"cannot serve metrics on {addr}:{port}: {why}; choose another --exporter-port, "
                        "or 0 to disable the exporter") from None
    return server
