"""Job-aware drains on the real slurmctld: a fatal fault on the node with a running batch job
requeues the job and downs the node; a predictive one lets the job run until the deadline.
The node is the machine's own slurmd (the only one that runs jobs); it is resumed afterwards and
the drill's jobs cancelled. Skipped when another job runs there (it is shared)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from remediation.jobs import parse_squeue, urgency_of
from remediation.settings import AllSettings, GuardSettings, JobSettings
from remediation.slurm import SlurmScheduler
from tests.remediation.helpers import Clock, incident, make_worker
from tests.remediation.slurm_util import restore, show

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _sh(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=True).stdout


def _job(job_id: str) -> dict[str, str]:
    out = _sh("scontrol", "show", "job", "-o", job_id)
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def _wait(pred, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def busy_node(slurm_conf: str, slurm_local_node: str, tmp_path: Path):
    node = slurm_local_node
    others = parse_squeue(_sh("squeue", "-h", "-w", node, "-o", "%i|%u|%T|%j"))
    if others or show(node).drained:
        pytest.skip(f"{node} is in use by someone else ({others or show(node).state}); the drill would disturb it")
    out = _sh("sbatch", "--parsable", "-w", node, "-J", "fleetops-requeue-drill", "-o", str(tmp_path / "job.out"),
              "--requeue", "--wrap", "sleep 600")
    job = out.strip().split(";")[0]
    try:
        _wait(lambda: _job(job).get("JobState") == "RUNNING", f"job {job} to run on {node}")
        yield node, job
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)
        restore(node)
        _wait(lambda: not show(node).drained, f"{node} to be resumed", 60)


def test_parse_squeue_and_urgency() -> None:
    assert parse_squeue("12|alice|RUNNING|train\nbad line\n13|bob|COMPLETING|x|y\n") == [
        parse_squeue("12|alice|RUNNING|train")[0], parse_squeue("13|bob|COMPLETING|x|y")[0]]
    assert parse_squeue("13|bob|COMPLETING|x|y")[0].name == "x|y"
    assert urgency_of("critical", None) == "fatal" and urgency_of("minor", None) == "predictive"
    assert urgency_of("critical", "predictive") == "predictive"


def test_fatal_fault_requeues_the_running_job_and_downs_the_node(tmp_path: Path, busy_node) -> None:
    node, job = busy_node
    s = AllSettings(guards=GuardSettings(max_drain_fraction=0.5))
    clock = Clock()
    w = make_worker(tmp_path, s, scheduler=SlurmScheduler(s.slurm), clock=clock)
    inc = incident(node, "gpu_fell_off_bus", now=clock.t)
    recs = w.handle(inc)
    steps = [(r.details.get("step", "drain"), r.outcome, r.details.get("job") or r.details.get("node"))
             for r in recs if r.kind == "drain"]
    assert steps[0] == ("drain", "done", node), steps
    assert ("requeue", "done", job) in steps
    assert steps[-1] == ("down", "done", node)
    st = show(node)
    # DOWN took (the record is done); this test cluster's ReturnToService=2 lets a node whose slurmd
    # answers come back from DOWN at its next registration, keeping the DRAIN: it stays out of work.
    assert st.drained and st.ours and st.drained_for(inc.id), st
    info = _job(job)
    assert info["JobState"] in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING"), info["JobState"]
    assert int(info.get("Restarts", "0")) == 1
    # the job id is in the ticket's evidence
    t = w.tickets.open_for(node, inc.component)
    assert t is not None and any(re.search(rf"\b{job}\b", e["fact"]) for e in t.evidence), t.evidence
    # exactly once: the same incident again requeues nothing more
    again = w.handle(inc)
    assert not [r for r in again if r.details.get("step") == "requeue"]
    assert int(_job(job).get("Restarts", "0")) == 1


def test_predictive_fault_lets_the_job_run_until_the_deadline(tmp_path: Path, busy_node) -> None:
    node, job = busy_node
    s = AllSettings(guards=GuardSettings(max_drain_fraction=0.5), jobs=JobSettings(deadline_s=600))
    clock = Clock()
    w = make_worker(tmp_path, s, scheduler=SlurmScheduler(s.slurm), clock=clock)
    inc = incident(node, "pcie_link_degraded", now=clock.t, severity="major", component="0000:3b:00.0")
    recs = w.handle(inc)
    steps = [(r.details.get("step", "drain"), r.outcome) for r in recs if r.kind == "drain"]
    assert steps == [("drain", "done"), ("deadline", "done")], steps
    assert _job(job)["JobState"] == "RUNNING" and "DOWN" not in show(node).state
    assert w.tick() == [] or not [r for r in w.tick() if r.details.get("step") == "requeue"]
    assert _job(job)["JobState"] == "RUNNING"
    clock.t += 601  # the deadline passes with the job still running: it is requeued
    recs = w.tick()
    assert [(r.details.get("step"), r.outcome, r.details.get("job")) for r in recs if r.kind == "drain"] == [
        ("requeue", "done", job)]
    assert int(_job(job).get("Restarts", "0")) == 1
