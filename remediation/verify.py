"""Return to service only on a passing verification job (``[verify]``), run on the node itself.

After repair (its ticket marked repaired, every episode resolved) a node used to go straight back
into service; one that still fails under load then killed the next job. With ``[verify].command``
set (e.g. ``dcgmi diag -r 2``, an NCCL all-reduce test), the resume waits for that command to pass
**on that node**, through the scheduler:

* Slurm: a maintenance reservation on the node (``Flags=MAINT,IGNORE_JOBS``: no other job starts
  there), the node resumed into it, and ``sbatch --reservation=R -w NODE`` with the command. Pass
  (exit 0): the node is drained again with its fleethealth reason for the moment it takes the
  worker to resume it, and the reservation deleted. Fail (non-zero, timeout, node failure): the node
  is drained again, the reservation deleted, and the repair ticket **reopened** with the job's output.

This plugs into the drainer's ``post_repair_check(node, host)``, called by ``check_resumes``: it
returns "not yet" while the job is pending or running (the resume is retried after
``[remediation.hooks].post_repair_retry_s``). State is in the remediation DB.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from remediation.scheduler import SchedulerError

SCHEMA = """
CREATE TABLE IF NOT EXISTS verifications (
  node TEXT PRIMARY KEY, host TEXT NOT NULL, reason TEXT NOT NULL, reservation TEXT NOT NULL,
  job_id TEXT NOT NULL, output TEXT NOT NULL, started REAL NOT NULL);
"""
PASSED = {"COMPLETED"}
FAILED = {"FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
_JOB_ID = re.compile(r"^(\d+)")


def job_fields(out: str) -> dict[str, str]:
    """``scontrol show job -o ID`` as key -> value (pure)."""
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


class Verifier(Protocol):
    def check(self, node: str, host: str) -> tuple[bool, str]: ...


class SlurmVerifier:
    def __init__(self, conn: sqlite3.Connection, scheduler: Any, command: str, *, time_limit_min: int = 30,
                 output_dir: str = "", sbatch: str = "sbatch", clock: Callable[[], float] = time.time,
                 on_fail: Callable[[str, str, str], None] | None = None) -> None:
        self.conn = conn
        self.sched = scheduler
        self.command = command
        self.time_limit_min = time_limit_min
        self.output_dir = output_dir
        self.sbatch = sbatch
        self.clock = clock
        self.on_fail = on_fail  # (node, host, output): reopen the tickets
        conn.executescript(SCHEMA)

    def _scontrol(self, *args: str) -> str:
        return str(self.sched._run([self.sched.s.scontrol, *args]))

    def reservation_name(self, node: str) -> str:
        return f"fleethealth-verify-{node}"

    def check(self, node: str, host: str) -> tuple[bool, str]:
        row = self.conn.execute("SELECT reason, reservation, job_id, output FROM verifications WHERE node=?",
                                (node,)).fetchone()
        if row is None:
            return False, self._start(node, host)
        reason, resv, job_id, output = row
        try:
            info = job_fields(self._scontrol("show", "job", "-o", job_id))
        except SchedulerError as exc:
            if "Invalid job id" not in str(exc):
                return False, f"verification job {job_id}: cannot read its state: {exc}"
            info = {"JobState": "FAILED"}  # purged: no COMPLETED seen, so no pass
        state = info.get("JobState", "")
        if state not in PASSED | FAILED:
            return False, f"verification job {job_id} on {node} is {state or 'unknown'}"
        text = self._output(info.get("StdOut") or output)
        self._finish(node, reason, resv)
        if state in PASSED and info.get("ExitCode", "0:0").split(":")[0] == "0":
            return True, f"verification job {job_id} passed on {node} ({self.command}): {text[-500:]}"
        detail = f"verification job {job_id} {state} (exit {info.get('ExitCode', '?')}) on {node}: {text[-3000:]}"
        if self.on_fail is not None:
            self.on_fail(node, host, detail)
        return False, detail

    def _start(self, node: str, host: str) -> str:
        st = self.sched.node_state(node)
        reason = st.reason
        resv = self.reservation_name(node)
        self._scontrol("create", "reservation", f"ReservationName={resv}", f"Nodes={node}", "StartTime=now",
                       f"Duration={self.time_limit_min + 5}", "Users=root", "Flags=MAINT,IGNORE_JOBS")
        out_dir = Path(self.output_dir) if self.output_dir else None
        output = str(out_dir / f"{resv}-%j.out") if out_dir else f"/tmp/{resv}-%j.out"
        try:
            self.sched.resume(node)  # into the reservation: only the verification job starts there
            sub = self.sched._run([self.sbatch, "--parsable", f"--reservation={resv}", "-w", node, "-N", "1",
                                   "-J", "fleethealth-verify", f"--time={self.time_limit_min}", "-o", output,
                                   "--wrap", self.command])
        except SchedulerError:
            self._finish(node, reason, resv)
            raise
        m = _JOB_ID.match(sub.strip())
        job_id = m.group(1) if m else sub.strip()
        self.conn.execute("INSERT OR REPLACE INTO verifications VALUES (?,?,?,?,?,?,?)",
                          (node, host, reason, resv, job_id, output.replace("%j", job_id), self.clock()))
        return f"verification job {job_id} submitted on {node} in reservation {resv}: {self.command}"

    def _finish(self, node: str, reason: str, resv: str) -> None:
        """Back to drained with the fleethealth reason (a pass is resumed by the drainer next), the
        reservation gone, the row removed."""
        try:
            self._scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
        finally:
            try:
                self._scontrol("delete", f"ReservationName={resv}")
            except SchedulerError:
                pass  # already gone (expired)
            self.conn.execute("DELETE FROM verifications WHERE node=?", (node,))

    @staticmethod
    def _output(path: str) -> str:
        try:
            return Path(path).read_text(errors="replace")[-8000:].strip() or "(no output)"
        except OSError:
            return f"(output at {path} on the node)"


class KubeVerifier:
    """The verification as a Kubernetes Job pinned to the node (``nodeName``: it runs on the cordoned
    node, bypassing the scheduler; it tolerates the fleethealth taint). Pass: the Job succeeded.
    Fail: it failed (or ran past its deadline); the pod's log goes to the reopened ticket."""

    def __init__(self, api_client: Any, command: str, *, image: str, namespace: str = "fleethealth",
                 time_limit_min: int = 30, clock: Callable[[], float] = time.time,
                 on_fail: Callable[[str, str, str], None] | None = None, conn: sqlite3.Connection | None = None) -> None:
        from kubernetes import client

        self.client = client
        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.command = command
        self.image = image
        self.ns = namespace
        self.time_limit_min = time_limit_min
        self.clock = clock
        self.on_fail = on_fail
        self.conn = conn
        if conn is not None:
            conn.executescript(SCHEMA)

    def check(self, node: str, host: str) -> tuple[bool, str]:
        from kubernetes.client.rest import ApiException

        assert self.conn is not None
        row = self.conn.execute("SELECT job_id FROM verifications WHERE node=?", (node,)).fetchone()
        try:
            if row is None:
                return False, self._start(node, host)
            name = row[0]
            job = self.batch.read_namespaced_job(name, self.ns)
        except ApiException as exc:
            raise SchedulerError(f"kubernetes verification on {node}: HTTP {exc.status} {exc.reason}") from None
        st = job.status
        if not (st and (st.succeeded or st.failed)):
            return False, f"verification job {self.ns}/{name} on {node} is running"
        log = self._log(name)
        self.conn.execute("DELETE FROM verifications WHERE node=?", (node,))
        try:
            self.batch.delete_namespaced_job(name, self.ns, propagation_policy="Background")
        except ApiException:
            pass
        if st.succeeded:
            return True, f"verification job {self.ns}/{name} passed on {node}: {log[-500:]}"
        detail = f"verification job {self.ns}/{name} failed on {node}: {log[-3000:]}"
        if self.on_fail is not None:
            self.on_fail(node, host, detail)
        return False, detail

    def _start(self, node: str, host: str) -> str:
        c = self.client
        assert self.conn is not None
        name = f"fleethealth-verify-{node}"[:52] + f"-{int(self.clock()) % 100000}"
        body = c.V1Job(
            metadata=c.V1ObjectMeta(name=name, namespace=self.ns, labels={"app.kubernetes.io/part-of": "fleethealth",
                                                                         "fleethealth.io/verify": node}),
            spec=c.V1JobSpec(backoff_limit=0, active_deadline_seconds=self.time_limit_min * 60,
                             template=c.V1PodTemplateSpec(
                                 metadata=c.V1ObjectMeta(labels={"fleethealth.io/verify": node}),
                                 spec=c.V1PodSpec(node_name=node, restart_policy="Never",
                                                  tolerations=[c.V1Toleration(operator="Exists")],
                                                  containers=[c.V1Container(name="verify", image=self.image,
                                                                            command=["/bin/sh", "-c", self.command])]))))
        self.batch.create_namespaced_job(self.ns, body)
        self.conn.execute("INSERT OR REPLACE INTO verifications VALUES (?,?,?,?,?,?,?)",
                          (node, host, "", "", name, "", self.clock()))
        return f"verification job {self.ns}/{name} created on {node}: {self.command}"

    def _log(self, name: str) -> str:
        try:
            pods = self.core.list_namespaced_pod(self.ns, label_selector=f"job-name={name}")
            if not pods.items:
                return "(no pod)"
            meta = pods.items[0].metadata
            pod = str(meta.name) if meta is not None else ""
            return str(self.core.read_namespaced_pod_log(pod, self.ns))[-8000:] or "(no output)"
        except Exception as exc:  # the log is evidence, not the verdict
            return f"(log unavailable: {type(exc).__name__})"
