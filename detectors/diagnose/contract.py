"""A parsed capture as the engine's input: the telemetry contract plus the capture-only facts.

This module makes no decisions (no thresholds, no benign lists, no labels): it only moves values
into the shape the one rule set reads. ``diagnose`` then runs the streaming rules in snapshot mode.

* A kernel log is judged from its kernel events alone, exactly as the collector's follower feeds
  them to the stream: the multi-line facts the kernel-log parser derives (AER names under a header,
  "caused by previous Xid", decoded MCE records) are not passed on; the rules read the lines.
* nvidia-smi's per-GPU extras (performance state, temperature limits) become ``gpu_info`` facts.
* a PCIe device's trained link (lspci LnkSta/LnkCap, sysfs link files) becomes a ``pci_link`` fact
  with the device class when the capture names it.
* a Xid seen as a metric (dcgm-exporter) becomes a Xid event of its GPU.
"""

from __future__ import annotations

from typing import Any

import msgspec

from fleethealth.schema import GpuSample, GpuThermal, KernelEvent, Sample, XidEvent
from parsers.base import Fact, Parsed

KERNEL_FORMATS = ("kernel-log",)


def _gpu_name(g: GpuSample) -> str:
    return g.uuid or (f"gpu{g.index} ({g.pci_bus_id})" if g.pci_bus_id else f"gpu{g.index}")


def to_contract(p: Parsed, host: str | None = None) -> tuple[Sample, list[Fact]]:
    sample = msgspec.structs.replace(p.sample, host=host or p.sample.host or "unknown",
                                     gpus=list(p.sample.gpus), kernel_events=list(p.sample.kernel_events))
    if p.format in KERNEL_FORMATS:
        return sample, []
    facts = [f for f in p.facts if f.kind != "xid_metric"]
    if p.format == "lspci-vvv":
        # lspci's UESta/CESta are sticky status bits, not counters: they travel as facts only
        sample.aer = [msgspec.structs.replace(a, correctable={}, fatal={}, nonfatal={}) for a in sample.aer]
    for k, g in enumerate(sample.gpus):
        gi = p.gpu_info.get(g.index)
        if gi is None:
            continue
        if g.thermal is None and any(v is not None for v in (gi.temp_slowdown_c, gi.mem_temp_c)):
            # the board's limits as nvidia-smi printed them: what NVML's thresholds give the stream
            sample.gpus[k] = g = msgspec.structs.replace(g, thermal=GpuThermal(
                slowdown_c=gi.temp_slowdown_c, shutdown_c=gi.temp_shutdown_c, gpu_max_c=gi.temp_max_operating_c,
                mem_max_c=gi.mem_max_operating_c, memory_c=gi.mem_temp_c))
        pl = g.pcie
        attrs: dict[str, Any] = {
            "index": g.index, "pstate": (gi.pstate or "").upper() or None, "idle": bool(gi.throttle.get("Idle")),
            "temp_c": g.temperature_c, "slowdown_c": gi.temp_slowdown_c, "shutdown_c": gi.temp_shutdown_c,
            "max_operating_c": gi.temp_max_operating_c, "mem_temp_c": gi.mem_temp_c,
            "mem_max_operating_c": gi.mem_max_operating_c, "tlimit_c": gi.tlimit_c,
            "tlimit_slowdown_c": gi.tlimit_slowdown_c, "virtualization": gi.virtualization,
            "gen_current": pl.gen_current if pl else None, "gen_max": pl.gen_max if pl else None,
            "width_current": pl.width_current if pl else None, "width_max": pl.width_max if pl else None,
        }
        lines = gi.lines
        line = lines.get("temp") or lines.get("pcie_gen") or lines.get("pcie_width") or ""
        facts.append(Fact("gpu_info", _gpu_name(g), attrs, line))
        for key, raw in lines.items():
            facts.append(Fact("gpu_line", _gpu_name(g), {"key": key}, raw))
    classes = {f.component: f.attrs.get("class", "") for f in p.facts if f.kind == "pci_device"}
    lnk = {f.component: f.line for f in p.facts if f.kind == "lnksta"}
    for dev in sample.aer:
        if dev.link_width_current is None and dev.link_gen_current is None:
            continue
        cls = classes.get(dev.pci_addr)
        facts.append(Fact("pci_link", dev.pci_addr, {
            "class": cls, "bridge": bool(cls and cls.lower().endswith("bridge")),
            "width_current": dev.link_width_current, "width_max": dev.link_width_max,
            "gen_current": dev.link_gen_current, "gen_max": dev.link_gen_max,
            # the slot's capability is in the sample: the stream rule pcie.aer.width-slot judges it
            "slot_known": dev.upstream_width_max is not None}, lnk.get(dev.pci_addr, "")))
    by_name = {_gpu_name(g): i for i, g in enumerate(sample.gpus)}
    by_name.update({f"gpu{g.index}": i for i, g in enumerate(sample.gpus)})
    by_name.update({g.uuid: i for i, g in enumerate(sample.gpus) if g.uuid})
    for f in p.facts:
        if f.kind != "xid_metric":
            continue
        i = by_name.get(f.component)
        if i is not None:
            g = sample.gpus[i]
            sample.gpus[i] = msgspec.structs.replace(g, xids=[*g.xids, XidEvent(xid=f.attrs["xid"], ts=sample.ts,
                                                                                message=f.line)])
        else:
            sample.kernel_events.append(KernelEvent(ts=sample.ts, kind="xid", xid=f.attrs["xid"], line=f.line,
                                                    pci_addr=f.attrs.get("pci") or None))
    return sample, facts


def component_names(p: Parsed) -> dict[str, str]:
    """How to print a component the capture names better: a PCI address whose GPU UUID the driver
    printed ("NVRM: GPU at PCI:...: GPU-..."). Presentation only: the rules never read it."""
    return {f.component: f.attrs["uuid"] for f in p.facts if f.kind == "gpu_uuid" and f.attrs.get("uuid")}
