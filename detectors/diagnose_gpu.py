"""Snapshot rules for GPUs in one parsed capture: memory errors, PCIe link, thermal, NVLink, Xids."""

from __future__ import annotations

from collections import defaultdict

from collectors.parsers.base import GpuInfo, Parsed
from detectors.diagnose_rules import DiagnoseRules
from detectors.finding import Finding
from fleethealth.schema import Evidence, GpuSample
from fleethealth.taxonomy import info
from fleethealth.xid import lookup

THERMAL_BITS = {0x20: "SW Thermal Slowdown", 0x40: "HW Thermal Slowdown"}


def make(host: str, component: str, mode: str, rule: str, fact: str, line: str = "", *,
         confidence: float = 0.9, severity: str | None = None, xid: int | None = None,
         bucket: str | None = None, actions: list[str] | None = None) -> Finding:
    mi = info(mode)
    return Finding(host=host, component=component or "host", failure_mode=mode,
                   severity=severity or mi.severity.value, confidence=confidence, detector=f"diagnose:{rule}",
                   ts=0.0, evidence=[Evidence(fact=fact[:8192], line=line[:8192])],
                   recommended_action=actions if actions is not None else [a.value for a in mi.actions],
                   xid=xid, nvidia_bucket=bucket)


def _comp(g: GpuSample) -> str:
    return g.uuid or (f"gpu{g.index} ({g.pci_bus_id})" if g.pci_bus_id else f"gpu{g.index}")


def evaluate_gpus(p: Parsed, host: str, rules: DiagnoseRules) -> list[Finding]:
    out: list[Finding] = []
    for g in p.sample.gpus:
        gi = p.gpu_info.get(g.index, GpuInfo())
        comp = _comp(g)
        if not g.present or g.nvml_error == "GPU_IS_LOST":
            out.append(make(host, comp, "gpu_fell_off_bus", "gpu_lost", f"GPU {g.index} is lost ({g.nvml_error})"))
        out += _memory(host, comp, g, gi)
        out += _pcie(host, comp, g, gi, rules)
        out += _thermal(host, comp, g, gi, rules)
        out += _nvlink(host, comp, g, rules)
    return out


def _memory(host: str, comp: str, g: GpuSample, gi: GpuInfo) -> list[Finding]:
    out: list[Finding] = []
    e = g.ecc
    if e is not None:
        if (e.dram_uncorrected_volatile or 0) > 0:
            out.append(make(host, comp, "gpu_dram_uce", "ecc_dram_uce",
                            f"volatile DRAM uncorrectable ECC errors = {e.dram_uncorrected_volatile}"))
        if (e.sram_uncorrected_volatile or 0) > 0:
            out.append(make(host, comp, "gpu_sram_uce", "ecc_sram_uce",
                            f"volatile SRAM uncorrectable ECC errors = {e.sram_uncorrected_volatile}"))
        elif e.sram_threshold_exceeded:
            out.append(make(host, comp, "gpu_sram_uce", "sram_threshold",
                            "SRAM Threshold Exceeded: Yes (NVIDIA's SRAM UCE threshold passed)", confidence=0.8))
    r = g.remapped_rows
    if r is not None:
        if r.failure:
            out.append(make(host, comp, "gpu_row_remap_failure", "remap_failure", "Remapping Failure Occurred: Yes",
                            gi.lines.get("Remapped Rows/Remapping Failure Occurred", "")))
        elif r.pending:
            out.append(make(host, comp, "gpu_row_remap_pending", "remap_pending", "row remap pending: Yes",
                            gi.lines.get("Remapped Rows/Pending", "")))
    rp = g.retired_pages
    if rp is not None and (rp.dbe or 0) > 0:
        total = (rp.dbe or 0) + (rp.sbe or 0)
        why = f"{rp.dbe} page(s) retired for double-bit (uncorrectable) ECC errors, {total} retired in all"
        if rp.pending:
            why += "; retirement pending until the next GPU reset"
        out.append(make(host, comp, "gpu_dram_uce", "retired_pages_dbe", why,
                        gi.lines.get("Retired Pages/Double Bit ECC", ""), confidence=0.95 if total >= 60 else 0.8))
    return out


def _pcie(host: str, comp: str, g: GpuSample, gi: GpuInfo, rules: DiagnoseRules) -> list[Finding]:
    out: list[Finding] = []
    pl = g.pcie
    if pl is None:
        return out
    r = rules.pcie
    busy = (gi.pstate or "").upper() in {s.upper() for s in r["busy_pstates"]} and not gi.throttle.get("Idle", False)
    if pl.width_current and pl.width_max and pl.width_current < pl.width_max:
        out.append(make(host, comp, "pcie_link_degraded", "pcie_width",
                        f"PCIe link width x{pl.width_current} of x{pl.width_max} (performance state {gi.pstate})",
                        gi.lines.get("pcie_width", ""), confidence=r["width_confidence"]))
    elif pl.gen_current and pl.gen_max and pl.gen_current < pl.gen_max and busy:
        out.append(make(host, comp, "pcie_link_degraded", "pcie_gen",
                        f"PCIe gen {pl.gen_current} of {pl.gen_max} while busy ({gi.pstate})",
                        gi.lines.get("pcie_gen", ""), confidence=r["gen_confidence"]))
    if pl.replay_counter is not None and pl.replay_counter >= r["replay_min"]:
        out.append(make(host, comp, "pcie_link_degraded", "pcie_replay",
                        f"{pl.replay_counter} PCIe replays since reset (>= {r['replay_min']})",
                        gi.lines.get("pcie_replay", ""), confidence=0.6))
    return out


def _thermal(host: str, comp: str, g: GpuSample, gi: GpuInfo, rules: DiagnoseRules) -> list[Finding]:
    reasons = g.clocks_event_reasons or 0
    active = [name for bit, name in THERMAL_BITS.items() if reasons & bit]
    if active:
        line = next((v for k, v in gi.lines.items() if k.startswith("throttle/") and "thermal" in k.lower()), "")
        return [make(host, comp, "gpu_thermal", "thermal_slowdown",
                     f"{' and '.join(active)} active at {g.temperature_c} C", line, confidence=0.7)]
    t = g.temperature_c
    margin = rules.gpu["thermal_margin_c"]
    if t is not None and gi.temp_slowdown_c and t >= gi.temp_slowdown_c:
        return [make(host, comp, "gpu_thermal", "temp_slowdown", f"GPU at {t} C >= slowdown {gi.temp_slowdown_c} C",
                     gi.lines.get("temp", ""))]
    if t is not None and gi.temp_max_operating_c and t >= gi.temp_max_operating_c - margin:
        return [make(host, comp, "gpu_thermal", "temp_max_operating",
                     f"GPU at {t} C, within {margin} C of its max operating temperature {gi.temp_max_operating_c} C",
                     gi.lines.get("temp", ""), confidence=0.6)]
    if gi.tlimit_c is not None and gi.tlimit_slowdown_c is not None and gi.tlimit_c <= gi.tlimit_slowdown_c:
        return [make(host, comp, "gpu_thermal", "tlimit", f"T.Limit margin {gi.tlimit_c} C <= slowdown "
                     f"{gi.tlimit_slowdown_c} C", gi.lines.get("temp", ""), confidence=0.7)]
    if gi.mem_temp_c and gi.mem_max_operating_c and gi.mem_temp_c >= gi.mem_max_operating_c - margin:
        return [make(host, comp, "gpu_thermal", "mem_temp", f"HBM at {gi.mem_temp_c} C near max "
                     f"{gi.mem_max_operating_c} C", confidence=0.6)]
    return []


def _nvlink(host: str, comp: str, g: GpuSample, rules: DiagnoseRules) -> list[Finding]:
    nv = g.nvlink
    if nv is None:
        return []
    out: list[Finding] = []
    down = [i for i, a in enumerate(nv.active) if a is False]
    up = [i for i, a in enumerate(nv.active) if a]
    if down and up:
        out.append(make(host, comp, "gpu_nvlink_error", "nvlink_partly_down",
                        f"NVLink links {down} inactive while links {up} are up", confidence=0.7))
    for fld, key in (("replay", "nvlink_replay_min"), ("recovery", "nvlink_recovery_min")):
        vals = getattr(nv, fld)
        bad = [(i, v) for i, v in enumerate(vals) if v is not None and v >= rules.gpu[key]]
        if bad:
            out.append(make(host, comp, "gpu_nvlink_error", f"nvlink_{fld}",
                            f"NVLink {fld} errors: " + ", ".join(f"link {i}: {v}" for i, v in bad), confidence=0.6))
    return out


# --------------------------------------------------------------------------------------- Xids
HARDWARE_MODES = {"gpu_fell_off_bus", "gpu_dram_uce", "gpu_row_remap_failure", "gpu_row_remap_pending",
                  "gpu_sram_uce", "gpu_hw_error", "gpu_nvlink_error", "gpu_gsp_error"}


def evaluate_xids(events: list[tuple[str, int, str]], host: str) -> list[Finding]:
    """``events`` = (GPU component, Xid, raw line). NVIDIA's catalog semantics:

    * 45 (preemptive removal) following another Xid on the GPU follows that Xid; alone it is app_error.
    * application Xids on a GPU that also shows a hardware Xid are that fault's symptoms.
    * 48 alone: reset the GPU; 48 with 63/64: drain and reset (WORKFLOW_XID_48).
    * 94 contained vs 95 uncontained; both are sympathetic ("IGNORE (sympathetic)") when another
      GPU on the host shows a hardware root cause (NVLink, GSP, internal error, fell off the bus).
    """
    by_gpu: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for comp, xid, line in events:
        by_gpu[comp].append((xid, line))
    modes: dict[str, dict[int, str]] = {}
    for comp, evs in by_gpu.items():
        modes[comp] = {}
        for xid, _ in evs:
            xi = lookup(xid)
            modes[comp][xid] = xi.failure_mode if xi else ""
    root_cause_hosts = any(m in ("gpu_nvlink_error", "gpu_gsp_error", "gpu_hw_error", "gpu_fell_off_bus")
                           for ms in modes.values() for m in ms.values())
    out: list[Finding] = []
    for comp, evs in by_gpu.items():
        xids = {x for x, _ in evs}
        gpu_modes = modes[comp]
        hardware = {m for m in gpu_modes.values() if m in HARDWARE_MODES}
        emitted: set[tuple[str, int | None]] = set()
        for xid, line in evs:
            xi = lookup(xid)
            mode = gpu_modes[xid]
            if not mode or xi is None:
                continue
            if xid == 45 and xids - {45}:
                continue
            if mode == "app_error" and hardware:
                continue
            if xid in (94, 95) and root_cause_hosts and hardware <= {"gpu_dram_uce"}:
                continue  # sympathetic to the host's root-cause Xid (catalog: IGNORE (sympathetic))
            key = (mode, xid if mode != "app_error" else None)
            if key in emitted:
                continue
            emitted.add(key)
            actions = None
            fact = f"Xid {xid} {xi.mnemonic} (NVIDIA bucket {xi.bucket})"
            severity = None
            if xid == 48:
                if xids & {63, 64}:
                    fact += " with Xid 63/64: drain and reset"
                    actions = ["drain", "reset_gpu"]
                else:
                    fact += " alone: reset the GPU"
                    actions = ["reset_gpu", "ticket_if_recurs"]
            elif xid == 94:
                fact += ": contained; restart the application, reset the GPU when idle"
                actions, severity = ["reset_gpu"], "major"
            elif xid == 95:
                fact += ": uncontained; every application on the GPU is affected, reset the GPU"
            out.append(make(host, comp, mode, f"xid_{xid}", fact, line, xid=xid, bucket=xi.bucket,
                            actions=actions, severity=severity, confidence=0.95 if mode != "app_error" else 0.9))
    return out
