"""``nvidia-smi -q -x`` XML, DTD versions v10 to v12+ (pure).

``<attached_gpus>`` need not match the number of ``<gpu>`` elements (captures get trimmed): the
mismatch is a warning, never an error. Throttle reasons come as ``clocks_throttle_reasons`` (older)
or ``clocks_event_reasons`` (newer); temperature limits as absolute (``gpu_temp_slow_threshold``)
or T.Limit margins (``gpu_temp_tlimit``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

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

FORMAT = "nvidia-smi-xml"
_REASON_BITS = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80, "display_clocks_setting": 0x100,
}


def parse(text: str) -> Parsed:
    if "<!ENTITY" in text:
        raise ParseError(FORMAT, "entity declarations are not accepted")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ParseError(FORMAT, f"not well-formed XML: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise ParseError(FORMAT, f"root element is <{root.tag}>, expected <nvidia_smi_log>")
    return report(FORMAT, root.findall("gpu"), _text(root, "attached_gpus"), _text(root, "driver_version"),
                  lambda index, g, _warnings: _gpu(index, g),
                  "<attached_gpus> says {attached} but {n} <gpu> elements are present")


def _text(el: ET.Element | None, path: str) -> str | None:
    if el is None:
        return None
    f = el.find(path)
    if f is None or f.text is None:
        return None
    return f.text.strip()


def _gpu(index: int, g: ET.Element) -> tuple[GpuSample, GpuInfo]:
    info = GpuInfo()
    gpu = GpuSample(index=index, pci_bus_id=pci_norm(g.get("id", "")) if g.get("id") else "",
                    uuid=(_text(g, "uuid") or "")[:256], name=(_text(g, "product_name") or "")[:256])
    ecc = g.find("ecc_errors")
    if ecc is not None:
        gpu.ecc = _ecc(ecc)
    gpu.ecc_mode_current = yes_no(_text(g, "ecc_mode/current_ecc"))
    gpu.ecc_mode_pending = yes_no(_text(g, "ecc_mode/pending_ecc"))
    brand = _text(g, "product_brand")
    gpu.brand = brand[:256] if brand and not is_na(brand) else None
    rp = g.find("retired_pages")
    if rp is not None and len(rp):
        pending = retirement_pending(_text(rp, "pending_blacklist"), _text(rp, "pending_retirement"))
        gpu.retired_pages = RetiredPages(
            sbe=to_count(_text(rp, "multiple_single_bit_retirement/retired_count")),
            dbe=to_count(_text(rp, "double_bit_retirement/retired_count")), pending=pending)
    rr = g.find("remapped_rows")
    if rr is not None and len(rr):
        gpu.remapped_rows = RemappedRows(
            correctable=to_count(_text(rr, "remapped_row_corr")),
            uncorrectable=to_count(_text(rr, "remapped_row_unc")),
            pending=yes_no(_text(rr, "remapped_row_pending")),
            failure=yes_no(_text(rr, "remapped_row_failure")))
    pci = g.find("pci")
    if pci is not None:
        link = pci.find("pci_gpu_link_info")
        gpu.pcie = PcieLink(
            gen_current=to_small(_text(link, "pcie_gen/current_link_gen")),
            gen_max=to_small(_text(link, "pcie_gen/max_link_gen")),
            width_current=to_small(_text(link, "link_widths/current_link_width")),
            width_max=to_small(_text(link, "link_widths/max_link_width")),
            replay_counter=to_count(_text(pci, "replay_counter")),
            replay_rollover=to_count(_text(pci, "replay_rollover_counter")))
        info.lines["pcie_width"] = (f"<max_link_width>{_text(link, 'link_widths/max_link_width')}</max_link_width> "
                                    f"<current_link_width>{_text(link, 'link_widths/current_link_width')}"
                                    "</current_link_width>")
        info.lines["pcie_gen"] = (f"<max_link_gen>{_text(link, 'pcie_gen/max_link_gen')}</max_link_gen> "
                                  f"<current_link_gen>{_text(link, 'pcie_gen/current_link_gen')}</current_link_gen>")
    info.pstate = _text(g, "performance_state")
    info.lines["pstate"] = f"<performance_state>{info.pstate}</performance_state>"
    reasons = g.find("clocks_event_reasons")
    if reasons is None:
        reasons = g.find("clocks_throttle_reasons")
    if reasons is not None:
        mask, seen = 0, False
        for child in reasons:
            name = child.tag.replace("clocks_throttle_reason_", "").replace("clocks_event_reason_", "")
            bit = _REASON_BITS.get(name)
            active = yes_no(child.text)
            if bit is None or active is None:
                continue
            seen = True
            info.throttle[name] = active
            if active:
                mask |= bit
                info.lines[f"throttle/{name}"] = f"<{child.tag}>{child.text}</{child.tag}>"
        gpu.clocks_event_reasons = mask if seen else None
    t = g.find("temperature")
    if t is not None:
        gpu.temperature_c = clamp_gauge(to_number(_text(t, "gpu_temp")))
        info.lines["temp"] = f"<gpu_temp>{_text(t, 'gpu_temp')}</gpu_temp>"
        info.temp_shutdown_c = to_number(_text(t, "gpu_temp_max_threshold"))
        info.temp_slowdown_c = to_number(_text(t, "gpu_temp_slow_threshold"))
        info.temp_max_operating_c = to_number(_text(t, "gpu_temp_max_gpu_threshold"))
        info.mem_temp_c = to_number(_text(t, "memory_temp"))
        info.mem_max_operating_c = to_number(_text(t, "gpu_temp_max_mem_threshold"))
        info.tlimit_c = to_number(_text(t, "gpu_temp_tlimit"))
        info.tlimit_slowdown_c = to_number(_text(t, "gpu_temp_slow_tlimit_threshold"))
    power = _text(g, "gpu_power_readings/power_draw") or _text(g, "power_readings/power_draw") \
        or _text(g, "gpu_power_readings/average_power_draw")
    gpu.power_w = clamp_gauge(to_number(power))
    gpu.utilization_pct = clamp_gauge(to_number(_text(g, "utilization/gpu_util")))
    info.virtualization = _text(g, "gpu_virtualization_mode/virtualization_mode")
    info.mig_enabled = yes_no(_text(g, "mig_mode/current_mig"))
    return gpu, info


def _ecc(ecc: ET.Element) -> EccCounters:
    out = EccCounters()
    for scope in ("volatile", "aggregate"):
        s = ecc.find(scope)
        if s is None:
            continue
        if s.find("single_bit") is not None:  # pre-Ampere layout
            dc, sc = _old(s.find("single_bit"))
            du, su = _old(s.find("double_bit"))
        else:
            dc, du = to_count(_text(s, "dram_correctable")), to_count(_text(s, "dram_uncorrectable"))
            sc = to_count(_text(s, "sram_correctable"))
            su = sum_present(*(to_count(_text(s, k)) for k in ("sram_uncorrectable", "sram_uncorrectable_parity",
                                                              "sram_uncorrectable_secded")))
        set_scope(out, scope, dc, du, sc, su)
        if scope == "aggregate":
            out.sram_threshold_exceeded = yes_no(_text(s, "sram_threshold_exceeded"))
    return out


def _old(el: ET.Element | None) -> tuple[int | None, int | None]:
    if el is None:
        return None, None
    return old_layout(to_count(_text(el, "device_memory")), to_count(_text(el, "total")))
