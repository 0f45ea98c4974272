"""Each safety guard on literal values (the guards are pure), and the settings that would switch
one off, refused at start-up with file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleethealth.config import ConfigError, load_config
from remediation import guards
from remediation.settings import GuardSettings, load_settings

G = GuardSettings()


def ctx(size: int = 100, unavailable: int = 0, **kw: object) -> guards.DrainContext:
    base: dict[str, object] = dict(host="h1", node="h1", listed=True,
                                   groups=(guards.GroupCount("cluster", size, unavailable),), scope="cluster",
                                   rack="r1", rack_unavailable=0, racks_configured=True, recent_drains_of_host=0)
    base.update(kw)
    return guards.DrainContext(**base)  # type: ignore[arg-type]


def test_cluster_cap_is_ten_percent_then_queues() -> None:
    assert guards.drain(G, ctx(unavailable=9)).allow
    v = guards.drain(G, ctx(unavailable=10))
    assert (v.allow, v.outcome, v.guard) == (False, "queued", "cluster_cap")
    assert "10 of 100 nodes" in v.reason and "limit 10" in v.reason


def test_every_group_of_a_node_must_have_room() -> None:
    two = (guards.GroupCount("gpu", 100, 0), guards.GroupCount("debug", 10, 1))
    v = guards.drain(G, ctx(groups=two, scope="group"))
    assert (v.outcome, v.guard) == ("queued", "group_cap") and "group 'debug'" in v.reason


def test_small_cluster_keeps_a_minimum_allowance() -> None:
    assert guards.drain_allowance(G, 9) == 1
    assert guards.drain_allowance(GuardSettings(min_drain_allowance=0), 8) == 0
    assert guards.drain_allowance(G, 20) == 2


def test_rack_cap_and_unknown_rack_queue() -> None:
    v = guards.drain(G, ctx(rack_unavailable=2, unavailable=2))
    assert (v.outcome, v.guard) == ("queued", "rack_cap")
    v = guards.drain(G, ctx(rack="", unavailable=2))  # racks configured, this node has none: a gap
    assert (v.outcome, v.guard) == ("queued", "rack_unknown")
    assert guards.drain(G, ctx(rack="", racks_configured=False, unavailable=2)).allow  # no rack source at all


def test_rate_window_queues_never_refuses() -> None:
    v = guards.drain(G, ctx(recent_drains_of_host=1))
    assert (v.outcome, v.guard) == ("queued", "rate_limit")
    assert guards.drain(GuardSettings(drains_per_host=2), ctx(recent_drains_of_host=1)).allow


def test_node_the_scheduler_does_not_list_is_refused() -> None:
    v = guards.drain(G, ctx(listed=False, groups=()))
    assert (v.outcome, v.guard) == ("refused", "inventory") and "not in the scheduler's node list" in v.reason


def test_freshness_bound() -> None:
    assert guards.freshness(G, last_seen=1000.0, now=1000.0 + 900).allow
    v = guards.freshness(G, last_seen=1000.0, now=1000.0 + 901)
    assert (v.outcome, v.guard) == ("refused", "freshness") and "901s ago" in v.reason
    assert not guards.freshness(G, last_seen=float("nan"), now=1000.0).allow


def test_kill_switch_by_config_or_file() -> None:
    assert guards.kill_switch(G, False).allow
    assert guards.kill_switch(GuardSettings(kill_switch=True), False).guard == "kill_switch"
    v = guards.kill_switch(GuardSettings(kill_switch_file="/run/stop"), True)
    assert not v.allow and "/run/stop" in v.reason


@pytest.mark.parametrize(("text", "key"), [
    ("max_incident_age_s = inf", "[guards].max_incident_age_s"),
    ("max_incident_age_s = nan", "[guards].max_incident_age_s"),
    ("max_incident_age_s = 1e9", "[guards].max_incident_age_s"),
    ("min_drain_allowance = 1000000000", "[guards].min_drain_allowance"),
    ("max_drained_per_rack = 100000", "[guards].max_drained_per_rack"),
    ("max_drain_fraction = nan", "[guards].max_drain_fraction"),
    ("max_drain_fraction = 1.5", "[guards].max_drain_fraction"),
    ("rate_window_s = 0.001", "[guards].rate_window_s"),
    ("rate_window_s = inf", "[guards].rate_window_s"),
    ("drains_per_host = 1000", "[guards].drains_per_host"),
    ('cluster_sizes = {prod = 100}', "[guards].cluster_sizes"),
    ('racks = {r1 = ["gpu-node-[9-1]"]}', "[guards].racks.r1"),
])
def test_settings_that_disable_a_guard_fail_start_up_naming_file_and_key(tmp_path: Path, text: str,
                                                                         key: str) -> None:
    f = tmp_path / "fleet.toml"
    f.write_text(f"[guards]\n{text}\n")
    with pytest.raises(ConfigError) as e:
        load_settings(load_config(f))
    assert str(f) in str(e.value) and key in str(e.value), str(e.value)


def test_hook_and_ticket_timeouts_are_bounded(tmp_path: Path) -> None:
    f = tmp_path / "fleet.toml"
    f.write_text("[tickets]\nwebhook_backoff_s = inf\n")
    with pytest.raises(ConfigError, match=r"\[tickets\]\.webhook_backoff_s"):
        load_settings(load_config(f))
    f.write_text("[remediation.hooks]\ntimeout_s = 1e12\n")
    with pytest.raises(ConfigError, match="timeout_s"):
        load_settings(load_config(f))
