"""Snapshot rules for host parts in one parsed capture: PCIe AER, InfiniBand/RoCE ports, host DRAM,
and the facts only some tools print (NVLink status, diag and health logs)."""

from __future__ import annotations

from collections import Counter, defaultdict

from collectors.parsers.base import Parsed
from detectors.diagnose_gpu import make
from detectors.diagnose_rules import DiagnoseRules
from detectors.finding import Finding

DLL_LAYER = "data link layer"


def evaluate_pcie(p: Parsed, host: str, rules: DiagnoseRules) -> list[Finding]:
    r = rules.pcie
    out: list[Finding] = []
    benign = {b.lower() for b in r["aer_benign_nonfatal"]}
    dll: dict[str, list[str]] = defaultdict(list)
    for f in p.facts:
        if f.kind == "aer_error" and f.attrs["severity"] in ("fatal", "non-fatal", "uncorrected"):
            if f.attrs["severity"] == "non-fatal" and f.attrs["name"].lower() in benign:
                continue
            out.append(make(host, f.component, "pcie_fatal", "aer_uncorrectable",
                            f"AER {f.attrs['severity']} error: {f.attrs['name']}", f.line,
                            confidence=0.9, xid=None))
            out[-1].detector += ":surprise_down" if "surprise down" in f.attrs["name"].lower() else ""
        elif f.kind == "aer_header" and f.attrs["severity"] == "corrected" and f.attrs["layer"].lower() == DLL_LAYER:
            dll[f.component].append(f.line)
        elif f.kind == "uesta":
            bad = sorted(set(f.attrs["bits"]) & set(r["sticky_uncorrectable_bits"]))
            if bad:
                out.append(make(host, f.component, "pcie_fatal", "lspci_uesta",
                                f"uncorrectable AER status bits set (sticky, since last clear): {', '.join(bad)}",
                                f.line, confidence=r["sticky_confidence"]))
    for comp, lines in dll.items():
        if len(lines) >= r["aer_dll_corrected_min"]:
            out.append(make(host, comp, "pcie_link_degraded", "aer_dll_corrected",
                            f"{len(lines)} corrected Data Link Layer AER errors (replays/timeouts) in the capture",
                            lines[0], confidence=0.6))
    # lspci: an endpoint whose link trained narrower than it can; bridges re-train to their device
    endpoints = {f.component for f in p.facts if f.kind == "pci_device"
                 and not f.attrs["class"].lower().endswith("bridge")}
    lnk = {f.component: f.line for f in p.facts if f.kind == "lnksta"}
    for dev in p.sample.aer:
        if dev.pci_addr in endpoints and dev.link_width_current and dev.link_width_max \
                and dev.link_width_current < dev.link_width_max:
            out.append(make(host, dev.pci_addr, "pcie_link_degraded", "lspci_width",
                            f"link width x{dev.link_width_current} of x{dev.link_width_max}",
                            lnk.get(dev.pci_addr, ""), confidence=r["width_confidence"]))
        for name, counts in (("fatal", dev.fatal), ("nonfatal", dev.nonfatal)):
            total = counts.get(f"TOTAL_ERR_{name.upper()}") or 0
            if total and p.format == "sysfs-snapshot":
                out.append(make(host, dev.pci_addr, "pcie_fatal", f"aer_sysfs_{name}",
                                f"aer_dev_{name} TOTAL_ERR_{name.upper()} = {total}"))
    return out


def evaluate_net(p: Parsed, host: str, rules: DiagnoseRules) -> list[Finding]:
    r = rules.net
    out: list[Finding] = []
    lines = {f.component: f.line for f in p.facts if f.kind == "ib_port_line"}
    for port in p.sample.net_ports:
        comp = f"{port.device}/{port.port}"
        if port.state in ("DOWN", "INIT") or port.phys_state in r["down_phys_states"]:
            out.append(make(host, comp, "net_link_down", "port_down",
                            f"port state {port.state or '?'}, physical state {port.phys_state or '?'}"))
            continue
        bad = []
        saturated = False
        for name, limit in r["cable_thresholds"].items():
            v = port.counters.get(name)
            if v is None or v < limit:
                continue
            bits = r["counter_bits"].get(name)
            sat = bits is not None and v == (1 << bits) - 1
            saturated |= sat
            bad.append(f"{name}={v}" + (" (saturated: at least this many)" if sat else ""))
        if bad:
            out.append(make(host, comp, "net_link_bad_cable", "port_errors", "port error counters: " + ", ".join(bad),
                            lines.get(comp, ""), confidence=0.9 if saturated or len(bad) > 1 else 0.75))
    speeds = [f for f in p.facts if f.kind == "ib_link_speed" and f.attrs["gbps"]]
    if len(speeds) >= 3:
        common, _ = Counter(f.attrs["gbps"] for f in speeds).most_common(1)[0]
        for f in speeds:
            if f.attrs["gbps"] < common:
                out.append(make(host, f.component, "net_link_bad_cable", "ib_speed_below_fabric",
                                f"link trained {f.attrs['lanes']}x {f.attrs['speed']} ({f.attrs['gbps']} Gb/s) "
                                f"while the fabric runs {common} Gb/s", f.line,
                                confidence=r["speed_below_fabric_confidence"]))
    return out


def evaluate_dram(p: Parsed, host: str, rules: DiagnoseRules) -> list[Finding]:
    r = rules.host_dram
    ue: list[Finding] = []
    ce: list[Finding] = []
    have_edac_lines = any(f.kind == "dram_error" for f in p.facts)
    ce_log: dict[str, list[str]] = defaultdict(list)
    for f in p.facts:
        if f.kind == "dram_error":
            if f.attrs["uncorrected"]:
                ue.append(make(host, f.component, "host_dram_uce", "edac_ue", f"{f.attrs['count']} uncorrected "
                               f"memory error(s): {f.attrs['what']}", f.line))
            else:
                ce_log[f.component] += [f.line] * min(f.attrs["count"], 10_000)  # a logged count of 2**64-1 must not build a list that size
        elif f.kind == "mce_record" and f.attrs.get("memory") and not have_edac_lines:
            if f.attrs["uncorrected"]:
                ue.append(make(host, f.component, "host_dram_uce", "mce_memory_ue",
                               f"uncorrected machine check: {f.attrs['desc']} (status {f.attrs['status']})", f.line))
            else:
                ce_log[f.component].append(f.line)
        elif f.kind == "dimm_counts":
            if f.attrs["ue"]:
                ue.append(make(host, f.component, "host_dram_uce", "dimm_ue", f"DIMM UE count {f.attrs['ue']}", f.line))
            elif f.attrs["ce"] >= r["ce_counter_min"]:
                ce.append(make(host, f.component, "host_dram_ce_storm", "dimm_ce",
                               f"DIMM CE count {f.attrs['ce']} (>= {r['ce_counter_min']})", f.line, confidence=0.8))
    for comp, lines in ce_log.items():
        if len(lines) >= r["ce_log_min"]:
            ce.append(make(host, comp, "host_dram_ce_storm", "dram_ce_logged",
                           f"{len(lines)} corrected DRAM error(s) logged on {comp}", lines[0],
                           confidence=min(0.9, 0.4 + 0.1 * len(lines))))
    for mc in p.sample.edac:
        comp = f"mc{mc.mc}"
        if (mc.ue_count or 0) + (mc.ue_noinfo_count or 0) > 0:
            ue.append(make(host, comp, "host_dram_uce", "edac_mc_ue",
                           f"EDAC mc{mc.mc} ue_count={mc.ue_count} ue_noinfo_count={mc.ue_noinfo_count}"))
        elif (mc.ce_count or 0) >= r["ce_counter_min"]:
            ce.append(make(host, comp, "host_dram_ce_storm", "edac_mc_ce", f"EDAC mc{mc.mc} ce_count={mc.ce_count}",
                           confidence=0.8))
    # one DIMM verdict per host: an uncorrectable error makes the corrected ones its prelude
    return ue if ue else ce


def evaluate_facts(p: Parsed, host: str) -> list[Finding]:
    out: list[Finding] = []
    for f in p.facts:
        if f.kind == "nvlink_all_inactive":
            out.append(make(host, f.component, "gpu_nvlink_error", "nvlink_all_inactive",
                            "all NVLink links inactive", f.line, confidence=0.8))
        elif f.kind == "nvlink_down":
            out.append(make(host, f.component, "gpu_nvlink_error", "nvlink_down",
                            f"NVLink links down: {len(f.attrs['links'])} of {f.attrs['of']}", f.line, confidence=0.8))
        elif f.kind in ("gpu_no_handle", "gpu_err"):
            out.append(make(host, f.component, "gpu_fell_off_bus", f.kind,
                            "nvidia-smi cannot reach the GPU", f.line, confidence=0.85))
        elif f.kind == "dcgm_health":
            mode = {"thermal": "gpu_thermal", "nvlink": "gpu_nvlink_error", "pcie": "pcie_link_degraded",
                    "mem": "gpu_dram_uce", "memory": "gpu_dram_uce", "sm": "gpu_hw_error"}.get(f.attrs["system"])
            if mode:
                out.append(make(host, f.component, mode, f"dcgm_health_{f.attrs['system']}",
                                f"DCGM health {f.attrs['level']} in {f.attrs['system']}", f.line,
                                confidence=0.6 if f.attrs["level"] == "WARNING" else 0.8))
        elif f.kind == "fm_error" and "fatal" in f.attrs["msg"].lower() and "non-fatal" not in f.attrs["msg"].lower():
            out.append(make(host, f.component, "gpu_nvlink_error", "fabricmanager_fatal",
                            "NVSwitch fatal error reported by the fabric manager", f.line, confidence=0.7))
    return out
