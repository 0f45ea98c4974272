"""``nvidia-smi -q`` text (full report and ``-d`` sub-reports), several driver generations (pure).

ECC layouts handled: Ampere+ ``SRAM/DRAM Correctable/Uncorrectable`` (Hopper adds ``SRAM
Uncorrectable Parity`` / ``SEC-DED``, summed), and pre-Ampere ``Single Bit`` / ``Double Bit`` with
``Device Memory`` / ``Register File`` / ``L1`` / ``L2`` / ``Total`` (device memory = DRAM, the rest
of the total = SRAM). ``Clocks Event Reasons`` and the older ``Clocks Throttle Reasons`` map onto
NVML's reason bitmask. MIG device sub-blocks are skipped (their counters are the parent's).
"""

from __future__ import annotations

import re

from fleethealth.schema import EccCounters, GpuSample, PcieLink, RemappedRows, RetiredPages
from parsers.base import (
    GpuInfo,
    Parsed,
    ParseError,
    clamp_gauge,
    is_na,
    pci_norm,
    to_count,
    to_number,
    to_small,
    yes_no,
)
from parsers.nvsmi_report import old_layout, report, retirement_pending, set_scope, sum_present
from parsers.nvsmi_tree import FORMAT, Node, parse_tree

# NVML clocks-event reason bits (nvmlClocksEventReason*), keyed by the name nvidia-smi prints.
THROTTLE_BITS = {
    "idle": 0x1, "applications clocks setting": 0x2, "sw power cap": 0x4, "hw slowdown": 0x8,
    "sync boost": 0x10, "sw thermal slowdown": 0x20, "hw thermal slowdown": 0x40,
    "hw power brake slowdown": 0x80, "display clock setting": 0x100,
}
_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$")


def parse(text: str) -> Parsed:
    root = parse_tree(text)
    blocks = [n for n in root.children if _GPU_HEADER.match(n.key)]
    if not blocks:
        raise ParseError(FORMAT, "no 'GPU <bus id>' section found")
    return report(FORMAT, blocks, root.get("Attached GPUs"), root.get("Driver Version"), _gpu,
                  "header says {attached} attached GPUs but {n} GPU sections follow")


def _gpu(index: int, b: Node, warnings: list[str]) -> tuple[GpuSample, GpuInfo]:
    m = _GPU_HEADER.match(b.key)
    bus = pci_norm(m.group(1)) if m else ""
    info = GpuInfo()
    gpu = GpuSample(index=index, pci_bus_id=bus, uuid=(b.get("GPU UUID") or "")[:256],
                    name=(b.get("Product Name") or "")[:256])
    ecc_node = b.child("ECC Errors")
    if ecc_node is not None:
        gpu.ecc = _ecc(ecc_node)
    gpu.ecc_mode_current = yes_no(b.get("ECC Mode", "Current"))
    gpu.ecc_mode_pending = yes_no(b.get("ECC Mode", "Pending"))
    brand = b.get("Product Brand")
    gpu.brand = brand[:256] if brand and not is_na(brand) else None
    rp = b.child("Retired Pages")
    if rp is not None:
        gpu.retired_pages = _retired(rp)
        _remember(info, rp, "Double Bit ECC", "Single Bit ECC", "Pending Page Blacklist", "Pending Page Retirement")
    rr = b.child("Remapped Rows")
    if rr is not None and rr.children:
        gpu.remapped_rows = RemappedRows(
            correctable=to_count(rr.get("Correctable Error")),
            uncorrectable=to_count(rr.get("Uncorrectable Error")),
            pending=yes_no(rr.get("Pending")),
            failure=yes_no(rr.get("Remapping Failure Occurred")),
        )
        hist = rr.child("Bank Remap Availability Histogram")
        if hist is not None:  # "Max : 2560 bank(s)" ... "None : 0 bank(s)"
            for key in ("Max", "High", "Partial", "Low", "None"):
                setattr(gpu.remapped_rows, f"hist_{key.lower()}", to_count((hist.get(key) or "").split(" ")[0]))
        _remember(info, rr, "Uncorrectable Error", "Pending", "Remapping Failure Occurred")
    pci = b.child("PCI")
    if pci is not None:
        gpu.pcie = _pcie(pci, info)
    info.pstate = b.get("Performance State")
    if info.pstate:
        info.lines["pstate"] = b.child("Performance State").raw.strip()  # type: ignore[union-attr]
    reasons = b.child("Clocks Event Reasons") or b.child("Clocks Throttle Reasons")
    if reasons is not None:
        gpu.clocks_event_reasons = _throttle(reasons, info, warnings, index)
    temp = b.child("Temperature")
    if temp is not None:
        _temperature(temp, gpu, info)
    power = b.child("GPU Power Readings") or b.child("Power Readings")
    if power is not None:
        gpu.power_w = clamp_gauge(to_number(power.get("Power Draw") or power.get("Average Power Draw")
                                            or power.get("Instantaneous Power Draw")))
    util = b.get("Utilization", "GPU") or b.get("Utilization", "Gpu")
    gpu.utilization_pct = clamp_gauge(to_number(util))
    virt = b.get("GPU Virtualization Mode", "Virtualization Mode")
    info.virtualization = virt
    mig = b.get("MIG Mode", "Current")
    info.mig_enabled = yes_no(mig)
    return gpu, info


def _remember(info: GpuInfo, node: Node, *keys: str) -> None:
    for k in keys:
        c = node.child(k)
        if c is not None:
            info.lines[f"{node.key}/{k}"] = c.raw.strip()


def _ecc(node: Node) -> EccCounters:
    ecc = EccCounters()
    for scope in ("Volatile", "Aggregate"):
        s = node.child(scope)
        if s is None:
            continue
        if s.child("Single Bit") is not None or s.child("Double Bit") is not None:
            dram_c, sram_c = _old_layout(s.child("Single Bit"))
            dram_u, sram_u = _old_layout(s.child("Double Bit"))
        else:
            dram_c = to_count(s.get("DRAM Correctable"))
            dram_u = to_count(s.get("DRAM Uncorrectable"))
            sram_c = to_count(s.get("SRAM Correctable"))
            sram_u = sum_present(to_count(s.get("SRAM Uncorrectable")), to_count(s.get("SRAM Uncorrectable Parity")),
                                 to_count(s.get("SRAM Uncorrectable SEC-DED")))
            # Volta/Turing drivers print "Device Memory"/"Total" without the Single/Double split
        set_scope(ecc, scope.lower(), dram_c, dram_u, sram_c, sram_u)
        if scope == "Aggregate":
            ecc.sram_threshold_exceeded = yes_no(s.get("SRAM Threshold Exceeded"))
    return ecc


def _old_layout(node: Node | None) -> tuple[int | None, int | None]:
    if node is None:
        return None, None
    parts = [to_count(node.get(k)) for k in ("Register File", "L1 Cache", "L2 Cache", "Texture Memory",
                                             "Texture Shared", "CBU", "SRAM")]
    return old_layout(to_count(node.get("Device Memory")), to_count(node.get("Total")), parts)


def _retired(node: Node) -> RetiredPages:
    def count(key: str) -> int | None:
        c = node.child(key)
        if c is None:
            return None
        if c.value is not None:
            return to_count(c.value)
        return to_count(c.get("Retired Pages") or c.get("Count"))  # older: a sub-block with the count

    pending = retirement_pending(node.get("Pending Page Blacklist"), node.get("Pending Page Retirement"))
    return RetiredPages(sbe=count("Single Bit ECC"), dbe=count("Double Bit ECC"), pending=pending)


def _pcie(pci: Node, info: GpuInfo) -> PcieLink:
    link = pci.child("GPU Link Info")
    gen = link.child("PCIe Generation") if link else None
    width = link.child("Link Width") if link else None
    pl = PcieLink(
        gen_current=to_small(gen.get("Current")) if gen else None,
        gen_max=to_small(gen.get("Max")) if gen else None,
        width_current=to_small(width.get("Current")) if width else None,
        width_max=to_small(width.get("Max")) if width else None,
        replay_counter=to_count(pci.get("Replays Since Reset") or pci.get("Replays since reset")),
        replay_rollover=to_count(pci.get("Replay Number Rollovers")),
    )
    if gen is not None and gen.child("Current") is not None:
        info.lines["pcie_gen"] = f"PCIe Generation Max {gen.get('Max')} Current {gen.get('Current')}"
    if width is not None:
        info.lines["pcie_width"] = f"Link Width Max {width.get('Max')} Current {width.get('Current')}"
    replay = pci.child("Replays Since Reset")
    if replay is not None:
        info.lines["pcie_replay"] = replay.raw.strip()
    return pl


def _throttle(node: Node, info: GpuInfo, warnings: list[str], index: int) -> int | None:
    mask = 0
    seen = False

    def walk(n: Node) -> None:
        nonlocal mask, seen
        for c in n.children:
            name = c.key.lower()
            active = yes_no(c.value)
            if name in THROTTLE_BITS:
                seen = True
                if active is not None:
                    info.throttle[c.key] = active
                    if active:
                        mask |= THROTTLE_BITS[name]
                        info.lines[f"throttle/{c.key}"] = c.raw.strip()
            else:
                warnings.append(f"GPU {index}: unknown clocks-event reason {c.key!r} (line {c.lineno})")
            walk(c)

    walk(node)
    return mask if seen else None


def _temperature(t: Node, gpu: GpuSample, info: GpuInfo) -> None:
    cur = t.child("GPU Current Temp")
    gpu.temperature_c = clamp_gauge(to_number(cur.value if cur else None))
    if cur is not None:
        info.lines["temp"] = cur.raw.strip()
    info.temp_slowdown_c = to_number(t.get("GPU Slowdown Temp"))
    info.temp_shutdown_c = to_number(t.get("GPU Shutdown Temp"))
    mo = t.child("GPU Max Operating Temp")
    info.temp_max_operating_c = to_number(mo.value if mo else None)
    if mo is not None:
        info.lines["temp_max_operating"] = mo.raw.strip()
    info.mem_temp_c = to_number(t.get("Memory Current Temp"))
    info.mem_max_operating_c = to_number(t.get("Memory Max Operating Temp"))
    info.tlimit_c = to_number(t.get("GPU T.Limit Temp"))
    info.tlimit_slowdown_c = to_number(t.get("GPU Slowdown T.Limit Temp"))
