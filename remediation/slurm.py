"""Slurm through ``scontrol`` and ``sinfo`` subprocesses (timeouts, stderr surfaced).

Facts this relies on (Slurm 22.05, checked against a running slurmctld): ``scontrol show node -o
NAME`` prints one line of ``Key=Value`` pairs with ``State=IDLE+DRAIN`` style states and, last,
``Reason=<text> [user@time]``; an unknown node exits 1 with "Node NAME not found"; ``scontrol update
NodeName=N State=DRAIN Reason=...`` needs a reason, and ``State=RESUME`` clears it. ``scontrol show node -o`` with no name lists every node, one
line each, with ``Partitions=a,b`` and ``AvailableFeatures=`` / ``ActiveFeatures=`` (``(null)`` for
none): the inventory the caps count, and where racks come from (a feature ``<rack_feature_prefix>NAME``).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence

from remediation.scheduler import DrainResult, NodeNotFound, NodeState, Pending, SchedulerError
from remediation.settings import SlurmSettings

DRAINED_FLAGS = frozenset({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING", "MAINT", "REBOOT_ISSUED"})
_REASON = re.compile(r"\bReason=(.*?)(?: \[[^\]@]*@[^\]]*\])?\s*$")
_STATE = re.compile(r"\bState=(\S+)")
_NODE = re.compile(r"^NodeName=(\S+) ")
_PARTS = re.compile(r"\bPartitions=(\S+)")
_FEATURES = re.compile(r"\bActiveFeatures=(\S+)")


def _csv(m: re.Match[str] | None) -> tuple[str, ...]:
    if not m or m.group(1) in ("(null)", "N/A"):
        return ()
    return tuple(x for x in m.group(1).split(",") if x)


def parse_show_node(line: str, node: str, rack_feature_prefix: str | None = None) -> NodeState:
    """Parse one ``scontrol show node -o`` line (pure)."""
    m = _STATE.search(line)
    if not m:
        raise SchedulerError(f"scontrol show node {node}: no State= in output {line[:200]!r}")
    state = m.group(1)
    flags = {f.rstrip("*") for f in state.split("+")}
    r = _REASON.search(line)
    reason = r.group(1).strip() if r else ""
    rack = ""
    if rack_feature_prefix:
        rack = next((f[len(rack_feature_prefix):] for f in _csv(_FEATURES.search(line))
                     if f.startswith(rack_feature_prefix) and len(f) > len(rack_feature_prefix)), "")
    return NodeState(node, state, bool(flags & DRAINED_FLAGS), reason, groups=_csv(_PARTS.search(line)), rack=rack)


def parse_inventory(out: str, rack_feature_prefix: str | None = None) -> dict[str, NodeState]:
    """Every node of a ``scontrol show node -o`` listing (pure)."""
    nodes: dict[str, NodeState] = {}
    for ln in out.splitlines():
        m = _NODE.match(ln)
        if m:
            nodes[m.group(1)] = parse_show_node(ln, m.group(1), rack_feature_prefix)
    return nodes


class SlurmScheduler:
    name = "slurm"

    def __init__(self, settings: SlurmSettings | None = None) -> None:
        self.s = settings or SlurmSettings()

    def _run(self, argv: Sequence[str]) -> str:
        try:
            p = subprocess.run(list(argv), capture_output=True, text=True, timeout=self.s.timeout_s, check=False)
        except FileNotFoundError:
            raise SchedulerError(f"{argv[0]} not found: is Slurm installed on this machine?") from None
        except subprocess.TimeoutExpired:
            raise SchedulerError(f"{' '.join(argv[:3])} timed out after {self.s.timeout_s:.0f}s "
                                 "(is slurmctld reachable?)") from None
        if p.returncode != 0:
            msg = (p.stderr.strip() or p.stdout.strip() or f"exit status {p.returncode}")[:500]
            if "not found" in msg or "Invalid node name" in msg:
                raise NodeNotFound(f"{' '.join(argv[:3])}: {msg}")
            raise SchedulerError(f"{' '.join(argv[:3])} failed (exit {p.returncode}): {msg}")
        return p.stdout

    def node_name(self, host: str) -> str:
        return self.s.node_names.get(host, host)

    def node_state(self, node: str) -> NodeState:
        out = self._run([self.s.scontrol, "show", "node", "-o", node]).strip()
        line = next((ln for ln in out.splitlines() if ln.startswith(f"NodeName={node} ")), "")
        if not line:
            raise NodeNotFound(f"scontrol show node {node}: not in the output")
        return parse_show_node(line, node, self.s.rack_feature_prefix)

    def drain(self, node: str, reason: str, failure_mode: str) -> DrainResult:
        self._run([self.s.scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
        return DrainResult(details={"scheduler": "slurm", "node": node, "reason": reason})

    def resume(self, node: str) -> None:
        self._run([self.s.scontrol, "update", f"NodeName={node}", "State=RESUME"])

    def retry(self, node: str, pending: Pending) -> Pending | None:
        return None

    def inventory(self) -> dict[str, NodeState]:
        out = self._run([self.s.scontrol, "show", "node", "-o"])
        nodes = parse_inventory(out, self.s.rack_feature_prefix)
        if not nodes:
            raise SchedulerError(f"scontrol show node -o listed no nodes: {out[:200]!r}")
        return nodes

    def topology_text(self) -> str:
        """``scontrol show topology``: the switch tree of topology/tree (remediation.topology parses it);
        empty when the cluster declares none."""
        try:
            return self._run([self.s.scontrol, "show", "topology"])
        except SchedulerError:
            return ""
