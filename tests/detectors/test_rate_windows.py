"""A counter rate judged over the time its deltas really cover. With a poll as long as the rule's
window (fleets that poll every 10 minutes against a 5- or 10-minute rule), the two deltas a window
counts span up to twice the window: a healthy counter at half its limit read as over it (the
near-limit noise of the simulator found it on the shipped 128-host set)."""

from __future__ import annotations

import msgspec
import pytest

from detectors.engine.engine import DetectorEngine
from simulator.fixtures import HostSeries

replace = msgspec.structs.replace


def _replay_findings(per_hour: float, interval_s: float, polls: int = 30) -> list[str]:
    """PCIe replays climbing steadily at ``per_hour`` (the rule: > 480/h over 300 s)."""
    h = HostSeries("r", interval=interval_s)
    eng = DetectorEngine()
    got: list[str] = []
    for k in range(polls):
        def fn(s, k=k):  # type: ignore[no-untyped-def]
            g = s.gpus[2]
            s.gpus[2] = replace(g, pcie=replace(g.pcie, replay_counter=int(per_hour * interval_s / 3600 * k)))
        got += [i.failure_mode for i in eng.feed(h.advance(fn))]
    return got


@pytest.mark.parametrize("interval_s", [30.0, 300.0, 600.0])
def test_a_steady_counter_under_its_limit_stays_quiet_at_any_poll_interval(interval_s: float) -> None:
    assert "pcie_link_degraded" not in _replay_findings(0.6 * 480, interval_s)


@pytest.mark.parametrize("interval_s", [30.0, 300.0, 600.0])
def test_a_counter_over_its_limit_fires_at_any_poll_interval(interval_s: float) -> None:
    assert "pcie_link_degraded" in _replay_findings(2.0 * 480, interval_s)
