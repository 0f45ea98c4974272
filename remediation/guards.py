"""Safety guards: pure checks that stand between a policy decision and an effect.

Every drain, GPU reset and reboot request passes :func:`check`; each guard takes values (the
incident's age, fleethealth's current drains, recent drains of the host, the cluster size, the kill
switch) and returns a :class:`Verdict`. Past the cluster or rack cap the action is *queued* (and an
alert fires); the other guards *refuse*. Nothing here reads a clock or a file: the worker passes
``now`` and whether the kill-switch file exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from remediation.settings import GuardSettings

GUARDS = ("kill_switch", "freshness", "rate_limit", "cluster_cap", "rack_cap", "cluster_size")


@dataclass(frozen=True, slots=True)
class Verdict:
    allow: bool
    guard: str = ""  # which guard said no
    outcome: Literal["allow", "refused", "queued"] = "allow"
    reason: str = ""


ALLOW = Verdict(True)


@dataclass(frozen=True, slots=True)
class DrainContext:
    """Everything the drain guards look at, as plain values."""

    host: str
    cluster: str
    rack: str
    cluster_size: int | None  # None: unknown (neither config nor scheduler said)
    drained_in_cluster: int  # nodes fleethealth holds drained now in this cluster
    drained_in_rack: int
    recent_drains_of_host: int  # drains of this host within the rate window


def kill_switch(settings: GuardSettings, switch_file_exists: bool) -> Verdict:
    if settings.kill_switch or switch_file_exists:
        where = "config [guards].kill_switch" if settings.kill_switch else f"file {settings.kill_switch_file}"
        return Verdict(False, "kill_switch", "refused", f"kill switch engaged ({where}): no effects")
    return ALLOW


def freshness(settings: GuardSettings, last_seen: float, now: float) -> Verdict:
    age = now - last_seen
    if age > settings.max_incident_age_s:
        return Verdict(False, "freshness", "refused",
                       f"incident is stale: last seen {age:.0f}s ago, bound is {settings.max_incident_age_s:.0f}s")
    return ALLOW


def drain_allowance(settings: GuardSettings, cluster_size: int) -> int:
    """How many nodes of a cluster fleethealth may hold drained at once."""
    return max(settings.min_drain_allowance, math.floor(settings.max_drain_fraction * cluster_size + 1e-9))


def drain(settings: GuardSettings, ctx: DrainContext) -> Verdict:
    """Rate limit, cluster cap and rack cap for one new drain (kill switch and freshness first)."""
    if ctx.recent_drains_of_host >= settings.drains_per_host:
        return Verdict(False, "rate_limit", "refused",
                       f"rate limit: {ctx.host} was drained {ctx.recent_drains_of_host} time(s) in the last "
                       f"{settings.rate_window_s:.0f}s (limit {settings.drains_per_host})")
    if ctx.cluster_size is None:
        return Verdict(False, "cluster_size", "refused",
                       f"cluster size of {ctx.cluster!r} unknown: set [guards].cluster_sizes or use a scheduler "
                       "that reports its node count")
    cap = drain_allowance(settings, ctx.cluster_size)
    if ctx.drained_in_cluster >= cap:
        return Verdict(False, "cluster_cap", "queued",
                       f"cluster cap: {ctx.drained_in_cluster} of {ctx.cluster_size} nodes in cluster "
                       f"{ctx.cluster!r} already drained by fleethealth (limit {cap} = "
                       f"{settings.max_drain_fraction:.0%}); drain of {ctx.host} queued")
    if ctx.rack and ctx.drained_in_rack >= settings.max_drained_per_rack:
        return Verdict(False, "rack_cap", "queued",
                       f"rack cap: {ctx.drained_in_rack} nodes of rack {ctx.rack!r} already drained "
                       f"(limit {settings.max_drained_per_rack}); drain of {ctx.host} queued")
    return ALLOW
