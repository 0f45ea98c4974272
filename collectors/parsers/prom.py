"""dcgm-exporter / Prometheus text exposition dumps (pure, lenient).

A sample line whose value does not parse (dcgm-exporter prints ``ERROR - FAILED TO CONVERT TO
STRING`` for some fields) is skipped and counted; it never fails the scrape. MIG series (with a
``GPU_I_ID`` label) repeat the parent GPU's device fields and are folded into the GPU.
"""

from __future__ import annotations

import math
import re

from collectors.parsers.base import Fact, Parsed, ParseError, clamp_gauge, new_parsed, pci_norm
from fleethealth.schema import EccCounters, GpuSample, NvlinkCounters, PcieLink, RemappedRows, RetiredPages

FORMAT = "dcgm-exporter"
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'(?P<k>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<v>(?:[^"\\]|\\.)*)"')

_ECC = {
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "dram_corrected_volatile",  # DCGM totals; the location split is below
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "dram_uncorrected_volatile",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "dram_corrected_aggregate",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "dram_uncorrected_aggregate",
}


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


def _count(v: float) -> int | None:
    if math.isnan(v) or math.isinf(v) or v < 0 or v >= 2**64:
        return None
    return int(v)


def parse(text: str) -> Parsed:
    samples, skipped = parse_metrics(text)
    if not samples:
        raise ParseError(FORMAT, "no Prometheus sample lines")
    out = new_parsed(FORMAT)
    out.skipped_lines = skipped
    if skipped:
        out.warnings.append(f"{skipped} sample line(s) with an unparseable value skipped")
    gpus: dict[int, GpuSample] = {}
    for name, labels, value, raw in samples:
        if not name.startswith("DCGM_") or "gpu" not in labels:
            continue
        try:
            idx = int(labels["gpu"])
        except ValueError:
            out.skipped_lines += 1
            continue
        if not 0 <= idx <= 1_000_000:
            out.skipped_lines += 1
            continue
        g = gpus.get(idx)
        if g is None:
            g = gpus[idx] = GpuSample(index=idx, uuid=labels.get("UUID", "")[:256],
                                      pci_bus_id=pci_norm(labels["pci_bus_id"]) if labels.get("pci_bus_id") else "",
                                      name=labels.get("modelName", "")[:256])
        _apply(out, g, name, labels, value, raw)
    out.sample.gpus = [gpus[i] for i in sorted(gpus)]
    return out


def _apply(out: Parsed, g: GpuSample, name: str, labels: dict[str, str], value: float, raw: str) -> None:
    comp = g.uuid or f"gpu{g.index}"
    if name in _ECC:
        g.ecc = g.ecc or EccCounters()
        setattr(g.ecc, _ECC[name], _count(value))
    elif name == "DCGM_FI_DEV_PCIE_REPLAY_COUNTER":
        g.pcie = g.pcie or PcieLink()
        g.pcie.replay_counter = _count(value)
    elif name in ("DCGM_FI_DEV_PCIE_LINK_GEN", "DCGM_FI_DEV_PCIE_LINK_WIDTH", "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
                  "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"):
        g.pcie = g.pcie or PcieLink()
        v = _count(value)
        v = v if v is not None and v <= 1_000_000 else None
        attr = {"DCGM_FI_DEV_PCIE_LINK_GEN": "gen_current", "DCGM_FI_DEV_PCIE_LINK_WIDTH": "width_current",
                "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": "gen_max", "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": "width_max"}[name]
        setattr(g.pcie, attr, v)
    elif name in ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                  "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING"):
        g.remapped_rows = g.remapped_rows or RemappedRows()
        if name.endswith("UNCORRECTABLE_REMAPPED_ROWS"):
            g.remapped_rows.uncorrectable = _count(value)
        elif name.endswith("CORRECTABLE_REMAPPED_ROWS"):
            g.remapped_rows.correctable = _count(value)
        elif name.endswith("FAILURE"):
            g.remapped_rows.failure = value > 0
        else:
            g.remapped_rows.pending = value > 0
        if value > 0:
            out.facts.append(Fact("prom_nonzero", comp, {"metric": name, "value": value}, raw))
    elif name in ("DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING"):
        g.retired_pages = g.retired_pages or RetiredPages()
        if name.endswith("SBE"):
            g.retired_pages.sbe = _count(value)
        elif name.endswith("DBE"):
            g.retired_pages.dbe = _count(value)
        else:
            g.retired_pages.pending = value > 0
    elif name == "DCGM_FI_DEV_GPU_TEMP":
        g.temperature_c = clamp_gauge(value)
    elif name == "DCGM_FI_DEV_POWER_USAGE":
        g.power_w = clamp_gauge(value)
    elif name == "DCGM_FI_DEV_GPU_UTIL":
        g.utilization_pct = clamp_gauge(value)
    elif name in ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"):
        g.clocks_event_reasons = _count(value)
    elif name == "DCGM_FI_DEV_XID_ERRORS" or name == "DCGM_FI_DEV_XID_ERRORS_ACTIVE":
        xid = int(labels["xid"]) if labels.get("xid", "").isdigit() else _count(value)
        active = value > 0 if "xid" in labels else (xid or 0) > 0
        if active and xid and xid <= 1_000_000:
            out.facts.append(Fact("xid_metric", comp, {"xid": xid, "pci": g.pci_bus_id}, raw))
    elif name.startswith("DCGM_FI_DEV_NVLINK_CRC_") or name.startswith("DCGM_FI_DEV_NVLINK_REPLAY_") \
            or name.startswith("DCGM_FI_DEV_NVLINK_RECOVERY_"):
        if name.endswith("_TOTAL") or "_L" not in name.rsplit("_", 1)[-1]:
            g.nvlink = g.nvlink or NvlinkCounters()
            fld = "crc_flit" if "FLIT" in name else "crc_data" if "CRC_DATA" in name else \
                "replay" if "REPLAY" in name else "recovery"
            setattr(g.nvlink, fld, [_count(value)])
        if value > 0:
            out.facts.append(Fact("prom_nonzero", comp, {"metric": name, "value": value}, raw))
    elif name in ("DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_POWER_VIOLATION") and value > 0:
        out.facts.append(Fact("prom_nonzero", comp, {"metric": name, "value": value}, raw))
