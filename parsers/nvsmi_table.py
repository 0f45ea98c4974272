"""The default ``nvidia-smi`` table: enough to list the GPUs and spot the warnings it prints (pure).

A GPU fallen off the bus shows as ``ERR!`` cells or as ``Unable to determine the device handle for
GPU <bus id>: Unknown Error``; a damaged infoROM as ``WARNING: infoROM is corrupted at gpu <id>``.
"""

from __future__ import annotations

import re

from fleethealth.schema import EccCounters, GpuSample
from parsers.base import (
    Fact,
    Parsed,
    ParseError,
    clamp_gauge,
    new_parsed,
    pci_norm,
    to_count,
    to_number,
)

FORMAT = "nvidia-smi-table"
_ROW1 = re.compile(r"^\|\s+(?P<idx>\d+)\s+(?P<name>.+?)\s+(?:On|Off|ERR!)\s*\|\s*(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
                   r"[0-9A-Fa-f]{2}\.[0-7])\s+(?P<disp>\S+)\s*\|\s*(?P<ecc>\S+)\s*\|")
_ROW2 = re.compile(r"^\|\s*(?P<fan>\S+)\s+(?P<temp>\S+)\s+(?P<perf>P\d+|ERR!|N/A)\s+(?P<pwr>\S+)\s*/\s*\S+\s*\|")
_NO_HANDLE = re.compile(r"Unable to determine the device handle for (?:GPU|gpu) ?(?P<bus>[0-9A-Fa-f:.]+)\s*:\s*(?P<why>.*)")
_INFOROM = re.compile(r"infoROM is corrupted at gpu (?P<bus>[0-9A-Fa-f:.]+)", re.I)
_HEADER = re.compile(r"NVIDIA-SMI (?P<smi>[\d.]+)\s+Driver Version: (?P<drv>[\d.]+)")


def parse(text: str) -> Parsed:
    out = new_parsed(FORMAT)
    lines = text.splitlines()
    pending: GpuSample | None = None
    header = False
    for lineno, line in enumerate(lines, 1):
        if (m := _HEADER.search(line)) is not None:
            header = True
            out.sample.driver_version = m["drv"]
            continue
        if (m := _ROW1.match(line)) is not None:
            idx = int(m["idx"])
            if idx > 1_000_000:
                raise ParseError(FORMAT, f"GPU index {idx} out of range", lineno)
            uncorr = to_count(m["ecc"])
            pending = GpuSample(index=idx, name=m["name"][:256], pci_bus_id=pci_norm(m["bus"]),
                                ecc=EccCounters(dram_uncorrected_volatile=uncorr) if uncorr is not None else None)
            out.sample.gpus.append(pending)
            if "ERR!" in line:
                out.facts.append(Fact("gpu_err", pending.pci_bus_id, {"index": idx}, line.strip()))
            continue
        if pending is not None and (m := _ROW2.match(line)) is not None:
            pending.temperature_c = clamp_gauge(to_number(m["temp"]))
            pending.power_w = clamp_gauge(to_number(m["pwr"]))
            if "ERR!" in line:
                out.facts.append(Fact("gpu_err", pending.pci_bus_id, {"index": pending.index}, line.strip()))
            pending = None
            continue
        if (m := _NO_HANDLE.search(line)) is not None:
            out.facts.append(Fact("gpu_no_handle", pci_norm(m["bus"].rstrip(":")), {"why": m["why"].strip()},
                                  line.strip()))
            continue
        if (m := _INFOROM.search(line)) is not None:
            out.facts.append(Fact("inforom_corrupted", pci_norm(m["bus"]), {}, line.strip()))
            out.warnings.append(line.strip())
    if not header and not out.sample.gpus and not out.facts:
        raise ParseError(FORMAT, "no 'NVIDIA-SMI ... Driver Version' header and no GPU rows")
    out.sample.expected_gpus = min(len(out.sample.gpus) + sum(f.kind == "gpu_no_handle" for f in out.facts), 64)
    return out


_QUERY = re.compile(r"--query-(?P<what>gpu|compute-apps|remapped-rows|retired-pages)=(?P<fields>[\w.,]{1,2048})")


def parse_query_csv(text: str) -> Parsed:
    """``nvidia-smi --query-gpu=a,b --format=csv[,noheader]``: one ``gpu_query`` fact per row, field name ->
    value as printed. The field names come from the header row, or from the command line on top
    when ``noheader`` dropped it."""
    out = new_parsed("nvidia-smi-csv")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    fields: list[str] = []
    if lines and (q := _QUERY.search(lines[0])) is not None:
        fields = q["fields"].split(",")
        lines = lines[1:]
    if lines and not fields and "," in lines[0] and not any(c.isdigit() for c in lines[0].split(",")[0]):
        fields = [f.strip().split(" [")[0] for f in lines[0].split(",")]
        lines = lines[1:]
    elif lines and fields and lines[0].replace(" ", "").split(",")[0] == fields[0]:
        lines = lines[1:]  # the header row as well
    if not fields:
        raise ParseError("nvidia-smi-csv", "no --query-…= command line and no header row")
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            out.skipped_lines += 1
            continue
        row = dict(zip(fields, cells, strict=True))
        comp = f"gpu{row['index']}" if row.get("index", "").isdigit() else row.get("uuid") or row.get("pci.bus_id") or "gpu"
        out.facts.append(Fact("gpu_query", comp, row, line.strip()))
    return out
