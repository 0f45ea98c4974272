"""The NVML source against the simulated NVML: every fault it must report, none it may crash on."""

from __future__ import annotations

import time

import pynvml
import pytest

from collectors.nvml_source import NvmlSource
from simulator.nvml import SimNvml


@pytest.fixture
def sim():
    return SimNvml(4, seed=1)


def by_index(poll):
    return {g.index: g for g in poll.gpus}


def test_healthy_poll_reads_everything(sim):
    p = NvmlSource(sim, expected_gpus=4).poll()
    assert p.device_count == 4 and p.errors == [] and p.driver_version == sim.driver
    g = p.gpus[0]
    assert g.present and g.nvml_error is None and g.uuid.startswith("GPU-") and g.pci_bus_id == "0000:18:00.0"
    assert g.ecc.dram_uncorrected_volatile == 0 and g.ecc.sram_threshold_exceeded is False
    assert g.remapped_rows.pending is False and g.retired_pages is None
    assert (g.pcie.gen_current, g.pcie.gen_max, g.pcie.width_current) == (5, 5, 16)
    assert len(g.nvlink.active) == 18 and all(g.nvlink.active) and g.nvlink.crc_flit == [0] * 18
    assert g.temperature_c is not None and g.power_w == pytest.approx(250.0)


def test_sim_raises_pynvml_classes(sim):
    sim.nvmlInit()
    h = sim.nvmlDeviceGetHandleByIndex(0)
    sim.fall_off_bus(0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetUUID(h)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetNvLinkState(sim.nvmlDeviceGetHandleByIndex(1), 99)


def test_faults_show_up_in_the_right_fields(sim):
    src = NvmlSource(sim)
    src.poll()
    sim.dram_uce(0, 2)
    sim.sram_uce(1, threshold=True)
    sim.remap_failure(2)
    sim.pcie_downtrain(3, gen=1, width=8)
    sim.pcie_replays(3, 40)
    sim.nvlink_errors(3, 5, crc_flit=7, replay=2, recovery=1)
    sim.nvlink_down(3, 6)
    sim.thermal(2, 95)
    sim.xid(1, 119)
    g = by_index(src.poll())
    assert g[0].ecc.dram_uncorrected_volatile == 2 and g[0].ecc.dram_uncorrected_aggregate == 2
    assert g[0].remapped_rows.pending is True and [x.xid for x in g[0].xids] == [94]
    assert g[1].ecc.sram_uncorrected_volatile == 1 and g[1].ecc.sram_threshold_exceeded is True
    assert sorted(x.xid for x in g[1].xids) == [94, 119]
    assert g[2].remapped_rows.failure is True and [x.xid for x in g[2].xids] == [64]
    assert g[2].temperature_c == 95 and g[2].clocks_event_reasons & pynvml.nvmlClocksEventReasonHwThermalSlowdown
    p3 = g[3].pcie
    assert (p3.gen_current, p3.width_current, p3.replay_counter) == (1, 8, 40)
    assert g[3].nvlink.crc_flit[5] == 7 and g[3].nvlink.replay[5] == 2 and g[3].nvlink.recovery[5] == 1
    assert g[3].nvlink.active[6] is False and [x.xid for x in g[3].xids] == [74]
    assert by_index(src.poll())[0].xids == []  # events are delivered once


def test_sbe_storm_counts_corrected(sim):
    src = NvmlSource(sim)
    sim.sbe_storm(0, 5000)
    g = by_index(src.poll())[0]
    assert g.ecc.dram_corrected_volatile == 5000 and [x.xid for x in g.xids] == [92]


def test_gpu_disappears_between_two_polls(sim):
    src = NvmlSource(sim, expected_gpus=4)
    first = by_index(src.poll())
    sim.fall_off_bus(2)
    g = by_index(src.poll())
    assert g[2].present is False and g[2].nvml_error == "GPU_IS_LOST"
    assert g[2].uuid == first[2].uuid  # identity kept from the earlier poll
    assert [x.xid for x in g[2].xids] == [79] and all(g[i].present for i in (0, 1, 3))
    sim.vanish(2)  # driver reloaded without it: the count drops
    p = src.poll()
    assert p.device_count == 3
    lost = [x for x in p.gpus if not x.present]
    assert [(x.uuid, x.nvml_error) for x in lost] == [(first[2].uuid, "NOT_ENUMERATED")]
    assert {x.uuid for x in p.gpus if x.present} == {first[i].uuid for i in (0, 1, 3)}


def test_hung_gpu_does_not_stall_the_others_and_threads_do_not_pile_up(sim):
    src = NvmlSource(sim, call_timeout=0.3)
    src.poll()
    sim.hang(1, 1.5)
    t0 = time.monotonic()
    g = by_index(src.poll())
    took = time.monotonic() - t0
    assert took < 1.0  # bounded by the deadline, not by the hang
    assert g[1].nvml_error == "TIMEOUT" and g[1].uuid
    assert all(g[i].nvml_error is None and g[i].ecc is not None for i in (0, 2, 3))
    calls_before = sim.calls
    g = by_index(src.poll())  # still hung: no new call on GPU 1
    assert g[1].nvml_error == "TIMEOUT" and src.stuck_skips == 1
    assert sim.calls - calls_before < 3 * 200  # only the three healthy GPUs were read
    time.sleep(1.3)
    g = by_index(src.poll())
    assert g[1].nvml_error is None and g[1].ecc is not None  # recovers once the call returns


def test_not_supported_fields_are_none(sim):
    sim.not_supported(0, "nvmlDeviceGetMemoryErrorCounter", "nvmlDeviceGetTotalEccErrors",
                      "nvmlDeviceGetSramEccErrorStatus", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetPowerUsage",
                      "nvmlDeviceGetNvLinkState", "nvmlDeviceGetCurrentClocksEventReasons")
    g = by_index(NvmlSource(sim).poll())[0]
    assert g.present and g.nvml_error is None
    assert g.ecc is None and g.remapped_rows is None and g.power_w is None and g.nvlink is None
    assert g.clocks_event_reasons == 0  # fell back to the older ThrottleReasons call


def test_volta_uses_retired_pages_and_xid_48():
    sim = SimNvml(2, arch="volta")
    src = NvmlSource(sim)
    sim.dram_uce(0)
    g = by_index(src.poll())[0]
    assert g.remapped_rows is None and g.retired_pages.dbe == 1 and g.retired_pages.pending is True
    assert g.ecc.sram_uncorrected_volatile is None and [x.xid for x in g.xids] == [48]


def test_driver_reload_resets_volatile_counters(sim):
    src = NvmlSource(sim)
    sim.corrected(0, 10)
    sim.pcie_replays(0, 5)
    assert by_index(src.poll())[0].ecc.dram_corrected_volatile == 10
    sim.reset_counters()
    g = by_index(src.poll())[0]
    assert g.ecc.dram_corrected_volatile == 0 and g.ecc.dram_corrected_aggregate == 10
    assert g.pcie.replay_counter == 0  # counters go backwards; detectors handle it


def test_nvml_unusable_is_an_error_not_a_crash():
    class NoDriver(SimNvml):
        def nvmlInit(self):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    p = NvmlSource(NoDriver(2)).poll()
    assert p.gpus == [] and "DRIVER_NOT_LOADED" in p.errors[0]


def test_the_event_set_is_drained_after_the_gpus_register_for_it(monkeypatch):
    """Each GPU's read registers it for Xid events; draining the event set in parallel with the
    reads let a slow registration (a loaded host) push a GPU's first Xid into a later poll, or map
    it to no GPU at all. Now the drain waits for the reads."""
    sim = SimNvml(2, arch="volta")
    slow = sim.nvmlDeviceRegisterEvents

    def register_slowly(*a):  # type: ignore[no-untyped-def]
        time.sleep(0.3)
        return slow(*a)

    monkeypatch.setattr(sim, "nvmlDeviceRegisterEvents", register_slowly)
    src = NvmlSource(sim)
    sim.dram_uce(0)
    g = by_index(src.poll())[0]
    src.close()
    assert [x.xid for x in g.xids] == [48]
