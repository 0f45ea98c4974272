"""A fleet-wide driver update resets every counter on every host and is not a fault."""

from __future__ import annotations

from fleethealth.schema import Sample


def _volatile(s: Sample) -> int:
    n = 0
    for g in s.gpus:
        if g.ecc:
            n += (g.ecc.dram_corrected_volatile or 0) + (g.ecc.sram_corrected_volatile or 0)
        if g.pcie:
            n += g.pcie.replay_counter or 0
        if g.nvlink:
            n += sum(x or 0 for x in g.nvlink.crc_flit)
    n += sum(sum(p.counters.values()) for p in s.net_ports)
    n += sum(mc.ce_count or 0 for mc in s.edac)
    n += sum(a.correctable.get("TOTAL_ERR_COR", 0) for a in s.aer)
    return n


def test_every_host_updates_once_with_counters_reset(driver_update_run) -> None:  # type: ignore[no-untyped-def]
    run = driver_update_run
    assert run.truth == []
    assert len(run.by_host) == 12
    for host, samples in run.by_host.items():
        changes = [i for i in range(1, len(samples)) if samples[i].boot_id != samples[i - 1].boot_id]
        assert len(changes) == 1, host
        i = changes[0]
        old, new = samples[i - 1], samples[i]
        assert (old.driver_version, new.driver_version) == ("550.90.07", "550.127.08")
        assert _volatile(old) > 0, "counters were non-zero before (the reset is visible)"
        assert _volatile(new) == 0, host
        assert any("loading NVIDIA UNIX" in e.line for e in new.kernel_events)
        # aggregates survive a reboot
        for g_old, g_new in zip(old.gpus, new.gpus, strict=True):
            assert g_new.ecc.dram_corrected_aggregate >= g_old.ecc.dram_corrected_aggregate  # type: ignore[union-attr]


def test_updates_happen_within_minutes(driver_update_run) -> None:  # type: ignore[no-untyped-def]
    firsts = []
    for samples in driver_update_run.by_host.values():
        i = next(i for i in range(1, len(samples)) if samples[i].boot_id != samples[i - 1].boot_id)
        firsts.append(samples[i].ts)
    assert max(firsts) - min(firsts) < 20 * 60
