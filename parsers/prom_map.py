"""The Prometheus-series -> contract mapping (``prom_map.tsv``), loaded and checked once (pure).

One table serves every reader of Prometheus text or Prometheus' HTTP API: ``diagnose`` on a
dcgm-exporter dump (:mod:`parsers.prom`), the collector's ``dcgm-exporter=URL`` /
``node-exporter=URL`` sources and ``fleethealth import prometheus``. :func:`load_map` raises
:class:`PromMapError` naming ``file:line`` for a bad row. :func:`build` turns one host's readings
(name, labels, value) at one instant into contract parts; a series that is not there leaves its
field ``None`` ("not available"), never 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from fleethealth.schema import (
    EccCounters,
    EdacDimm,
    EdacMc,
    GpuSample,
    NetPort,
    NvlinkCounters,
    PcieLink,
    RemappedRows,
    RetiredPages,
)
from parsers.base import Fact, clamp_gauge, pci_norm

MAP_PATH = Path(__file__).with_name("prom_map.tsv")
HEADER = ["series", "kind", "contract", "unit", "scale", "dcgm_csv", "note"]
KINDS = {"counter", "total", "gauge", "small", "flag", "bitmask", "ib_state", "ib_phys_state", "boot_time",
         "xid_last", "xid_window", "fact", "unmapped"}
CSV_STATES = {"default", "commented", "absent", "node_exporter"}
GPU_STRUCTS: dict[str, type] = {"ecc": EccCounters, "remapped_rows": RemappedRows, "retired_pages": RetiredPages,
                                "pcie": PcieLink, "nvlink": NvlinkCounters}
GPU_SCALARS = {"temperature_c", "power_w", "utilization_pct", "clocks_event_reasons"}
PORT_FIELDS = {"state", "phys_state", "rate_gbps"}
EDAC_FIELDS = {"ce_count", "ue_count", "ce_noinfo_count", "ue_noinfo_count"}
IB_STATE = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
IB_PHYS = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
           6: "LinkErrorRecovery", 7: "PhyTest"}
MAX_LINKS = 32  # the contract's bound on per-link lists
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{n\})?$")


class PromMapError(ValueError):
    """A bad row in the mapping table: the message starts with ``file:line``."""


@dataclass(frozen=True, slots=True)
class Row:
    series: str
    kind: str
    contract: str
    unit: str
    scale: float
    dcgm_csv: str
    note: str
    line: int
    target: str = "-"  # gpu | net_port | edac | host | -
    struct: str = ""  # gpu sub-struct ("ecc", ...), "counters" for a port, "dimm" for EDAC
    field: str = ""
    per_link: bool = False


@dataclass(frozen=True)
class PromMap:
    rows: tuple[Row, ...]
    path: str

    def __post_init__(self) -> None:
        exact: dict[str, Row] = {}
        links: list[tuple[str, Row]] = []
        for r in self.rows:
            if r.per_link:
                links.append((r.series[: -len("{n}")], r))
            else:
                exact[r.series] = r
        object.__setattr__(self, "_exact", exact)
        object.__setattr__(self, "_links", links)
        object.__setattr__(self, "_memo", {})

    def lookup(self, name: str) -> tuple[Row, int | None] | None:
        """The row for a series name, and the link index for a per-link series."""
        memo: dict[str, tuple[Row, int | None] | None] = self._memo  # type: ignore[attr-defined]
        if name in memo:
            return memo[name]
        hit = self._lookup(name)
        if len(memo) < 100_000:
            memo[name] = hit
        return hit

    def _lookup(self, name: str) -> tuple[Row, int | None] | None:
        r = self._exact.get(name)  # type: ignore[attr-defined]
        if r is not None:
            return r, None
        for prefix, row in self._links:  # type: ignore[attr-defined]
            if name.startswith(prefix) and name[len(prefix):].isdigit():
                n = int(name[len(prefix):])
                return (row, n) if n < MAX_LINKS else None
        return None

    def mapped(self) -> list[Row]:
        return [r for r in self.rows if r.kind not in ("unmapped",)]

    def name_regex(self, prefix: str) -> str:
        """A PromQL ``__name__`` regex matching every mapped series whose name starts with ``prefix``."""
        parts = [re.escape(r.series[:-3]) + "[0-9]+" if r.per_link else re.escape(r.series)
                 for r in self.mapped() if r.series.startswith(prefix)]
        return "|".join(parts).replace("\\_", "_")


def _err(path: str, line: int, msg: str) -> PromMapError:
    return PromMapError(f"{path}:{line}: {msg}")


def _resolve(row: Row, path: str) -> Row:
    """Check the contract path against the schema; return the row with its target filled in."""
    c, ln, kind = row.contract, row.line, row.kind
    if kind in ("fact", "unmapped"):
        if c != "-":
            raise _err(path, ln, f"kind {kind} maps to no contract field: contract must be '-', not {c!r}")
        return row
    if c == "-":
        raise _err(path, ln, f"kind {kind} needs a contract path")
    parts = c.split(".")
    per_link = row.series.endswith("{n}")
    if parts[0] == "gpu":
        if kind in ("xid_last", "xid_window"):
            if c != "gpu.xids":
                raise _err(path, ln, f"{kind} series map to gpu.xids, not {c!r}")
            return _with(row, "gpu", "", "xids")
        if len(parts) == 2 and parts[1] in GPU_SCALARS:
            if kind not in ("gauge", "bitmask"):
                raise _err(path, ln, f"gpu.{parts[1]} is a gauge/bitmask field; kind {kind} does not fit")
            return _with(row, "gpu", "", parts[1])
        if len(parts) == 3 and parts[1] in GPU_STRUCTS:
            fld = parts[2]
            link = fld.endswith("[n]")
            fld = fld[:-3] if link else fld
            if fld not in GPU_STRUCTS[parts[1]].__struct_fields__:  # type: ignore[attr-defined]
                raise _err(path, ln, f"{GPU_STRUCTS[parts[1]].__name__} has no field {fld!r}")
            if parts[1] == "nvlink" and fld != "active" and not (link or kind == "total"):
                raise _err(path, ln, "an NVLink list field needs [n] (per link) or kind total (all links)")
            if link != per_link:
                raise _err(path, ln, "a per-link contract field ([n]) needs a series name ending in {n}, and back")
            if kind in ("xid_last", "xid_window", "ib_state", "ib_phys_state", "boot_time"):
                raise _err(path, ln, f"kind {kind} does not fit {c}")
            return _with(row, "gpu", parts[1], fld, link)
        raise _err(path, ln, f"unknown GPU contract path {c!r}")
    if per_link:
        raise _err(path, ln, "{n} series map only to gpu.nvlink.<list>[n]")
    if parts[0] == "net_port":
        if len(parts) == 2 and parts[1] in PORT_FIELDS:
            want = {"state": "ib_state", "phys_state": "ib_phys_state", "rate_gbps": "gauge"}[parts[1]]
            if kind != want:
                raise _err(path, ln, f"net_port.{parts[1]} takes kind {want}, not {kind}")
            return _with(row, "net_port", "", parts[1])
        if len(parts) == 3 and parts[1] == "counters" and re.fullmatch(r"\w+", parts[2]) and kind == "counter":
            return _with(row, "net_port", "counters", parts[2])
        raise _err(path, ln, f"unknown port contract path {c!r} (or kind {kind} does not fit)")
    if parts[0] == "edac":
        if len(parts) == 2 and parts[1] in EDAC_FIELDS and kind == "counter":
            return _with(row, "edac", "", parts[1])
        if len(parts) == 3 and parts[1] == "dimm" and parts[2] in ("ce", "ue") and kind == "counter":
            return _with(row, "edac", "dimm", parts[2])
        raise _err(path, ln, f"unknown EDAC contract path {c!r} (or kind {kind} does not fit)")
    if c == "host.boot_id" and kind == "boot_time":
        return _with(row, "host", "", "boot_id")
    raise _err(path, ln, f"unknown contract path {c!r} for kind {kind}")


def _with(row: Row, target: str, struct: str, fld: str, per_link: bool = False) -> Row:
    return Row(row.series, row.kind, row.contract, row.unit, row.scale, row.dcgm_csv, row.note, row.line,
               target, struct, fld, per_link)


def parse_map(text: str, path: str = "prom_map.tsv") -> PromMap:
    rows: list[Row] = []
    seen: dict[str, int] = {}
    header_seen = False
    for ln, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.startswith("#"):
            continue
        cols = raw.split("\t")
        if not header_seen:
            if cols != HEADER:
                raise _err(path, ln, f"header must be {' '.join(HEADER)} (tab-separated), got {cols!r}")
            header_seen = True
            continue
        if len(cols) != len(HEADER):
            raise _err(path, ln, f"{len(cols)} columns, expected {len(HEADER)} (tab-separated)")
        series, kind, contract, unit, scale_s, csv_state, note = (c.strip() for c in cols)
        if not _NAME.match(series):
            raise _err(path, ln, f"{series!r} is not a Prometheus metric name")
        if series in seen:
            raise _err(path, ln, f"{series} is already mapped at line {seen[series]}")
        if kind not in KINDS:
            raise _err(path, ln, f"unknown kind {kind!r}; one of {', '.join(sorted(KINDS))}")
        if csv_state not in CSV_STATES:
            raise _err(path, ln, f"dcgm_csv {csv_state!r}: one of {', '.join(sorted(CSV_STATES))}")
        if series.startswith("DCGM_") == (csv_state == "node_exporter"):
            raise _err(path, ln, "dcgm_csv node_exporter is for node_* series; a DCGM_ series is default, "
                                 "commented or absent")
        try:
            scale = float(scale_s)
        except ValueError:
            raise _err(path, ln, f"scale {scale_s!r} is not a number") from None
        if not (math.isfinite(scale) and scale > 0):
            raise _err(path, ln, f"scale {scale_s} must be a positive number")
        if not unit:
            raise _err(path, ln, "unit is empty")
        if not note:
            raise _err(path, ln, "note is empty: say what the series means")
        seen[series] = ln
        rows.append(_resolve(Row(series, kind, contract, unit, scale, csv_state, note, ln), path))
    if not header_seen:
        raise _err(path, 1, "no header row")
    return PromMap(tuple(rows), path)


@lru_cache(maxsize=4)
def load_map(path: str | None = None) -> PromMap:
    p = Path(path) if path else MAP_PATH
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PromMapError(f"{p}: cannot read the mapping table: {exc}") from None
    return parse_map(text, str(p))


# --------------------------------------------------------------------------- building contract parts


@dataclass(slots=True)
class XidReading:
    """One Xid series value for one GPU: ``last`` (the last-Xid gauge) or ``window`` (Xid N's count)."""

    gpu: str  # the GPU's stable key (UUID, else PCI address, else "gpu<index>")
    mode: str  # "last" | "window"
    xid: int
    count: int = 0
    line: str = ""


@dataclass(slots=True)
class Parts:
    """What one instant's series say about one host, in contract shape."""

    gpus: list[GpuSample] = field(default_factory=list)
    net_ports: list[NetPort] = field(default_factory=list)
    edac: list[EdacMc] = field(default_factory=list)
    boot_id: str = ""
    driver_version: str = ""
    hostname: str = ""
    xids: list[XidReading] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    skipped: int = 0  # values out of range / series without a GPU or port label
    unmapped: int = 0  # series the table does not name or names as unmapped


def count_of(v: float) -> int | None:
    if math.isnan(v) or math.isinf(v) or v < 0 or v >= 2**64:
        return None
    return int(v)


def gpu_key(g: GpuSample) -> str:
    return g.uuid or g.pci_bus_id or f"gpu{g.index}"


@lru_cache(maxsize=1 << 16)
def _gpu_ident(idx_s: str, uuid: str, pci_raw: str) -> tuple[str, int | None, str, str] | None:
    """(key within one host, index or None, UUID, normalised PCI address) from a series' labels."""
    uuid = uuid[:256]
    pci = pci_norm(pci_raw)[:256] if pci_raw else ""
    if idx_s.isdigit() and int(idx_s) <= 1_000_000:
        return f"i{int(idx_s)}", int(idx_s), uuid, pci
    if uuid or pci:
        return uuid or pci, None, uuid, pci
    return None


@dataclass(frozen=True, slots=True)
class Series:
    """One series' labels resolved against the table once (the importer reuses it for every point)."""

    row: Row
    link: int | None
    labels: dict[str, str]
    gpu: tuple[str, int | None, str, str] | None  # _gpu_ident
    port: tuple[str, int] | None
    mc: int | None


def resolve(table: PromMap, name: str, labels: dict[str, str]) -> Series | None:
    """The table row and the component a series is about; None for a series the table does not map."""
    hit = table.lookup(name)
    if hit is None or hit[0].kind == "unmapped":
        return None
    row, link = hit
    gpu = port = mc = None
    if row.target == "gpu" or row.kind == "fact":
        gpu = _gpu_ident(labels.get("gpu", ""), labels.get("UUID", ""), labels.get("pci_bus_id", ""))
    elif row.target == "net_port":
        dev, port_s = labels.get("device", "")[:256], labels.get("port", "1")
        if dev and port_s.isdigit() and int(port_s) <= 1_000_000:
            port = (dev, int(port_s))
    elif row.target == "edac":
        mc_s = labels.get("controller", "")
        if mc_s.isdigit() and int(mc_s) <= 1_000_000:
            mc = int(mc_s)
    return Series(row, link, labels, gpu, port, mc)


class _Builder:
    def __init__(self, table: PromMap, evidence: bool) -> None:
        self.t = table
        self.evidence = evidence
        self.out = Parts()
        self.gpus: dict[str, GpuSample] = {}
        self.prio: dict[tuple[int, str], int] = {}
        self.links: dict[tuple[str, str], dict[int, int | None]] = {}
        self.totals: dict[tuple[str, str], int | None] = {}
        self.ports: dict[tuple[str, int], NetPort] = {}
        self.mcs: dict[int, EdacMc] = {}
        self.dimms: dict[tuple[int, str], EdacDimm] = {}

    def gpu(self, ident: tuple[str, int | None, str, str] | None, labels: dict[str, str]) -> GpuSample | None:
        if ident is None:
            return None
        key, idx, uuid, pci = ident
        g = self.gpus.get(key)
        if g is None:
            g = self.gpus[key] = GpuSample(index=len(self.gpus) if idx is None else idx, uuid=uuid, pci_bus_id=pci,
                                           name=labels.get("modelName", "")[:256])
        return g

    def setf(self, obj: Any, fld: str, value: Any, prio: int) -> None:
        k = (id(obj), fld)
        if self.prio.get(k, -1) > prio:
            return
        self.prio[k] = prio
        setattr(obj, fld, value)

    def value(self, row: Row, v: float) -> Any:
        k = row.kind
        if k == "flag":
            return None if math.isnan(v) else v > 0
        x = v * row.scale if row.scale != 1 else v
        if k in ("counter", "total", "bitmask"):
            return count_of(x)
        if k == "gauge":
            return None if math.isnan(x) else clamp_gauge(x)
        if k == "small":
            n = count_of(x)
            return n if n is not None and n <= 1_000_000 else None
        return x

    def add(self, name: str, labels: dict[str, str], v: float, raw: str) -> None:
        sr = resolve(self.t, name, labels)
        if sr is None:
            self.out.unmapped += 1
            return
        self.add_series(sr, v, raw)

    def add_series(self, sr: Series, v: float, raw: str = "") -> None:
        row, labels = sr.row, sr.labels
        if not self.out.hostname and labels.get("Hostname"):
            self.out.hostname = labels["Hostname"][:253]
        if not self.out.driver_version and labels.get("DCGM_FI_DRIVER_VERSION"):
            self.out.driver_version = labels["DCGM_FI_DRIVER_VERSION"][:256]
        if row.target == "gpu" or row.kind == "fact":
            self.gpu_value(sr, v, raw)
        elif row.target == "net_port":
            self.port_value(sr, v)
        elif row.target == "edac":
            self.edac_value(sr, v)
        elif row.target == "host":
            n = count_of(v)
            if n is None:
                self.out.skipped += 1
            else:
                self.out.boot_id = f"btime:{n}"

    def gpu_value(self, sr: Series, v: float, raw: str) -> None:
        row, link, labels = sr.row, sr.link, sr.labels
        g = self.gpu(sr.gpu, labels)
        if g is None:
            self.out.skipped += 1
            return
        key = gpu_key(g)
        if row.kind == "fact":
            if self.evidence and v > 0:
                self.out.facts.append(Fact("prom_nonzero", key, {"metric": row.series, "value": v}, raw))
            return
        if row.kind == "xid_last":
            n = count_of(v)
            if n is None or n > 1_000_000:
                self.out.skipped += 1
                return
            self.out.xids.append(XidReading(key, "last", n, line=raw))
            if self.evidence and n:
                self.out.facts.append(Fact("xid_metric", key, {"xid": n, "pci": g.pci_bus_id}, raw))
            return
        if row.kind == "xid_window":
            xid, n = labels.get("xid", ""), count_of(v)
            if not xid.isdigit() or int(xid) > 1_000_000 or n is None:
                self.out.skipped += 1
                return
            self.out.xids.append(XidReading(key, "window", int(xid), n, raw))
            if self.evidence and n:
                self.out.facts.append(Fact("xid_metric", key, {"xid": int(xid), "pci": g.pci_bus_id}, raw))
            return
        val = self.value(row, v)
        if val is None and row.kind != "flag":
            self.out.skipped += 1
        if self.evidence and v > 0 and row.struct in ("remapped_rows", "nvlink"):
            self.out.facts.append(Fact("prom_nonzero", key, {"metric": row.series if link is None else
                                                             f"{row.series[:-3]}{link}", "value": v}, raw))
        if row.struct == "nvlink":
            if link is not None:
                self.links.setdefault((key, row.field), {})[link] = val
            else:
                self.totals[(key, row.field)] = val
            return
        if not row.struct:
            self.setf(g, row.field, val, 1)
            return
        sub = getattr(g, row.struct)
        if sub is None:
            sub = GPU_STRUCTS[row.struct]()
            setattr(g, row.struct, sub)
        self.setf(sub, row.field, val, 0 if row.kind == "total" else 1)

    def port_value(self, sr: Series, v: float) -> None:
        row, k = sr.row, sr.port
        if k is None:
            self.out.skipped += 1
            return
        p = self.ports.get(k)
        if p is None:
            p = self.ports[k] = NetPort(device=k[0], port=k[1])
        if row.kind in ("ib_state", "ib_phys_state"):
            n = count_of(v)
            names = IB_STATE if row.kind == "ib_state" else IB_PHYS
            setattr(p, row.field, names.get(n, f"{n}") if n is not None else "")
            return
        val = self.value(row, v)
        if val is None:
            self.out.skipped += 1
            return
        if row.struct == "counters":
            p.counters[row.field] = val
        else:
            setattr(p, row.field, val)

    def edac_value(self, sr: Series, v: float) -> None:
        row, labels, mc = sr.row, sr.labels, sr.mc
        val = self.value(row, v)
        if mc is None or val is None:
            self.out.skipped += 1
            return
        m = self.mcs.get(mc)
        if m is None:
            m = self.mcs[mc] = EdacMc(mc=mc)
        if row.struct != "dimm":
            setattr(m, row.field, val)
            return
        csrow = labels.get("csrow", "")
        if csrow == "unknown":  # node_exporter reports mcN/{ce,ue}_noinfo_count as csrow="unknown"
            setattr(m, "ce_noinfo_count" if row.field == "ce" else "ue_noinfo_count", val)
            return
        if not csrow:
            self.out.skipped += 1
            return
        label = f"mc{mc}/csrow{csrow}"[:256]
        d = self.dimms.get((mc, label))
        if d is None:
            d = self.dimms[(mc, label)] = EdacDimm(label=label)
            m.dimms.append(d)
        setattr(d, row.field, val)

    def finish(self) -> Parts:
        for g in self.gpus.values():
            key = gpu_key(g)
            fields = {f for (k, f) in self.links if k == key} | {f for (k, f) in self.totals if k == key}
            if fields and g.nvlink is None:
                g.nvlink = NvlinkCounters()
            for f in fields:
                per = self.links.get((key, f))
                if per:
                    vals: list[int | None] = [None] * (max(per) + 1)
                    for i, x in per.items():
                        vals[i] = x
                    setattr(g.nvlink, f, vals)
                else:
                    setattr(g.nvlink, f, [self.totals[(key, f)]])
        self.out.gpus = sorted(self.gpus.values(), key=lambda g: g.index)[:64]
        self.out.net_ports = [self.ports[k] for k in sorted(self.ports)][:64]
        self.out.edac = [self.mcs[k] for k in sorted(self.mcs)][:64]
        return self.out


def build(readings: Iterable[tuple[str, dict[str, str], float, str]], table: PromMap | None = None,
          evidence: bool = True) -> Parts:
    """One host's series at one instant -> contract parts (pure). ``evidence`` keeps raw lines as
    facts for ``diagnose``; the streaming sources turn it off."""
    b = _Builder(table or load_map(), evidence)
    for name, labels, value, raw in readings:
        b.add(name, labels, value, raw)
    return b.finish()


def build_resolved(readings: Iterable[tuple[Series, float]], table: PromMap) -> Parts:
    """:func:`build` for series already :func:`resolve`-d (the importer resolves a series once per
    chunk, not once per point); no evidence facts."""
    b = _Builder(table, False)
    add = b.add_series
    for sr, value in readings:
        add(sr, value)
    return b.finish()


def host_of(labels: dict[str, str], host_labels: tuple[str, ...] = ("Hostname", "instance")) -> str:
    """A series' host: the first label present; an ``instance`` loses its ``:port``."""
    for lab in host_labels:
        v = labels.get(lab, "")
        if v:
            if lab == "instance":
                if v.startswith("["):  # [::1]:9400
                    v = v[1:].split("]", 1)[0]
                elif v.count(":") == 1:
                    v = v.split(":", 1)[0]
            return v[:253]
    return ""
