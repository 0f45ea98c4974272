"""Safety guards: pure checks that stand between a policy decision and an effect.

Every drain passes :func:`drain`; drains, GPU resets and reboot requests pass :func:`kill_switch`
and :func:`freshness`. Each guard takes values and returns a :class:`Verdict`. What the drain
guards count comes from the scheduler's own node list (:class:`DrainContext` is built by
``Drainer.context`` from ``Scheduler.inventory()``), never from the incident's ``cluster`` / ``rack``
labels: a sender chooses those. A node the scheduler does not list is *refused*; past the rate
window, a group cap or a rack cap the drain is *queued* (one alert fires) and retried, never dropped.
Nothing here reads a clock or a file: the worker passes ``now`` and whether the kill-switch file
exists. ``docs/remediation.md`` lists every guard, what it trusts and why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from remediation.settings import GuardSettings

GUARDS = ("kill_switch", "freshness", "inventory", "rate_limit", "cluster_cap", "group_cap", "rack_cap",
          "rack_unknown")


@dataclass(frozen=True, slots=True)
class Verdict:
    allow: bool
    guard: str = ""  # which guard said no
    outcome: Literal["allow", "refused", "queued"] = "allow"
    reason: str = ""
    scope: str = ""  # what the guard held back on (group, rack, node): one alert per guard and scope


ALLOW = Verdict(True)


@dataclass(frozen=True, slots=True)
class GroupCount:
    """One group a cap is taken over, as the scheduler lists it."""

    name: str  # "cluster", or a partition / node-group name
    size: int  # nodes the scheduler lists in it
    unavailable: int  # of those, drained / down / cordoned now (or drained by fleethealth since the listing)


@dataclass(frozen=True, slots=True)
class DrainContext:
    """Everything the drain guards look at, as plain values."""

    host: str
    node: str
    listed: bool  # the scheduler (or [guards].nodes) lists this node
    groups: tuple[GroupCount, ...]  # every group the node belongs to (each cap must hold)
    scope: str  # "cluster" | "group": names the guard in the verdict
    rack: str  # from the scheduler or [guards].racks; "" = none known
    rack_unavailable: int
    racks_configured: bool  # a rack source is configured, so a node without one is a gap, not "no racks"
    recent_drains_of_host: int  # drains of this node within the rate window (receiver's clock)


def kill_switch(settings: GuardSettings, switch_file_exists: bool) -> Verdict:
    if settings.kill_switch or switch_file_exists:
        where = "config [guards].kill_switch" if settings.kill_switch else f"file {settings.kill_switch_file}"
        return Verdict(False, "kill_switch", "refused", f"kill switch engaged ({where}): no effects")
    return ALLOW


def freshness(settings: GuardSettings, last_seen: float, now: float) -> Verdict:
    age = now - last_seen
    if not age <= settings.max_incident_age_s:  # NaN-proof
        return Verdict(False, "freshness", "refused",
                       f"incident is stale: last seen {age:.0f}s ago, bound is {settings.max_incident_age_s:.0f}s")
    return ALLOW


def drain_allowance(settings: GuardSettings, group_size: int) -> int:
    """How many nodes of a group may be unavailable at once before fleethealth stops draining."""
    return max(settings.min_drain_allowance, math.floor(settings.max_drain_fraction * group_size + 1e-9))


def drain(settings: GuardSettings, ctx: DrainContext) -> Verdict:
    """Inventory, rate window, group caps and rack cap for one new drain (kill switch and freshness first)."""
    if not ctx.listed:
        return Verdict(False, "inventory", "refused",
                       f"node {ctx.node!r} is not in the scheduler's node list: not drained (telemetry names "
                       "hosts; only the scheduler says which nodes exist)")
    if ctx.recent_drains_of_host >= settings.drains_per_host:
        return Verdict(False, "rate_limit", "queued",
                       f"rate window: {ctx.node} was drained {ctx.recent_drains_of_host} time(s) in the last "
                       f"{settings.rate_window_s:.0f}s (limit {settings.drains_per_host}); drain queued until the "
                       "window allows it", scope=ctx.node)
    for g in ctx.groups:
        cap = drain_allowance(settings, g.size)
        if g.unavailable >= cap:
            guard = "cluster_cap" if ctx.scope == "cluster" else "group_cap"
            what = "cluster" if ctx.scope == "cluster" else f"group {g.name!r}"
            return Verdict(False, guard, "queued",
                           f"{guard.replace('_', ' ')}: {g.unavailable} of {g.size} nodes in {what} are unavailable "
                           f"per the scheduler (limit {cap} = {settings.max_drain_fraction:.0%}, min "
                           f"{settings.min_drain_allowance}); drain of {ctx.node} queued", scope=g.name)
    if ctx.racks_configured and not ctx.rack:
        return Verdict(False, "rack_unknown", "queued",
                       f"rack of {ctx.node} unknown (racks are configured, this node has none): drain queued "
                       "until the scheduler or [guards].racks names its rack", scope="rack_unknown")
    if ctx.rack and ctx.rack_unavailable >= settings.max_drained_per_rack:
        return Verdict(False, "rack_cap", "queued",
                       f"rack cap: {ctx.rack_unavailable} nodes of rack {ctx.rack!r} are unavailable "
                       f"(limit {settings.max_drained_per_rack}); drain of {ctx.node} queued", scope=ctx.rack)
    return ALLOW
