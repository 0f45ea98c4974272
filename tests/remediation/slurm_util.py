"""Helpers for tests against the real Slurm controller: read a node, restore it afterwards."""

from __future__ import annotations

import subprocess

from remediation.scheduler import NodeState
from remediation.slurm import SlurmScheduler


def show(node: str) -> NodeState:
    return SlurmScheduler().node_state(node)


def sinfo_reason(node: str) -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%N|%T|%E"], capture_output=True, text=True,
                         timeout=15, check=True).stdout
    return out.strip().splitlines()[0]


def restore(*nodes: str) -> None:
    """Resume every node given that is drained (by these tests or their operator stand-in)."""
    for n in nodes:
        st = show(n)
        if st.drained:
            subprocess.run(["scontrol", "update", f"NodeName={n}", "State=RESUME"], capture_output=True, timeout=15)
