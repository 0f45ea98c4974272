"""The scheduler interface remediation drains through, and the 'none' scheduler.

An adapter reads a node's state (to leave operator drains alone and to recognise its own drain
after a crash), drains with a reason that names the incident, resumes, and reports its node count.
Drain reasons written by fleethealth always start with ``fleethealth:<incident id>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from fleethealth.errors import FleetHealthError

REASON_PREFIX = "fleethealth:"


class SchedulerError(FleetHealthError):
    """The scheduler refused or failed a call; the message carries its own words (stderr, Status)."""


class NodeNotFound(SchedulerError):
    """The scheduler does not know this node."""


@dataclass(frozen=True, slots=True)
class NodeState:
    node: str
    state: str  # the scheduler's words, e.g. "IDLE+DRAIN" or "cordoned"
    drained: bool  # drained, draining, down or cordoned: takes no new work
    reason: str = ""  # drain reason (Slurm Reason=, the fleethealth annotation on Kubernetes)

    @property
    def ours(self) -> bool:
        return self.reason.startswith(REASON_PREFIX)

    def drained_for(self, incident_id: str) -> bool:
        return self.drained and self.reason.startswith(f"{REASON_PREFIX}{incident_id} ")


@dataclass(frozen=True, slots=True)
class Pending:
    """A step the scheduler could not finish now (e.g. an eviction a PodDisruptionBudget blocks)."""

    step: str  # "evict"
    target: str  # "namespace/pod"
    reason: str


@dataclass(slots=True)
class DrainResult:
    details: dict[str, str] = field(default_factory=dict)
    pending: list[Pending] = field(default_factory=list)
    done_steps: list[tuple[str, str]] = field(default_factory=list)  # (step, target) finished now


def drain_reason(incident_id: str, failure_mode: str) -> str:
    return f"{REASON_PREFIX}{incident_id} {failure_mode}"


class Scheduler(Protocol):
    name: str

    def node_name(self, host: str) -> str: ...

    def node_state(self, node: str) -> NodeState: ...

    def drain(self, node: str, reason: str, failure_mode: str) -> DrainResult: ...

    def resume(self, node: str) -> None: ...

    def retry(self, node: str, pending: Pending) -> Pending | None:
        """Try a pending step again; None when it is done now."""

    def cluster_size(self) -> int | None: ...


class NoScheduler:
    """No scheduler configured: drains are recorded as skipped, nothing is touched."""

    name = "none"

    def node_name(self, host: str) -> str:
        return host

    def node_state(self, node: str) -> NodeState:
        return NodeState(node, "unknown", False)

    def drain(self, node: str, reason: str, failure_mode: str) -> DrainResult:
        raise SchedulerError("no scheduler configured (--scheduler none): nothing drained")

    def resume(self, node: str) -> None:
        raise SchedulerError("no scheduler configured (--scheduler none): nothing resumed")

    def retry(self, node: str, pending: Pending) -> Pending | None:
        return None

    def cluster_size(self) -> int | None:
        return None
