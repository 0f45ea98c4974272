"""``nvidia-smi nvlink -e`` (error counters) / ``-s`` (status) and ``dcgmi nvlink --link-status`` (pure)."""

from __future__ import annotations

import re

from fleethealth.schema import GpuSample, NvlinkCounters
from parsers.base import Fact, Parsed, ParseError, new_parsed, to_count

FORMAT_SMI = "nvidia-smi-nvlink"
FORMAT_DCGMI = "dcgmi-nvlink-status"
_GPU_HEAD = re.compile(r"^GPU (?P<idx>\d{1,7}): (?P<rest>.*)$")


def _gpu_line(line: str) -> tuple[int, str, str] | None:
    """``GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-…)`` -> (index, name, uuid), split without a
    backtracking pattern (the old one was quadratic on a long line)."""
    m = _GPU_HEAD.match(line)
    if m is None:
        return None
    rest = m["rest"].rstrip()
    k = rest.rfind(" (UUID: ")
    if k >= 0 and rest.endswith(")"):
        return int(m["idx"]), rest[:k], rest[k + 8:-1]
    return int(m["idx"]), rest, ""
_LINK = re.compile(r"^\s*Link (?P<link>\d+): (?P<body>.*)$")
_COUNTER = re.compile(r"^(?P<name>[A-Za-z][A-Za-z ]*?)s?: (?P<val>\S+)")
_SPEED = re.compile(r"^(?P<gbps>\d+(?:\.\d+)?) GB/s")
_ALL_INACTIVE = re.compile(r"Unable to retrieve NVLink information as all links are inactive", re.I)
_FIELD = {"crc flit error": "crc_flit", "crc data error": "crc_data", "crc error": "crc_flit",
          "replay error": "replay", "recovery error": "recovery"}
MAX_LINKS = 32


def parse(text: str) -> Parsed:
    out = new_parsed(FORMAT_SMI)
    gpu: GpuSample | None = None
    counters: dict[int, dict[int, dict[str, int | None]]] = {}
    active: dict[int, dict[int, bool]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if (head := _gpu_line(line)) is not None:
            idx, name, uuid = head
            if idx > 1_000_000:
                raise ParseError(FORMAT_SMI, f"GPU index {idx} out of range", lineno)
            gpu = GpuSample(index=idx, name=name[:256], uuid=uuid[:256])
            out.sample.gpus.append(gpu)
            continue
        if _ALL_INACTIVE.search(line):
            comp = gpu.uuid or f"gpu{gpu.index}" if gpu else "host"
            out.facts.append(Fact("nvlink_all_inactive", comp, {"index": gpu.index if gpu else None}, line.strip()))
            continue
        if (m := _LINK.match(line)) is not None and gpu is not None:
            link = int(m["link"])
            if link >= MAX_LINKS:
                out.warnings.append(f"line {lineno}: link index {link} out of range, skipped")
                continue
            body = m["body"].strip()
            if body.lower() in ("<inactive>", "inactive", "disabled"):
                active.setdefault(gpu.index, {})[link] = False
                out.facts.append(Fact("nvlink_inactive", gpu.uuid or f"gpu{gpu.index}", {"link": link}, line.strip()))
            elif _SPEED.match(body):
                active.setdefault(gpu.index, {})[link] = True
            elif (c := _COUNTER.match(body)) is not None:
                name = c["name"].strip().lower().rstrip("s")
                fld = _FIELD.get(name)
                if fld is None:
                    out.warnings.append(f"line {lineno}: unknown NVLink counter {c['name']!r}")
                    continue
                counters.setdefault(gpu.index, {}).setdefault(link, {})[fld] = to_count(c["val"])
            continue
        if gpu is None and not line.startswith(" "):
            raise ParseError(FORMAT_SMI, f"expected 'GPU <n>: <name>', got {line.strip()[:80]!r}", lineno)
    if not out.sample.gpus:
        raise ParseError(FORMAT_SMI, "no 'GPU <n>:' line")
    for g in out.sample.gpus:
        links = sorted(set(counters.get(g.index, {})) | set(active.get(g.index, {})))
        if not links:
            continue
        n = max(links) + 1
        nv = NvlinkCounters(active=[active.get(g.index, {}).get(i) for i in range(n)])
        for fld in ("crc_flit", "crc_data", "replay", "recovery"):
            setattr(nv, fld, [counters.get(g.index, {}).get(i, {}).get(fld) for i in range(n)])
        g.nvlink = nv
    return out


_DCGMI_GPU = re.compile(r"^\s*gpuId (?P<id>\d+):\s*$")
_DCGMI_SW = re.compile(r"^\s*physicalId (?P<id>\d+):\s*$")
_STATES = re.compile(r"^\s*([UDX_](?:\s+[UDX_])*)\s*$")


def parse_dcgmi(text: str) -> Parsed:
    """``dcgmi nvlink --link-status``: one row of U/D/X/_ per GPU (Up, Down, Disabled, unsupported)."""
    out = new_parsed(FORMAT_DCGMI)
    current: GpuSample | None = None
    in_switches = False
    for line in text.splitlines():
        if line.strip().startswith("NvSwitches"):
            in_switches, current = True, None
            continue
        if (m := _DCGMI_GPU.match(line)) is not None and not in_switches:
            idx = int(m["id"])
            if idx > 1_000_000:
                raise ParseError(FORMAT_DCGMI, f"gpuId {idx} out of range")
            current = GpuSample(index=idx)
            out.sample.gpus.append(current)
            continue
        if (m := _STATES.match(line)) is not None and current is not None:
            states = m.group(1).split()[:MAX_LINKS]
            current.nvlink = NvlinkCounters(active=[True if s == "U" else False if s == "D" else None for s in states])
            down = [i for i, s in enumerate(states) if s == "D"]
            if down:
                out.facts.append(Fact("nvlink_down", f"gpu{current.index}", {"links": down, "of": len(states)},
                                      f"gpuId {current.index}: {' '.join(states)}"))
            current = None
    if not out.sample.gpus:
        raise ParseError(FORMAT_DCGMI, "no 'gpuId <n>:' rows")
    return out
