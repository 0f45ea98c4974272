"""NVML review §7 and the open items of issue 15: temperature through nvmlDeviceGetTemperatureV, the
driver's own thresholds and the memory temperature, ECC mode, SRAM errors by kind and unit, the row
remapper histogram, MIG instance ids on Xid events -- read from the simulated driver (which answers
as the real one does) and judged by the one rule set. Each test failed on the code before."""

from __future__ import annotations

import msgspec
import pynvml
import pytest

from collectors.nvml_source import NvmlSource
from detectors.engine.engine import DetectorEngine
from detectors.engine.ruleset import RuleSet
from fleethealth.schema import GpuThermal, decode_sample, encode
from simulator.fixtures import HostSeries
from simulator.nvml import SimNvml

replace = msgspec.structs.replace


@pytest.fixture(scope="module")
def rules():
    return RuleSet.load()


def feed(rules, gpus: dict[int, dict], polls: int):
    hs = HostSeries()
    engine = DetectorEngine(rules)
    out = engine.feed(hs.advance())

    def fn(s):
        for i, kw in gpus.items():
            s.gpus[i] = replace(s.gpus[i], **kw)
    for _ in range(polls):
        out += engine.feed(hs.advance(fn))
    return hs, sorted({(i.failure_mode, i.component, i.detector) for i in out if i.state == "open"}), out


# ------------------------------------------------------------------ temperature (§7)

def test_temperature_prefers_temperature_v_and_falls_back_to_the_deprecated_call():
    sim = SimNvml(2)
    sim.field_error(0, "nvmlDeviceGetTemperature", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # CUDA 14: removed
    sim.not_supported(1, "nvmlDeviceGetTemperatureV")  # an older driver without the versioned call
    sim.field_error(1, "nvmlDeviceGetTemperatureV", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    g = {x.index: x for x in NvmlSource(sim).poll().gpus}
    assert g[0].temperature_c == int(sim.gpus[0].temp) and g[1].temperature_c == int(sim.gpus[1].temp)
    assert g[0].field_errors == {} and g[1].field_errors == {}


def test_thresholds_and_memory_temperature_are_read_and_survive_the_wire():
    sim = SimNvml(1, arch="ampere")
    sim.hbm_temperature(0, 71)
    g = NvmlSource(sim).poll().gpus[0]
    assert g.thermal == GpuThermal(memory_c=71.0, slowdown_c=89.0, shutdown_c=92.0, gpu_max_c=85.0, mem_max_c=95.0)
    assert decode_sample(encode(HostSeries().advance(lambda s: s.gpus.__setitem__(0, g)))).gpus[0].thermal == g.thermal


def test_a_threshold_read_error_is_recorded_and_asked_again():
    sim = SimNvml(1)
    sim.field_error(0, "nvmlDeviceGetTemperatureThreshold", pynvml.NVML_ERROR_UNKNOWN)
    src = NvmlSource(sim)
    g = src.poll().gpus[0]
    assert g.field_errors == {"thresholds": "UNKNOWN"} and g.thermal.slowdown_c is None
    sim.field_error(0, "nvmlDeviceGetTemperatureThreshold", None)
    assert src.poll().gpus[0].thermal.slowdown_c == 89.0


def test_temperature_rule_is_relative_to_the_boards_own_slowdown_threshold(rules):
    hot = GpuThermal(slowdown_c=95.0, shutdown_c=100.0)
    _, none, _ = feed(rules, {2: {"temperature_c": 91.0, "thermal": hot}}, 6)  # 91 C on a 95 C board
    assert none == []
    hs, got, _ = feed(rules, {2: {"temperature_c": 88.0, "thermal": GpuThermal(slowdown_c=87.0)}}, 6)
    assert got == [("gpu_thermal", hs.base.gpus[2].uuid, "gpu.thermal.temperature")]
    _, unknown, _ = feed(rules, {2: {"temperature_c": 99.0}}, 6)  # no threshold read: not judged by a number
    assert unknown == []


def test_hbm_at_its_max_operating_temperature(rules):
    hs, got, _ = feed(rules, {4: {"thermal": GpuThermal(memory_c=96.0, mem_max_c=95.0)}}, 5)
    assert got == [("gpu_thermal", hs.base.gpus[4].uuid, "gpu.thermal.memory")]


# ------------------------------------------------------------------ ECC mode

def test_ecc_mode_is_read_and_ecc_off_or_pending_is_reported_not_healthy(rules):
    sim = SimNvml(3)
    sim.ecc_mode(1, False)
    sim.ecc_mode(2, True, pending=False)  # nvidia-smi -e 0: off after the next reset
    g = {x.index: x for x in NvmlSource(sim).poll().gpus}
    assert (g[0].ecc_mode_current, g[0].ecc_mode_pending) == (True, True)
    assert (g[1].ecc_mode_current, g[2].ecc_mode_pending) == (False, False) and g[0].brand == "NVIDIA"
    hs, got, incs = feed(rules, {1: {"ecc_mode_current": False, "ecc_mode_pending": False, "brand": "NVIDIA"},
                                 2: {"ecc_mode_current": True, "ecc_mode_pending": False, "brand": "NVIDIA"},
                                 # a GeForce board ships with ECC off: not a datacenter misconfiguration
                                 3: {"ecc_mode_current": False, "ecc_mode_pending": False, "brand": "GeForce"}}, 2)
    u = hs.base.gpus
    assert got == [("gpu_hw_error", u[1].uuid, "gpu.ecc.disabled"), ("gpu_hw_error", u[2].uuid, "gpu.ecc.mode-pending")]
    assert {i.severity for i in incs} == {"minor"}
    from remediation.policy import load_policy

    policy = load_policy()
    assert all(policy.decide(i).actions == ("ticket",) for i in incs if i.state == "open")


def test_nvidia_smi_captures_carry_ecc_mode_brand_and_the_histogram():
    from parsers.nvsmi_text import parse

    text = ("""==============NVSMI LOG==============

Attached GPUs                             : 1
GPU 00000000:18:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    Product Brand                         : NVIDIA
    ECC Mode
        Current                           : Disabled
        Pending                           : Enabled
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : 0
        Pending                           : No
        Remapping Failure Occurred        : No
        Bank Remap Availability Histogram
            Max                           : 2557 bank(s)
            High                          : 0 bank(s)
            Partial                       : 0 bank(s)
            Low                           : 2 bank(s)
            None                          : 1 bank(s)
""")
    g = parse(text).sample.gpus[0]
    assert (g.brand, g.ecc_mode_current, g.ecc_mode_pending) == ("NVIDIA", False, True)
    assert (g.remapped_rows.hist_max, g.remapped_rows.hist_low, g.remapped_rows.hist_none) == (2557, 2, 1)


def test_ecc_off_in_a_capture_is_no_memory_evidence():
    from parsers.base import coverage, new_parsed
    from simulator.fixtures import gpu

    on, off = new_parsed("x", [gpu(0)]), new_parsed("x", [gpu(0, ecc_mode_current=False)])
    assert "gpu-memory" in coverage(on) and "gpu-memory" not in coverage(off)


# ------------------------------------------------------------------ SRAM by kind and unit, remapper histogram

def test_sram_status_carries_parity_secded_and_unit_buckets():
    sim = SimNvml(2)
    sim.sram_uce(0, 3, unit="L2", parity=True)
    sim.sram_uce(1, 2, unit="Sm")
    g = {x.index: x.ecc for x in NvmlSource(sim).poll().gpus}
    assert (g[0].sram_uncorrected_parity_aggregate, g[0].sram_uncorrected_secded_aggregate) == (3, 0)
    assert g[0].sram_uncorrected_l2_aggregate == 3 and g[0].sram_uncorrected_sm_aggregate == 0
    assert (g[1].sram_uncorrected_secded_volatile, g[1].sram_uncorrected_sm_aggregate) == (2, 2)


def test_volta_has_no_sram_status_and_no_histogram():
    g = NvmlSource(SimNvml(1, arch="volta")).poll().gpus[0]
    assert g.ecc.sram_uncorrected_l2_aggregate is None and g.remapped_rows is None and g.field_errors == {}


def test_remapper_histogram_is_read_and_exhausted_banks_raise_a_ticket_not_a_drain(rules):
    sim = SimNvml(1)
    sim.remap_banks(0, partial=3, low=2, none=1)
    rr = NvmlSource(sim).poll().gpus[0].remapped_rows
    assert (rr.hist_max, rr.hist_high, rr.hist_partial, rr.hist_low, rr.hist_none) == (2554, 0, 3, 2, 1)
    base = HostSeries().base.gpus[0].remapped_rows
    hs, got, incs = feed(rules, {0: {"remapped_rows": replace(base, hist_low=2)},
                                 1: {"remapped_rows": replace(base, hist_none=1)}}, 1)
    u = hs.base.gpus
    assert got == [("gpu_row_remap_failure", u[0].uuid, "gpu.row-remap.banks-low"),
                   ("gpu_row_remap_failure", u[1].uuid, "gpu.row-remap.banks-exhausted")]
    from remediation.policy import load_policy

    policy = load_policy()
    assert all("drain" not in policy.decide(i).actions for i in incs)


def test_a_low_bank_episode_does_not_swallow_a_pending_remap(rules):
    """gpu_row_remap_failure supersedes gpu_row_remap_pending, but a predictive (minor) episode
    must not take a pending remap's drain + reset away."""
    base = HostSeries().base.gpus[0].remapped_rows
    _, got, _ = feed(rules, {0: {"remapped_rows": replace(base, hist_low=2, pending=True, uncorrectable=1)}}, 1)
    assert {d for _m, _c, d in got} == {"gpu.row-remap.banks-low", "gpu.row-remap.pending"}


def test_mig_hides_the_histogram_with_the_remapped_rows():
    sim = SimNvml(1)
    sim.mig(0)
    g = NvmlSource(sim).poll().gpus[0]
    assert g.remapped_rows is None and g.field_errors == {}


# ------------------------------------------------------------------ MIG instance ids on Xid events

def test_xid_events_carry_the_mig_instance_they_came_from():
    sim = SimNvml(2)
    sim.mig(0)
    src = NvmlSource(sim)
    src.poll()
    sim.xid(0, 31, gi=3, ci=0)
    sim.xid(1, 79)
    g = {x.index: x for x in src.poll().gpus}
    (ev,) = g[0].xids
    assert (ev.xid, ev.gpu_instance, ev.compute_instance) == (31, 3, 0) and "GPU instance 3" in ev.message
    assert (g[1].xids[0].gpu_instance, g[1].xids[0].compute_instance) == (None, None)
