"""Each safety guard on literal values (the guards are pure)."""

from __future__ import annotations

from remediation import guards
from remediation.settings import GuardSettings

G = GuardSettings()


def ctx(**kw: object) -> guards.DrainContext:
    base: dict[str, object] = dict(host="h1", cluster="c", rack="r1", cluster_size=100, drained_in_cluster=0,
                                   drained_in_rack=0, recent_drains_of_host=0)
    base.update(kw)
    return guards.DrainContext(**base)  # type: ignore[arg-type]


def test_cluster_cap_is_ten_percent_then_queues() -> None:
    assert guards.drain(G, ctx(drained_in_cluster=9)).allow
    v = guards.drain(G, ctx(drained_in_cluster=10))
    assert (v.allow, v.outcome, v.guard) == (False, "queued", "cluster_cap")
    assert "10 of 100 nodes" in v.reason and "limit 10" in v.reason


def test_small_cluster_keeps_a_minimum_allowance() -> None:
    assert guards.drain_allowance(G, 8) == 1
    assert guards.drain_allowance(GuardSettings(min_drain_allowance=0), 8) == 0
    assert guards.drain_allowance(G, 20) == 2


def test_rack_cap() -> None:
    v = guards.drain(G, ctx(drained_in_rack=2, drained_in_cluster=2))
    assert (v.outcome, v.guard) == ("queued", "rack_cap")
    assert guards.drain(G, ctx(rack="", drained_in_rack=5, drained_in_cluster=2)).allow  # no rack known


def test_rate_limit_refuses_second_drain_of_host() -> None:
    v = guards.drain(G, ctx(recent_drains_of_host=1))
    assert (v.outcome, v.guard) == ("refused", "rate_limit")
    assert guards.drain(GuardSettings(drains_per_host=2), ctx(recent_drains_of_host=1)).allow


def test_unknown_cluster_size_refuses() -> None:
    v = guards.drain(G, ctx(cluster_size=None))
    assert (v.outcome, v.guard) == ("refused", "cluster_size")


def test_freshness_bound() -> None:
    assert guards.freshness(G, last_seen=1000.0, now=1000.0 + 900).allow
    v = guards.freshness(G, last_seen=1000.0, now=1000.0 + 901)
    assert (v.outcome, v.guard) == ("refused", "freshness") and "901s ago" in v.reason


def test_kill_switch_by_config_or_file() -> None:
    assert guards.kill_switch(G, False).allow
    assert guards.kill_switch(GuardSettings(kill_switch=True), False).guard == "kill_switch"
    v = guards.kill_switch(GuardSettings(kill_switch_file="/run/stop"), True)
    assert not v.allow and "/run/stop" in v.reason
