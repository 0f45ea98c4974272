"""Staged faults on literal samples through the engine: each rule fires on what real hardware
shows, and the traps (idle PCIe gen, saturated counters, reboots, sticky flags) stay quiet."""

from __future__ import annotations

import msgspec
import pytest

from detectors.engine.engine import DetectorEngine
from detectors.engine.ruleset import evaluate_snapshot
from fleethealth.schema import KernelEvent, XidEvent
from simulator.fixtures import HostSeries

replace = msgspec.structs.replace


@pytest.fixture(scope="module")
def rules():
    from detectors.engine.ruleset import RuleSet

    return RuleSet.load()


def run(rules, steps, series=None, engine=None):
    """Feed `steps` (list of mutators or None) and return every incident."""
    series = series or HostSeries()
    engine = engine or DetectorEngine(rules)
    out = []
    for fn in steps:
        out += engine.feed(series.advance(fn))
    return out


def opened(incs):
    return sorted({(i.failure_mode, i.component) for i in incs if i.state == "open"})


def set_gpu(i, **kw):
    def fn(s):
        s.gpus[i] = replace(s.gpus[i], **kw)
    return fn


def test_quiet_fleet_raises_nothing(rules):
    assert run(rules, [None] * 50) == []


def test_dram_uce_counter_step_opens_one_episode(rules):
    hs = HostSeries()
    ecc = replace(hs.base.gpus[2].ecc, dram_uncorrected_volatile=1)
    incs = run(rules, [None] * 3 + [set_gpu(2, ecc=ecc)] * 5, hs)
    assert opened(incs) == [("gpu_dram_uce", hs.base.gpus[2].uuid)]
    inc = incs[0]
    assert inc.detector == "gpu.dram-uce.counter" and inc.severity == "critical"
    assert "rose by 1 to 1" in inc.evidence[0].fact
    assert inc.recommended_action[:2] == ["drain", "reset_gpu"]


def test_volatile_uce_seen_on_first_sample_counts(rules):
    hs = HostSeries()
    ecc = replace(hs.base.gpus[0].ecc, dram_uncorrected_volatile=2)
    assert opened(run(rules, [set_gpu(0, ecc=ecc)], hs)) == [("gpu_dram_uce", hs.base.gpus[0].uuid)]


def test_aggregate_history_on_first_sight_is_not_a_new_error(rules):
    hs = HostSeries()
    ecc = replace(hs.base.gpus[0].ecc, dram_uncorrected_aggregate=12, dram_corrected_aggregate=90000)
    assert run(rules, [set_gpu(0, ecc=ecc)] * 3, hs) == []


def test_remap_pending_persists_as_one_episode_and_resolves_after_it_clears(rules):
    hs = HostSeries()
    rr = replace(hs.base.gpus[1].remapped_rows, pending=True)
    incs = run(rules, [set_gpu(1, remapped_rows=rr)] * 20 + [None] * 200, hs)
    states = [(i.failure_mode, i.state) for i in incs]
    assert states[0] == ("gpu_row_remap_pending", "open")
    assert states.count(("gpu_row_remap_pending", "open")) == 1
    assert states[-1] == ("gpu_row_remap_pending", "resolved")
    assert len({i.id for i in incs}) == 1


def test_port_down_needs_three_polls_and_a_single_bounce_is_not_down(rules):
    def down(s):
        s.net_ports[3] = replace(s.net_ports[3], state="DOWN", phys_state="Polling")
    assert run(rules, [None, down, None, None, None]) == []
    incs = run(rules, [None, down, down, down])
    assert opened(incs) == [("net_link_down", "mlx5_3/1")]


def test_flapping_port_is_a_bad_cable(rules):
    flip = []
    for k in range(10):
        def fn(s, k=k):
            if k % 2:
                s.net_ports[0] = replace(s.net_ports[0], state="DOWN", phys_state="Polling")
        flip.append(fn)
    assert ("net_link_bad_cable", "mlx5_0/1") in opened(run(rules, flip))


def test_symbol_error_rate_but_saturated_counter_is_no_storm(rules):
    hs = HostSeries()

    def sym(n):
        def fn(s):
            s.net_ports[5] = replace(s.net_ports[5], counters={**s.net_ports[5].counters, "symbol_error": n})
        return fn
    assert opened(run(rules, [sym(0), sym(5), sym(30)], hs)) == [("net_link_bad_cable", "mlx5_5/1")]
    # a 16-bit counter pinned at 65535 from the first poll: "at least", not a storm
    assert run(rules, [sym(65535)] * 30) == []


def test_rate_windows_start_over_after_a_reboot(rules):
    """A cable replaced during a repair reboot: its old symbol errors no longer count."""
    hs = HostSeries()
    engine = DetectorEngine(rules)

    def sym(n):
        def fn(s):
            s.net_ports[2] = replace(s.net_ports[2], counters={**s.net_ports[2].counters, "symbol_error": n})
        return fn
    out = run(rules, [sym(0), sym(4), sym(8)], hs, engine)
    hs.base = replace(hs.base, boot_id="boot-after-repair")
    out += run(rules, [sym(0), sym(1), sym(2)], hs, engine)
    assert out == []


def test_pcie_gen_below_max_at_idle_is_power_saving_not_a_fault(rules):
    hs = HostSeries()
    idle = set_gpu(4, pcie=replace(hs.base.gpus[4].pcie, gen_current=1), utilization_pct=0.0)
    assert run(rules, [idle] * 10, hs) == []
    busy = set_gpu(4, pcie=replace(hs.base.gpus[4].pcie, gen_current=3), utilization_pct=95.0)
    incs = run(rules, [busy] * 4, hs)
    assert opened(incs) == [("pcie_link_degraded", "0000:58:00.0")]


def test_fleet_wide_driver_update_raises_nothing(rules):
    engine = DetectorEngine(rules)
    fleet = [HostSeries(f"h{i}") for i in range(8)]
    for h in fleet:
        h.base.net_ports[0].counters["link_downed"] = 3
        h.base.gpus[0].ecc.dram_uncorrected_volatile = 0
    out = []
    for _ in range(5):
        for h in fleet:
            out += engine.feed(h.advance())
    for h in fleet:  # reboot into a new driver: every counter restarts, seq restarts
        h.base = replace(h.base, boot_id="boot-b", driver_version="560.35.03")
        h.base.net_ports = [replace(p, counters=dict.fromkeys(p.counters, 0) | {"link_downed": 1})
                            for p in h.base.net_ports]
        h.seq = -1
        h.base.ts += 600
    for _ in range(10):
        for h in fleet:
            out += engine.feed(h.advance())
    assert out == []
    assert engine.stats["out_of_order"] == 0


def _xids(i, *codes, msg=""):
    def fn(s):
        s.gpus[i] = replace(s.gpus[i], xids=[XidEvent(xid=c, ts=s.ts, message=msg) for c in codes])
    return fn


def test_xid_48_with_63_is_drain_and_reset(rules):
    incs = run(rules, [None, _xids(0, 48, 63)])
    uce = [i for i in incs if i.failure_mode == "gpu_dram_uce"]
    assert uce and uce[0].xid == 48 and uce[0].nvidia_bucket == "WORKFLOW_XID_48"
    assert uce[0].recommended_action == ["drain", "reset_gpu"]
    assert "with Xid 63/64" in uce[0].evidence[0].fact


def test_xid_48_alone_is_a_lower_confidence_uce(rules):
    incs = run(rules, [None, _xids(0, 48)])
    assert [(i.failure_mode, i.confidence) for i in incs] == [("gpu_dram_uce", 0.9)]


def test_xid_94_vs_95_dram_or_sram_from_the_counters(rules):
    hs = HostSeries()
    ecc = replace(hs.base.gpus[6].ecc, sram_uncorrected_volatile=1)

    def sram94(s):
        _xids(6, 94)(s)
        s.gpus[6] = replace(s.gpus[6], ecc=ecc)
    incs = run(rules, [None, sram94], hs)
    modes = {(i.failure_mode, i.xid) for i in incs}
    assert ("gpu_sram_uce", 94) in modes and not any(m == "gpu_dram_uce" for m, _ in modes)
    incs = run(rules, [None, _xids(6, 95, msg="Uncontained: FBHUB. DRAM ECC")])
    assert [(i.failure_mode, i.nvidia_bucket) for i in incs] == [("gpu_dram_uce", "RESET_GPU")]


def test_xid_45_alone_is_app_error_but_after_another_xid_is_sympathetic(rules):
    incs = run(rules, [None, _xids(2, 45)])
    assert [(i.failure_mode, i.recommended_action) for i in incs] == [("app_error", ["annotate"])]
    incs = run(rules, [None, _xids(2, 109), _xids(2, 45)])
    assert [i.failure_mode for i in incs] == ["gpu_hw_error"]


def test_app_xid_never_recommends_drain(rules):
    incs = run(rules, [None, _xids(1, 13, 31)])
    assert {i.failure_mode for i in incs} == {"app_error"}
    assert all(i.recommended_action == ["annotate"] and i.severity == "info" for i in incs)


def test_aer_port_line_names_the_reporting_device(rules):
    line = "pcieport 0000:99:00.0: AER: Uncorrected (Non-Fatal) error received: 0000:9a:00.0"

    def aer(s):
        s.kernel_events = [KernelEvent(ts=s.ts, kind="aer", line=line, pci_addr="0000:99:00.0", severity="non-fatal")]
    assert opened(run(rules, [None, aer])) == [("pcie_fatal", "0000:9a:00.0")]


def test_missing_gpu_is_named_by_its_last_known_uuid(rules):
    hs = HostSeries()
    lost = hs.base.gpus[7].uuid

    def drop(s):
        s.gpus = s.gpus[:7]
    assert opened(run(rules, [None, None, drop, drop, drop], hs)) == [("gpu_fell_off_bus", lost)]


def test_fell_off_bus_absorbs_the_sympathetic_pcie_findings(rules):
    hs = HostSeries()

    def fall(s):
        s.gpus[3] = replace(s.gpus[3], present=False, nvml_error="GPU_IS_LOST",
                            pcie=replace(s.gpus[3].pcie, width_current=0))
    incs = run(rules, [None] + [fall] * 6, hs)
    assert opened(incs) == [("gpu_fell_off_bus", hs.base.gpus[3].uuid)]


def test_silent_host_becomes_unreachable_on_fleet_time_and_resolves_when_back(rules):
    engine = DetectorEngine(rules)
    a, b = HostSeries("a"), HostSeries("b")
    out = []
    for _ in range(3):
        out += engine.feed(a.advance()) + engine.feed(b.advance())
    for _ in range(400):  # b says nothing for 4000 s of fleet time
        out += engine.feed(a.advance())
    assert [(i.host, i.failure_mode, i.state) for i in out] == [("b", "host_unreachable", "open")]
    b.seq = a.seq - 1
    out = engine.feed(b.advance())
    assert [(i.failure_mode, i.state) for i in out] == [("host_unreachable", "resolved")]


def test_duplicates_and_stale_samples_change_nothing(rules):
    hs = HostSeries()
    ecc = replace(hs.base.gpus[2].ecc, dram_uncorrected_volatile=1)
    s0, s1 = hs.advance(), hs.advance(set_gpu(2, ecc=ecc))
    engine = DetectorEngine(rules)
    first = engine.feed(s0) + engine.feed(s1)
    again = engine.feed(s1) + engine.feed(s0) + engine.feed(s1)
    assert len(first) == 1 and again == []
    assert engine.stats["duplicate"] == 2 and engine.stats["out_of_order"] == 1


def test_snapshot_evaluation_counts_from_zero_for_diagnose():
    hs = HostSeries()
    s = hs.advance(set_gpu(0, ecc=replace(hs.base.gpus[0].ecc, sram_uncorrected_volatile=3)))
    modes = {(f.failure_mode, f.detector) for f in evaluate_snapshot(s)}
    assert ("gpu_sram_uce", "gpu.sram-uce.counter") in modes
    assert evaluate_snapshot(HostSeries().advance()) == []


def test_a_late_sample_does_not_end_an_unreachable_episode_a_current_one_does(rules):
    """A spool resend (or a host clock far behind) is stamped before the staleness limit of the
    last tick: it says nothing of now. The current sample after it ends the episode."""
    engine = DetectorEngine(rules)
    a, b = HostSeries("a"), HostSeries("b")
    for _ in range(3):
        engine.feed(a.advance()), engine.feed(b.advance())
    for _ in range(400):
        engine.feed(a.advance())
    assert engine.episodes.has_open("b", "host", frozenset({"host_unreachable"}))
    old = b.advance()  # stamped 30 s after b's last sample: thousands of seconds before the fleet's now
    assert [i for i in engine.feed(old) if i.failure_mode == "host_unreachable"] == []
    b.seq = a.seq - 1
    out = engine.feed(b.advance())
    assert [(i.failure_mode, i.state) for i in out] == [("host_unreachable", "resolved")]
