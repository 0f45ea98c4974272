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


def wait_for_room(limit_s: float = 90.0) -> list[str]:
    """Wait (bounded) until no node of the shared test cluster is drained or down. The caps count
    every unavailable node the scheduler lists (9 nodes: 1 may be unavailable), so a node another
    test holds for a moment would queue this test's drain. Returns the nodes still unavailable."""
    import time

    deadline = time.monotonic() + limit_s
    while True:
        busy = sorted(n for n, st in SlurmScheduler().inventory().items() if st.drained)
        if not busy or time.monotonic() >= deadline:
            return busy
        time.sleep(1.0)
