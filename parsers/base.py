"""What every captured-output parser returns, and the one error it may raise.

A parser is a pure function ``parse(text) -> Parsed``: text in, values out. ``Parsed.sample`` holds
what fits the telemetry contract (:class:`fleethealth.schema.Sample`); facts the contract has no
field for (a GPU's performance state and temperature limits, an InfiniBand link's trained speed, a
decoded machine-check record) travel beside it as :class:`GpuInfo` and :class:`Fact` values so the
offline doctor can use them. Anything odd but survivable is a warning string, never an exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from fleethealth.ids import normalise_pci as _normalise_pci
from fleethealth.schema import GpuSample, Sample

PLACEHOLDER_HOST = "unknown"
U64_MAX = (1 << 64) - 1


class ParseError(ValueError):
    """Input that is not the format it claims to be; the message names the line when it can."""

    def __init__(self, fmt: str, reason: str, lineno: int | None = None) -> None:
        where = f" (line {lineno})" if lineno else ""
        super().__init__(f"{fmt}: {reason}{where}")
        self.format = fmt
        self.reason = reason
        self.lineno = lineno


@dataclass(slots=True)
class Fact:
    """An observation outside the telemetry contract. ``kind`` names it (``"ib_link_speed"``,
    ``"mce_record"``, ...); ``component`` is what it is about; ``line`` is the raw evidence."""

    kind: str
    component: str
    attrs: dict[str, Any] = field(default_factory=dict)
    line: str = ""


@dataclass(slots=True)
class GpuInfo:
    """Per-GPU facts from nvidia-smi that the contract does not carry."""

    pstate: str | None = None  # "P0" .. "P12"
    temp_slowdown_c: float | None = None
    temp_shutdown_c: float | None = None
    temp_max_operating_c: float | None = None
    mem_temp_c: float | None = None
    mem_max_operating_c: float | None = None
    tlimit_c: float | None = None  # newer drivers: margin to the slowdown point (T.Limit)
    tlimit_slowdown_c: float | None = None
    throttle: dict[str, bool] = field(default_factory=dict)  # reason name -> active
    virtualization: str | None = None  # "VGPU" in a vGPU guest
    mig_enabled: bool | None = None
    lines: dict[str, str] = field(default_factory=dict)  # field -> raw line (evidence)


@dataclass(slots=True)
class Parsed:
    format: str
    sample: Sample
    gpu_info: dict[int, GpuInfo] = field(default_factory=dict)
    facts: list[Fact] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped_lines: int = 0  # lines a lenient parser dropped (counted, never fatal)
    kernel_lines: int = 0  # lines the kernel-line reader proved the kernel's (a kernel prefix or an event)


def coverage(p: Parsed) -> list[str]:
    """What a parsed capture can speak to (``gpu``, ``gpu-memory``, ``xid``, ``pcie``, ``nvlink``,
    ``thermal``, ``network``, ``host-memory``, ``kernel-log``, ``tool-report``). Empty: the capture
    holds no value any rule could fire on — "no evidence", which is not "healthy"."""
    out: set[str] = set()
    s = p.sample
    for g in s.gpus:
        if not g.present or g.nvml_error:
            out.add("gpu")
        # ECC switched off: its counters say nothing about the memory ("no ECC evidence")
        if g.ecc_mode_current is not False and (
                _any_value(g.ecc) or _any_value(g.remapped_rows) or _any_value(g.retired_pages)):
            out.add("gpu-memory")
        if g.xids:
            out.add("xid")
        if _any_value(g.pcie):
            out.add("pcie")
        if g.nvlink is not None and any(getattr(g.nvlink, f) for f in g.nvlink.__struct_fields__):
            out.add("nvlink")
        if g.temperature_c is not None or g.clocks_event_reasons is not None:
            out.add("thermal")
    for info in p.gpu_info.values():
        if info.throttle or info.temp_slowdown_c is not None or info.tlimit_c is not None:
            out.add("thermal")
    if s.net_ports:
        out.add("network")
    if s.aer:
        out.add("pcie")
    if s.edac:
        out.add("host-memory")
    if s.kernel_events or p.kernel_lines:
        out.add("kernel-log")
    if any(f.kind != "gpu_uuid" for f in p.facts):
        out.add("tool-report")
    return sorted(out)


def _any_value(obj: Any) -> bool:
    return obj is not None and any(getattr(obj, f) is not None for f in obj.__struct_fields__)


def empty_sample(**kw: Any) -> Sample:
    return Sample(host=PLACEHOLDER_HOST, ts=0.0, seq=0, collector_version="parsers", **kw)


def new_parsed(fmt: str, gpus: list[GpuSample] | None = None) -> Parsed:
    return Parsed(fmt, empty_sample(gpus=gpus or []))


_NA = {"", "n/a", "na", "[n/a]", "not supported", "[not supported]", "unknown", "[unknown error]",
       "requested functionality has been deprecated", "none", "-"}
_NUM = re.compile(r"^[+-]?\d+(?:\.\d+)?")


def is_na(value: str | None) -> bool:
    return value is None or value.strip().lower() in _NA


def to_count(value: str | None) -> int | None:
    """A counter as text -> int (``None`` for N/A and anything not a non-negative integer)."""
    if is_na(value):
        return None
    v = value.strip()  # type: ignore[union-attr]
    try:
        n = int(v, 0) if v.lower().startswith("0x") else int(v)
    except ValueError:
        return None
    return n if 0 <= n <= U64_MAX else None


def to_number(value: str | None) -> float | None:
    """``"41 C"`` / ``"69.85 W"`` / ``"16x"`` -> the leading number, or None."""
    if is_na(value):
        return None
    m = _NUM.match(value.strip())  # type: ignore[union-attr]
    if not m:
        return None
    try:
        return float(m.group(0))
    except ValueError:  # pragma: no cover - the regex admits only numbers
        return None


def clamp_gauge(v: float | None) -> float | None:
    """The contract bounds gauges to [-1e6, 1e7]; anything outside is a misread, dropped."""
    if v is None or not (-1e6 <= v <= 1e7):
        return None
    return v


def to_small(value: str | None) -> int | None:
    n = to_number(value)
    if n is None or n < 0 or n > 1_000_000:
        return None
    return int(n)


def yes_no(value: str | None) -> bool | None:
    if is_na(value):
        return None
    v = value.strip().lower()  # type: ignore[union-attr]
    if v in ("yes", "true", "active", "enabled", "1"):
        return True
    if v in ("no", "false", "not active", "disabled", "0"):
        return False
    return None


pci_norm = _normalise_pci  # one canonical form for every part (fleethealth.ids)
