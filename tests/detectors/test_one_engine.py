"""The one engine's pieces on literals: snapshot views of rules, fact rules, kernel-event repeats /
benign records / after / cleared_by, and the Xid workflows (caused by, sympathetic 94/95, an
application Xid beside a hardware one, 154's recovery action)."""

from __future__ import annotations

from detectors.engine.rulefile import parse_rules
from detectors.engine.ruleset import RuleSet, snapshot_view
from detectors.engine.state import Admission, HostState
from fleethealth.schema import KernelEvent, Sample
from parsers.base import Fact
from simulator.fixtures import HostSeries


def _sample(events: list[KernelEvent], **kw) -> Sample:
    return Sample(host="h1", ts=1000.0, seq=1, collector_version="t", kernel_events=events, **kw)


def _xid(xid: int, msg: str, pci: str = "0000:18:00.0", ts: float = 1000.0) -> KernelEvent:
    return KernelEvent(ts=ts, kind="xid", xid=xid, pci_addr=pci, message=msg,
                       line=f"NVRM: Xid (PCI:{pci}): {xid}, {msg}")


def _modes(rules: RuleSet, s: Sample) -> list[tuple[str, str]]:
    return sorted({(f.component, f.failure_mode) for f in rules.evaluate_snapshot(s)})


RATE = """
version: 1
rules:
  - id: t.rate
    kind: counter_rate
    failure_mode: net_link_bad_cable
    path: net_ports[*].counters.symbol_error
    window_s: 3600
    increase_gt: 10
    snapshot: {lifetime_gt: 9}
    evidence: "x"
  - id: t.no-snapshot
    kind: counter_rate
    failure_mode: net_link_bad_cable
    path: net_ports[*].counters.port_rcv_errors
    window_s: 3600
    increase_gt: 10
    evidence: "x"
  - id: t.cond
    kind: condition
    failure_mode: net_link_down
    expr: net_ports[*].state in [DOWN]
    for_samples: 3
    evidence: "x"
  - id: t.off
    kind: condition
    failure_mode: net_link_down
    expr: net_ports[*].state in [DOWN]
    snapshot: false
    evidence: "x"
"""


def test_snapshot_views() -> None:
    specs = {s.id: s for s in parse_rules(RATE, "t.yaml")}
    rate = snapshot_view(specs["t.rate"])
    assert rate is not None and rate.kind == "counter_increase" and rate.params["delta_gt"] == 9
    assert snapshot_view(specs["t.no-snapshot"]) is None  # a rate with no lifetime threshold: not judged
    cond = snapshot_view(specs["t.cond"])
    assert cond is not None and cond.params["for_samples"] == 1  # one look
    assert snapshot_view(specs["t.off"]) is None


def test_lifetime_threshold_in_snapshot_and_increase_in_stream() -> None:
    rules = RuleSet(parse_rules(RATE, "t.yaml")[:1], snapshot=True)
    stream = RuleSet(parse_rules(RATE, "t.yaml")[:1])
    h = HostSeries("h1")
    s = h.advance(lambda s: s.net_ports.__setitem__(0, type(s.net_ports[0])(
        **{**{f: getattr(s.net_ports[0], f) for f in s.net_ports[0].__struct_fields__},
           "counters": {**s.net_ports[0].counters, "symbol_error": 50}})))
    assert [f.detector for f in rules.evaluate_snapshot(s)] == ["t.rate"]  # 50 since reset > 9
    st = HostState("h1")
    Admission.admit(st, s.seq, s.ts, s.boot_id, s.driver_version)
    out: list = []
    stream.evaluate(st, s, out)
    assert out == []  # first sight in a stream: a baseline, not an increase


FACTS = """
version: 1
rules:
  - id: t.temp
    kind: fact
    failure_mode: gpu_thermal
    fact: gpu_info
    test: temp_c >= max_operating_c - 2
    evidence: "{a[temp_c]} C"
  - id: t.busy
    kind: fact
    failure_mode: pcie_link_degraded
    fact: gpu_info
    attrs: {pstate: [P0], idle: false}
    test: gen_current < gen_max
    evidence: "gen"
  - id: t.ce
    kind: fact
    failure_mode: host_dram_ce_storm
    fact: dram_error
    attrs: {uncorrected: false}
    count_gt: 1
    evidence: "ce"
"""


def test_fact_rules_and_the_stream_skips_them() -> None:
    rules = RuleSet(parse_rules(FACTS, "f.yaml"), snapshot=True)
    facts = [Fact("gpu_info", "gpu0", {"temp_c": 84.0, "max_operating_c": 85.0, "pstate": "P8", "idle": True,
                                       "gen_current": 1, "gen_max": 4}),
             Fact("gpu_info", "gpu1", {"temp_c": 60.0, "max_operating_c": 85.0, "pstate": "P0", "idle": False,
                                       "gen_current": 3, "gen_max": 4}),
             Fact("dram_error", "DIMM_A1", {"uncorrected": False, "count": 1}),
             Fact("dram_error", "DIMM_B1", {"uncorrected": False, "count": 1}),
             Fact("dram_error", "DIMM_B1", {"uncorrected": False, "count": 1})]
    got = sorted((f.detector, f.component) for f in rules.evaluate_snapshot(_sample([]), facts))
    # gpu0 idle at gen1: power saving; one corrected error on A1: healthy; two on B1: repeats
    assert got == [("t.busy", "gpu1"), ("t.ce", "DIMM_B1"), ("t.temp", "gpu0")]
    assert RuleSet(parse_rules(FACTS, "f.yaml")).scopes == []


def test_aer_record_of_unsupported_requests_only_is_benign() -> None:
    rules = RuleSet.load(snapshot=True)
    head = "0000:3a:00.0: AER: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer"

    def rec(name: str) -> list[KernelEvent]:
        return [KernelEvent(ts=1.0, kind="aer", severity="non-fatal", pci_addr="0000:3a:00.0", line=head,
                            message=head.split(": ", 1)[1]),
                KernelEvent(ts=1.0, kind="aer", severity="non-fatal", pci_addr="0000:3a:00.0",
                            line=f"0000:3a:00.0:    [20] {name} (First)", message=f"   [20] {name} (First)")]

    assert _modes(rules, _sample(rec("UnsupReq"))) == []
    assert _modes(rules, _sample(rec("CmpltTO"))) == [("0000:3a:00.0", "pcie_fatal")]


def test_xid_workflows() -> None:
    rules = RuleSet.load(snapshot=True)
    # 45 that says what caused it is read as that Xid
    assert _modes(rules, _sample([_xid(45, "pid=7, Ch 00000010, caused by previous Xid 145")])) == [
        ("0000:18:00.0", "gpu_nvlink_error")]
    # 94 sympathetic to an NVLink root cause on another GPU: only the root cause
    evs = [_xid(149, "NETIR_LINK_EVT Fatal XC0 i0 Link 04", pci="0000:19:00.0"), _xid(94, "Contained: ...")]
    assert _modes(rules, _sample(evs)) == [("0000:19:00.0", "gpu_nvlink_error")]
    # an application Xid on another GPU beside a hardware fault: reported, with its own action
    evs = [_xid(62, "PMU halt", pci="0000:19:00.0"), _xid(13, "Graphics Exception")]
    found = rules.evaluate_snapshot(_sample(evs))
    assert sorted({(f.component, f.failure_mode) for f in found}) == [("0000:18:00.0", "app_error"),
                                                                     ("0000:19:00.0", "gpu_hw_error")]
    # ... but on the same GPU it is that fault's symptom
    evs = [_xid(62, "PMU halt"), _xid(31, "MMU Fault")]
    assert _modes(rules, _sample(evs)) == [("0000:18:00.0", "gpu_hw_error")]
    # 154 adds the driver's recovery action to the finding it accompanies
    evs = [_xid(120, "GSP task timeout"), _xid(154, "GPU recovery action changed from 0x0 (None) to 0x2 "
                                             "(Node Reboot Required)")]
    (f,) = [f for f in rules.evaluate_snapshot(_sample(evs)) if f.detector == "xid.catalog"]
    assert f.failure_mode == "gpu_gsp_error" and "reboot" in f.recommended_action


def test_link_down_needs_a_prior_up_and_a_flap_is_a_bad_cable() -> None:
    rules = RuleSet.load(snapshot=True)

    def ev(t: float, what: str) -> KernelEvent:
        msg = f"mlx5_core 0000:c1:00.0 ib0: Link {what}"
        return KernelEvent(ts=t, kind="other", pci_addr="0000:c1:00.0", line=msg, message=msg)

    assert _modes(rules, _sample([ev(1, "down")])) == []  # at probe: no cable
    assert _modes(rules, _sample([ev(1, "up"), ev(50, "down")])) == [("0000:c1:00.0", "net_link_down")]
    flap = [ev(1, "up"), ev(50, "down"), ev(52, "up"), ev(90, "down"), ev(93, "up")]
    assert _modes(rules, _sample(flap)) == [("0000:c1:00.0", "net_link_bad_cable")]


def test_counter_widths_are_data_and_saturation_is_at_least() -> None:
    from detectors.engine.state import counter_delta, saturation

    assert saturation("local_link_integrity_errors") == {15}  # 4-bit IB counter (detectors/engine/counters.yaml)
    assert saturation("link_downed") == {255}
    assert counter_delta(12, 15, saturated=saturation("local_link_integrity_errors")).note == "saturated"
    assert counter_delta(15, 15, saturated=saturation("local_link_integrity_errors")).delta == 0
    # a saturated counter that never moves stays quiet in a stream
    stream = RuleSet.load()
    h = HostSeries("h1")
    st = HostState("h1")
    out: list = []

    def sat(s):
        p = s.net_ports[0]
        s.net_ports[0] = type(p)(**{**{f: getattr(p, f) for f in p.__struct_fields__},
                                    "counters": {**p.counters, "symbol_error": 65535, "port_xmit_wait": (1 << 32) - 1}})

    for _ in range(5):
        s = h.advance(sat)
        Admission.admit(st, s.seq, s.ts, s.boot_id, s.driver_version)
        stream.evaluate(st, s, out)
    assert [f for f in out if f.failure_mode == "net_link_bad_cable"] == []
    # a capture of it: symbol_error at its 16-bit maximum is at least 65535, past the lifetime limit
    found = RuleSet.load(snapshot=True).evaluate_snapshot(s)
    (f,) = [f for f in found if f.detector == "net.symbol-errors"]
    assert "saturated" in f.evidence[0].fact


def test_power_brake_on_every_gpu_is_one_host_finding() -> None:
    import msgspec

    def brake(which):
        def fn(s):
            for i in which:
                s.gpus[i] = msgspec.structs.replace(s.gpus[i], clocks_event_reasons=0x80)
        return fn

    for which, want in ((range(8), {"host"}), ([3], {"GPU-h1-03-0000-4c2a-9b1e"})):
        h = HostSeries("h1")
        stream, st, out = RuleSet.load(), HostState("h1"), []
        for _ in range(4):
            s = h.advance(brake(which))
            Admission.admit(st, s.seq, s.ts, s.boot_id, s.driver_version)
            stream.evaluate(st, s, out)
        got = {f.component for f in out if f.detector == "gpu.throttle.power-brake"}
        assert got == want
        snap = RuleSet.load(snapshot=True).evaluate_snapshot(s)
        assert {f.component for f in snap if f.detector == "gpu.throttle.power-brake"} == want
