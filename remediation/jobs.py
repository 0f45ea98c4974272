"""Job-aware drains: what runs on a node, and what a drain does to it, by how urgent the fault is.

A GPU that fell off the bus has already killed its job: waiting for the job to finish only keeps
the scheduler placing the requeued job back on a dead node. A predictive ticket (a correctable-ECC
storm) should let the job finish. So a drain's **urgency** (the policy rule's ``urgency``, else
``fatal`` for critical incidents and ``predictive`` otherwise) decides:

* ``fatal``: DRAIN (no new work), **requeue** every job running on the node (Slurm
  ``scontrol requeue``: the job goes back to the queue and restarts elsewhere, from its checkpoint if
  it has one), then **DOWN** with the same fleethealth reason, so nothing lands there again until
  the node is resumed;
* ``predictive``: DRAIN and let the jobs finish; past ``[jobs].deadline_s`` the jobs still running
  are requeued (:meth:`JobControl.due`).

The job ids on the node at the drain go into the incident's evidence (and so into its ticket).
Kubernetes has the same choice in its adapter (``[kubernetes].drain_mode = "wait"``: cordon, then
evict only what is still running at the deadline).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from remediation.scheduler import SchedulerError

URGENCIES = ("fatal", "predictive")
ACTIVE = "RUNNING,COMPLETING,CONFIGURING,SUSPENDED"

SCHEMA = """
CREATE TABLE IF NOT EXISTS job_deadlines (
  node TEXT NOT NULL, incident_id TEXT NOT NULL, due_at REAL NOT NULL, jobs TEXT NOT NULL,
  state TEXT NOT NULL, payload TEXT NOT NULL, PRIMARY KEY (node, incident_id));
"""


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    user: str
    state: str
    name: str

    def describe(self) -> str:
        return f"{self.id} ({self.user}, {self.name}, {self.state})"


def parse_squeue(out: str) -> list[Job]:
    """``squeue -h -o '%i|%u|%T|%j'`` lines (pure); malformed lines are skipped."""
    jobs = []
    for line in out.splitlines():
        parts = line.strip().split("|", 3)
        if len(parts) == 4 and parts[0]:
            jobs.append(Job(*parts))
    return jobs


def urgency_of(severity: str, rule_urgency: str | None) -> str:
    if rule_urgency in URGENCIES:
        return rule_urgency  # type: ignore[return-value]
    return "fatal" if severity == "critical" else "predictive"


class SlurmJobs:
    """Job control on the node through the Slurm adapter's subprocess edge."""

    def __init__(self, scheduler: Any, squeue: str = "squeue") -> None:
        self.sched = scheduler
        self.squeue = squeue

    def on_node(self, node: str) -> list[Job]:
        return parse_squeue(self.sched._run([self.squeue, "-h", "-w", node, "-t", ACTIVE, "-o", "%i|%u|%T|%j"]))

    def requeue(self, job_id: str) -> None:
        self.sched._run([self.sched.s.scontrol, "requeue", job_id])

    def down(self, node: str, reason: str) -> None:
        self.sched._run([self.sched.s.scontrol, "update", f"NodeName={node}", "State=DOWN", f"Reason={reason}"])


class JobControl:
    """Deadlines of predictive drains, kept in the remediation DB."""

    def __init__(self, conn: sqlite3.Connection, jobs: SlurmJobs | None) -> None:
        self.conn = conn
        self.jobs = jobs
        conn.executescript(SCHEMA)

    def watch(self, node: str, incident_id: str, due_at: float, jobs: list[Job], payload: str) -> None:
        self.conn.execute("INSERT OR IGNORE INTO job_deadlines VALUES (?,?,?,?,?,?)",
                          (node, incident_id, due_at, ",".join(j.id for j in jobs), "waiting", payload))

    def due(self, now: float) -> list[tuple[str, str, str]]:
        """(node, incident id, payload) of predictive drains whose deadline passed."""
        return [tuple(r) for r in self.conn.execute(  # type: ignore[misc]
            "SELECT node, incident_id, payload FROM job_deadlines WHERE state='waiting' AND due_at <= ?", (now,))]

    def done(self, node: str, incident_id: str) -> None:
        self.conn.execute("UPDATE job_deadlines SET state='done' WHERE node=? AND incident_id=?", (node, incident_id))


__all__ = ["Job", "JobControl", "SchedulerError", "SlurmJobs", "URGENCIES", "parse_squeue", "urgency_of"]
