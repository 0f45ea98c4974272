"""One test per finding of the NVML review (../shared/reviews/nvml.md), each against the simulated
driver behaving as the real one does. Every test here failed on the NVML source before the fixes."""

from __future__ import annotations

import time

import pynvml
import pytest

from collectors.nvml_source import NvmlSource
from simulator.nvml import SimNvml


def by_index(poll):
    return {g.index: g for g in poll.gpus}


def by_uuid(poll):
    return {g.uuid: g for g in poll.gpus}


# §1.1
def test_sram_status_struct_goes_by_reference_so_the_threshold_flag_is_read():
    sim = SimNvml(2)
    sim.sram_uce(1, threshold=True)
    g = by_index(NvmlSource(sim).poll())
    assert g[1].ecc.sram_threshold_exceeded is True and g[0].ecc.sram_threshold_exceeded is False
    assert g[1].field_errors == {}


# §1.2
@pytest.mark.parametrize("code,name", [(pynvml.NVML_ERROR_UNKNOWN, "UNKNOWN"),
                                       (pynvml.NVML_ERROR_CORRUPTED_INFOROM, "CORRUPTED_INFOROM")])
def test_a_real_error_is_recorded_per_field_not_read_as_absent(code, name):
    sim = SimNvml(2)
    sim.field_error(0, "nvmlDeviceGetRemappedRows", code)
    sim.field_error(0, "nvmlDeviceGetMemoryErrorCounter", code)
    g = by_index(NvmlSource(sim).poll())
    assert g[0].remapped_rows is None and g[0].retired_pages is None  # no pre-Ampere fallback on a Hopper
    assert g[0].field_errors == {"ecc": name, "remapped_rows": name}
    assert g[0].present and g[0].nvml_error is None and g[1].field_errors == {}


def test_absent_codes_are_never_field_errors():
    sim = SimNvml(1)
    for fn, code in (("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NOT_SUPPORTED),
                     ("nvmlDeviceGetRemappedRows", pynvml.NVML_ERROR_NO_PERMISSION),
                     ("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),
                     ("nvmlDeviceGetTemperatureV", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)):
        sim.field_error(0, fn, code)
    g = NvmlSource(sim).poll().gpus[0]
    assert g.power_w is None and g.remapped_rows is None and g.temperature_c is None and g.field_errors == {}


# §1.4
def test_totals_fallback_has_its_own_fields_not_dram():
    sim = SimNvml(1)
    sim.sram_uce(0, 3)
    sim.not_supported(0, "nvmlDeviceGetMemoryErrorCounter")
    e = NvmlSource(sim).poll().gpus[0].ecc
    assert e.total_uncorrected_volatile == 3 and e.dram_uncorrected_volatile is None


# §1.5 / §2
def test_mig_reads_aggregate_counters_and_says_it_is_mig():
    sim = SimNvml(2)
    src = NvmlSource(sim)
    sim.mig(0)
    src.poll()
    sim.dram_uce(0, 2)
    g = by_index(src.poll())[0]
    assert g.mig_enabled is True and by_index(src.poll())[1].mig_enabled is False
    assert g.ecc.dram_uncorrected_volatile is None and g.ecc.dram_uncorrected_aggregate == 2
    assert g.remapped_rows is None and g.retired_pages is None and g.utilization_pct is None
    assert g.field_errors == {}


# §3
def test_replay_counter_wrap_reads_the_rollover_field():
    sim = SimNvml(1)
    sim.pcie_replays(0, (1 << 32) + 5)
    p = NvmlSource(sim).poll().gpus[0].pcie
    assert (p.replay_counter, p.replay_rollover) == (5, 1)


# §4
def test_hopper_nvlink_data_errors_are_ecc_data_and_crc_data_is_unsupported():
    sim = SimNvml(1)
    sim.nvlink_errors(0, 2, crc_data=100, replay=3)
    n = NvmlSource(sim).poll().gpus[0].nvlink
    assert n.ecc_data[2] == 100 and n.crc_data == [None] * 18 and n.replay[2] == 3


def test_link_discovery_continues_past_an_unsupported_link():
    sim = SimNvml(1)
    sim.link_unsupported(0, 0, 1)
    sim.nvlink_errors(0, 5, crc_flit=9)
    n = NvmlSource(sim).poll().gpus[0].nvlink
    assert n is not None and len(n.active) == 18 and n.active[:2] == [None, None] and all(n.active[2:])
    assert n.crc_flit[5] == 9


def test_bridgeless_pcie_board_inactive_links_are_not_a_fault_but_a_link_that_drops_is():
    sim = SimNvml(2)
    sim.no_nvlink_bridge(0)
    src = NvmlSource(sim)
    g = by_index(src.poll())
    assert g[0].nvlink.active == [None] * 18  # never up: not wired, not "inactive"
    sim.nvlink_down(1, 4)
    assert by_index(src.poll())[1].nvlink.active[4] is False


def test_blackwell_nvlink5_counters_are_read_as_field_values():
    sim = SimNvml(1, arch="blackwell")
    sim.nvlink_errors(0, 3, crc_data=10, recovery=2)
    n = NvmlSource(sim).poll().gpus[0].nvlink
    assert n.symbol_errors[3] == 10 and n.effective_errors[3] == 10 and n.recovery_events[3] == 2
    assert n.crc_flit == [None] * 18  # per-link DL counters answer NOT_SUPPORTED on NVLink5


# §5
def test_reinit_frees_and_rebuilds_the_event_set_so_later_xids_arrive():
    sim = SimNvml(2)
    src = NvmlSource(sim)
    sim.xid(0, 13)
    assert [x.xid for x in by_index(src.poll())[0].xids] == [13]
    gen = src.generation
    sim.driver_reload()
    p = src.poll()
    assert any("UNINITIALIZED" in e for e in p.errors) or any(g.nvml_error == "UNINITIALIZED" for g in p.gpus)
    src.poll()
    sim.xid(1, 79)
    assert [x.xid for x in by_index(src.poll())[1].xids] == [79]
    assert src.generation > gen
    sets = sim.registered()
    assert list(sets.values()) == [{0, 1}]  # one live set, every GPU on it (the old one freed)
    assert sim._inited == 1  # nvmlInit balanced by nvmlShutdown


def test_gpu_is_lost_from_the_event_wait_is_reported_once_not_spun_on():
    sim = SimNvml(2)
    src = NvmlSource(sim)
    src.poll()
    sim.event_wait_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    before = sim.calls
    p = src.poll()
    waits = sim.calls - before
    assert [e for e in p.errors if "event wait" in e] == [
        "NVML event wait failed: GPU_IS_LOST (every GPU's Xid events may be missed)"]
    assert waits < 400  # two GPUs' reads plus one wait, not 4,096 waits


def test_a_failed_registration_is_recorded_and_retried():
    sim = SimNvml(1)
    sim.field_error(0, "nvmlDeviceRegisterEvents", pynvml.NVML_ERROR_UNKNOWN)
    src = NvmlSource(sim)
    assert src.poll().gpus[0].field_errors == {"xid_events": "UNKNOWN"}
    sim.field_error(0, "nvmlDeviceRegisterEvents", None)
    src.poll()
    sim.xid(0, 62)
    assert [x.xid for x in src.poll().gpus[0].xids] == [62]


# §6
def test_unknown_from_a_lost_gpus_handle_means_not_present():
    sim = SimNvml(3)
    src = NvmlSource(sim)
    uuids = [g.uuid for g in src.poll().gpus]
    sim.fall_off_bus(1, how="unknown")
    g = by_index(src.poll())
    assert g[1].present is False and g[1].nvml_error == "UNKNOWN" and g[1].uuid == uuids[1]
    assert g[0].present and g[2].present


def test_after_an_index_shift_a_hung_gpu_is_not_reported_under_the_vanished_gpus_uuid():
    sim = SimNvml(3)
    src = NvmlSource(sim, call_timeout=0.3)
    uuids = [g.uuid for g in src.poll().gpus]
    sim.vanish(1)
    sim.hang(2, 1.0)  # now at index 1
    p = src.poll()
    timed_out = [g for g in p.gpus if g.nvml_error == "TIMEOUT"]
    assert len(timed_out) == 1 and timed_out[0].uuid != uuids[1]  # never the vanished board's UUID
    assert all(g.present for g in p.gpus if g.uuid == uuids[2])  # the hung GPU is not called gone
    time.sleep(1.0)
    p = src.poll()
    u = by_uuid(p)
    assert u[uuids[2]].nvml_error is None and u[uuids[2]].index == 1
    assert (u[uuids[1]].present, u[uuids[1]].nvml_error) == (False, "NOT_ENUMERATED")


# §8 / §9
def test_init_and_count_run_under_the_deadline_when_the_driver_is_wedged():
    sim = SimNvml(2)
    src = NvmlSource(sim, call_timeout=0.3)
    src.poll()
    sim.hang_all(1.5)
    t0 = time.monotonic()
    p = src.poll()
    assert time.monotonic() - t0 < 1.0
    assert p.gpus == [] or all(g.nvml_error == "TIMEOUT" for g in p.gpus)
    t0 = time.monotonic()
    p = src.poll()  # the stuck call is not repeated: this poll returns at once
    assert time.monotonic() - t0 < 0.5 and any("unresponsive" in e for e in p.errors)
    time.sleep(1.6)
    assert all(g.nvml_error is None for g in src.poll().gpus)


def test_release_lets_go_of_nvml_for_a_gpu_reset_and_resume_registers_again():
    sim = SimNvml(2)
    src = NvmlSource(sim)
    src.poll()
    assert src.release() is True
    assert sim._inited == 0 and sim.registered() == {}  # nothing held: nvidia-smi -r can proceed
    p = src.poll()
    assert p.released and p.gpus == [] and sim._inited == 0
    src.resume()
    src.poll()
    sim.xid(0, 31)
    assert [x.xid for x in by_index(src.poll())[0].xids] == [31]
