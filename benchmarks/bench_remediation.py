"""Remediation decisions per second: dry-run worker, real SQLite store (WAL) in a temp dir.

The 2,000-node inventory is the operator's static list (``[guards].nodes``), so every drain decision
counts the cap on it as it would on the scheduler's list; in the dry run the caps trip (10 % = 200
nodes) and later drains queue, as they would live.

Decisions/s are per process CPU second, best of 3 (as the other benchmarks: other work on a shared
machine only adds wall time, and the SQLite WAL writes wait on the disk); wall time is printed too.
Prints figures; asserts nothing. Usage: .venv/bin/python -m benchmarks.bench_remediation [N]
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


def run_once(n: int, dry_run: bool) -> tuple[float, float, int]:
    """(CPU s, wall s, actions) of one fresh worker handling n incidents."""
    with tempfile.TemporaryDirectory() as d:
        s = AllSettings(remediation=RemediationSettings(dry_run=dry_run),
                        guards=GuardSettings(nodes=["gpu-node-[0000-1999]"]))
        w = RemediationWorker(s, bus=InProcessBus(), store=Path(d) / "state.sqlite")
        incs = incidents(n)
        c0, t0 = time.process_time(), time.perf_counter()
        actions = sum(len(w.handle(i)) for i in incs)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        w.close()
    return cpu, wall, actions


def run(n: int, dry_run: bool, repeat: int = 3) -> tuple[float, float, int]:
    """Best of ``repeat`` by CPU time: (CPU s, wall s of that run, actions)."""
    return min((run_once(n, dry_run) for _ in range(repeat)), key=lambda r: r[0])


def rows(n: int = 2000) -> list[Row]:
    out = []
    for label, dry in (("dry-run", True), ("tickets written (SQLite, WAL)", False)):
        cpu, wall, actions = run(n, dry)
        out.append(Row("remediation", f"decisions/s, {label}", n / cpu, "incidents/s",
                       f"{actions / cpu:,.0f} actions/s per CPU second, best of 3 ({n / wall:,.0f}/s wall); "
                       "one worker, one core"))
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    for label, dry in (("dry-run", True), ("no scheduler, tickets written", False)):
        cpu, wall, actions = run(n, dry)
        print(f"remediation {label:<30} {n} incidents  {n / cpu:8.0f} incidents/s  {actions / cpu:8.0f} actions/s  "
              f"(CPU, best of 3; {n / wall:.0f} incidents/s wall)")


if __name__ == "__main__":
    main()
