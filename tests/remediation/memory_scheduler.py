"""A scheduler that keeps its nodes in memory and behaves like Slurm's drain/resume (a fake for
drills that need 100 nodes; tests/remediation/test_slurm.py covers the real slurmctld)."""

from __future__ import annotations

from remediation.scheduler import DrainResult, NodeNotFound, NodeState, Pending


class MemoryScheduler:
    name = "memory"

    def __init__(self, nodes: list[str], racks: dict[str, str] | None = None) -> None:
        racks = racks or {}
        self.nodes = {n: NodeState(n, "IDLE", False, groups=("gpu",), rack=racks.get(n, "")) for n in nodes}
        self.calls: list[tuple[str, str]] = []

    def node_name(self, host: str) -> str:
        return host

    def node_state(self, node: str) -> NodeState:
        if node not in self.nodes:
            raise NodeNotFound(f"node {node} not found")
        return self.nodes[node]

    def drain(self, node: str, reason: str, failure_mode: str) -> DrainResult:
        n = self.node_state(node)
        self.nodes[node] = NodeState(node, "IDLE+DRAIN", True, reason, n.groups, n.rack)
        self.calls.append(("drain", node))
        return DrainResult()

    def resume(self, node: str) -> None:
        n = self.node_state(node)
        self.nodes[node] = NodeState(node, "IDLE", False, "", n.groups, n.rack)
        self.calls.append(("resume", node))

    def retry(self, node: str, pending: Pending) -> Pending | None:
        return None

    def inventory(self) -> dict[str, NodeState]:
        return dict(self.nodes)
