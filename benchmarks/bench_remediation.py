"""Remediation decisions per second: dry-run worker, real SQLite store (WAL) in a temp dir.

The 2,000-node inventory is the operator's static list (``[guards].nodes``), so every drain decision
counts the cap on it as it would on the scheduler's list; in the dry run the caps trip (10 % = 200
nodes) and later drains queue, as they would live.

Prints figures; asserts nothing. Usage: .venv/bin/python benchmarks/bench_remediation.py [N]
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.table import Row
from fleethealth.bus import InProcessBus
from fleethealth.schema import Evidence, Incident
from fleethealth.taxonomy import FAULT_LABELS
from remediation.settings import AllSettings, GuardSettings, RemediationSettings
from remediation.worker import RemediationWorker


def incidents(n: int, seed: int = 7) -> list[Incident]:
    rng = random.Random(seed)
    now = time.time()
    return [Incident(id=f"inc-{i}", host=f"gpu-node-{rng.randrange(2000):04d}", component=f"GPU-{rng.randrange(8)}",
                     failure_mode=rng.choice(FAULT_LABELS), severity="critical", confidence=0.9, detector="bench",
                     first_seen=now - 1, last_seen=now, state="open",
                     evidence=[Evidence(fact="bench", line="NVRM: Xid (PCI:0000:3b:00): 79")]) for i in range(n)]


def run(n: int, dry_run: bool) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as d:
        s = AllSettings(remediation=RemediationSettings(dry_run=dry_run),
                        guards=GuardSettings(nodes=["gpu-node-[0000-1999]"]))
        w = RemediationWorker(s, bus=InProcessBus(), store=Path(d) / "state.sqlite")
        incs = incidents(n)
        t0 = time.perf_counter()
        actions = sum(len(w.handle(i)) for i in incs)
        dt = time.perf_counter() - t0
        w.close()
    return dt, actions


def rows(n: int = 2000) -> list[Row]:
    out = []
    for label, dry in (("dry-run", True), ("tickets written (SQLite, WAL)", False)):
        dt, actions = run(n, dry)
        out.append(Row("remediation", f"decisions/s, {label}", n / dt, "incidents/s",
                       f"{actions / dt:,.0f} actions/s; one worker, one core"))
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    for label, dry in (("dry-run", True), ("no scheduler, tickets written", False)):
        dt, actions = run(n, dry)
        print(f"remediation {label:<30} {n} incidents  {n / dt:8.0f} incidents/s  {actions / dt:8.0f} actions/s  "
              f"({dt * 1e3 / n:.2f} ms/incident)")


if __name__ == "__main__":
    main()
