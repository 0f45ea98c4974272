"""Throttling beyond thermal (rules/throttle.yaml): each clocks-event reason fires only when it holds,
and what a healthy GPU shows under load (SW power cap at full load, a passing SW thermal peak,
idle) raises nothing."""

from __future__ import annotations

import msgspec
import pytest

from detectors.engine.engine import DetectorEngine
from simulator.fixtures import HostSeries

replace = msgspec.structs.replace

SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, POWER_BRAKE = 0x4, 0x8, 0x20, 0x40, 0x80


@pytest.fixture(scope="module")
def rules():
    from detectors.engine.ruleset import RuleSet

    return RuleSet.load()


def feed(rules, gpus: dict[int, dict], polls: int, before: int = 2):
    """``before`` quiet polls, then ``polls`` with the given GPU fields set; every incident."""
    hs = HostSeries()
    engine = DetectorEngine(rules)
    out = []
    for _ in range(before):
        out += engine.feed(hs.advance())

    def fn(s):
        for i, kw in gpus.items():
            s.gpus[i] = replace(s.gpus[i], **kw)
    for _ in range(polls):
        out += engine.feed(hs.advance(fn))
    return hs, out


def opened(incs):
    return sorted({(i.failure_mode, i.component, i.detector) for i in incs if i.state == "open"})


def test_power_brake_for_three_polls_is_a_ticket_not_a_drain(rules):
    hs, incs = feed(rules, {3: {"clocks_event_reasons": POWER_BRAKE}}, 3)
    assert opened(incs) == [("gpu_thermal", hs.base.gpus[3].uuid, "gpu.throttle.power-brake")]
    inc = next(i for i in incs if i.state == "open")
    assert "power brake asserted" in inc.evidence[0].fact, inc.evidence[0].fact
    assert "drain" not in inc.recommended_action


def test_power_brake_that_passes_in_two_polls_is_nothing(rules):
    _, incs = feed(rules, {3: {"clocks_event_reasons": POWER_BRAKE}}, 2)
    assert incs == []


def test_hw_slowdown_needs_a_minute(rules):
    _, short = feed(rules, {1: {"clocks_event_reasons": HW_SLOWDOWN}}, 5)
    assert short == []
    hs, held = feed(rules, {1: {"clocks_event_reasons": HW_SLOWDOWN}}, 6)
    assert opened(held) == [("gpu_thermal", hs.base.gpus[1].uuid, "gpu.throttle.hw-slowdown")]


def test_sw_power_cap_at_full_load_is_normal(rules):
    _, incs = feed(rules, {0: {"clocks_event_reasons": SW_POWER_CAP, "utilization_pct": 100.0}}, 60)
    assert incs == []


def test_sw_power_cap_at_low_load_for_five_minutes(rules):
    low = {"clocks_event_reasons": SW_POWER_CAP, "utilization_pct": 12.0}
    _, short = feed(rules, {0: low}, 29)
    assert short == []
    hs, incs = feed(rules, {0: low}, 30)
    assert opened(incs) == [("gpu_thermal", hs.base.gpus[0].uuid, "gpu.throttle.sw-power-cap")]
    assert next(i for i in incs if i.state == "open").severity == "minor"


def test_sw_thermal_peak_is_normal_sustained_is_a_ticket(rules):
    hot = {"clocks_event_reasons": SW_THERMAL, "temperature_c": 84.0}
    _, peak = feed(rules, {5: hot}, 10)
    assert peak == [], "a SW thermal slowdown of under two minutes is the driver doing its job"
    hs, held = feed(rules, {5: hot}, 18)
    assert opened(held) == [("gpu_thermal", hs.base.gpus[5].uuid, "gpu.throttle.sw-thermal-sustained")]


def test_hw_thermal_still_fires_fast(rules):
    hs, incs = feed(rules, {2: {"clocks_event_reasons": HW_THERMAL | HW_SLOWDOWN, "temperature_c": 91.0}}, 3)
    assert opened(incs) == [("gpu_thermal", hs.base.gpus[2].uuid, "gpu.thermal.slowdown")]


def test_one_gpu_throttled_with_many_reasons_is_one_episode(rules):
    reasons = POWER_BRAKE | HW_SLOWDOWN | SW_THERMAL
    hs, incs = feed(rules, {4: {"clocks_event_reasons": reasons}}, 20)
    assert {(m, c) for m, c, _ in opened(incs)} == {("gpu_thermal", hs.base.gpus[4].uuid)}
    assert len({i.id for i in incs}) == 1


def test_idle_gpus_raise_nothing(rules):
    _, incs = feed(rules, {i: {"clocks_event_reasons": 0x1, "utilization_pct": 0.0} for i in range(8)}, 60)
    assert incs == []
