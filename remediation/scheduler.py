"""The scheduler interface remediation drains through, and the 'none' scheduler.

An adapter reads a node's state (to leave operator drains alone and to recognise its own drain
after a crash), drains with a reason that names the incident, resumes, and lists every node it
knows (:meth:`Scheduler.inventory`): that list, not any label in a message, is what the cluster /
group / rack caps count. Drain reasons written by fleethealth always start with
``fleethealth:<incident id>``.
"""

from __future__ import annotations

import re
import time
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
    groups: tuple[str, ...] = ()  # Slurm partitions / the Kubernetes node-group label's value
    rack: str = ""  # from a Slurm node feature / a Kubernetes node label ("" = not configured or none)

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

    def inventory(self) -> dict[str, NodeState]:
        """Every node the scheduler lists, with its state, groups and rack (one call)."""


_RANGE = re.compile(r"^(?P<pre>[^\[\]]*)\[(?P<body>[0-9,\-]+)\](?P<post>[^\[\]]*)$")


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm-style host list: ``gpu-node-[001-004,010]``, ``a,b``; plain names as-is.
    Raises ValueError for a malformed expression (the caller names file and key)."""
    out: list[str] = []
    depth, start = 0, 0
    parts = []
    for i, ch in enumerate(expr):  # split at commas outside brackets
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    parts.append(expr[start:])
    for part in (p.strip() for p in parts):
        if not part:
            continue
        if "[" not in part and "]" not in part:
            out.append(part)
            continue
        m = _RANGE.match(part)
        if not m:
            raise ValueError(f"bad host list {part!r} (one [a-b,c] range per name)")
        for item in m.group("body").split(","):
            lo, _, hi = item.partition("-")
            if not lo or (hi == "" and item.endswith("-")):
                raise ValueError(f"bad range {item!r} in {part!r}")
            hi = hi or lo
            if int(hi) < int(lo) or int(hi) - int(lo) > 100_000:
                raise ValueError(f"bad range {item!r} in {part!r}")
            out.extend(f"{m.group('pre')}{n:0{len(lo)}d}{m.group('post')}" for n in range(int(lo), int(hi) + 1))
    return out


class NoScheduler:
    """No scheduler configured: drains are recorded as skipped, nothing is touched. The inventory
    is the operator's static node list (``[guards].nodes``), if any: it is what a dry run counts."""

    name = "none"

    def __init__(self, nodes: list[str] | None = None, racks: dict[str, str] | None = None) -> None:
        racks = racks or {}
        self._nodes = {n: NodeState(n, "unknown", False, rack=racks.get(n, "")) for n in nodes or []}

    def node_name(self, host: str) -> str:
        return host

    def node_state(self, node: str) -> NodeState:
        if self._nodes and node not in self._nodes:
            raise NodeNotFound(f"{node} is not in [guards].nodes")
        return self._nodes.get(node) or NodeState(node, "unknown", False)

    def inventory(self) -> dict[str, NodeState]:
        return dict(self._nodes)

    def drain(self, node: str, reason: str, failure_mode: str) -> DrainResult:
        raise SchedulerError("no scheduler configured (--scheduler none): nothing drained")

    def resume(self, node: str) -> None:
        raise SchedulerError("no scheduler configured (--scheduler none): nothing resumed")

    def retry(self, node: str, pending: Pending) -> Pending | None:
        return None


class DryRunScheduler:
    """What a dry run drains through. Reads go to the real scheduler (or the static list), with the
    nodes this dry run would have drained shown drained (kept in the state DB, table
    ``dry_run_nodes``), so the caps, the drain-before-reset rule and resumes run exactly as live;
    ``drain`` and ``resume`` change nothing outside the state DB."""

    def __init__(self, real: Scheduler, store: DryRunStore) -> None:
        self.real, self.store = real, store
        self.name = real.name

    def node_name(self, host: str) -> str:
        return self.real.node_name(host)

    def _overlay(self, st: NodeState, reason: str | None) -> NodeState:
        if reason is None or st.drained:
            return st
        return NodeState(st.node, f"{st.state}+DRAIN(dry-run)", True, reason, groups=st.groups, rack=st.rack)

    def node_state(self, node: str) -> NodeState:
        return self._overlay(self.real.node_state(node), self.store.dry_run_reason(node))

    def inventory(self) -> dict[str, NodeState]:
        drained = self.store.dry_run_drained()
        return {n: self._overlay(st, drained.get(n)) for n, st in self.real.inventory().items()}

    def drain(self, node: str, reason: str, failure_mode: str) -> DrainResult:
        self.store.set_dry_run_drained(node, reason, time.time())
        return DrainResult(details={"dry_run": "true"})

    def resume(self, node: str) -> None:
        self.store.set_dry_run_drained(node, None, time.time())

    def retry(self, node: str, pending: Pending) -> Pending | None:
        return None


class DryRunStore(Protocol):
    def dry_run_drained(self) -> dict[str, str]: ...

    def dry_run_reason(self, node: str) -> str | None: ...

    def set_dry_run_drained(self, node: str, reason: str | None, ts: float) -> None: ...
