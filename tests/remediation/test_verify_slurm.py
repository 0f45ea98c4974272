"""Return to service on the real slurmctld: after repair, a verification job runs on the node itself
(in a maintenance reservation); the node resumes only when it passes, and a failure drains it again
and reopens the ticket with the job's output. The node is the machine's own slurmd (the only one
that runs jobs); skipped when someone else's job runs there, restored afterwards."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from remediation.jobs import parse_squeue
from remediation.settings import AllSettings, GuardSettings, HookSettings, RemediationSettings, VerifySettings
from remediation.slurm import SlurmScheduler
from remediation.verify import job_fields
from tests.remediation.helpers import Clock, incident, make_worker
from tests.remediation.slurm_util import restore, show

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _sh(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=True).stdout


@pytest.fixture
def node(slurm_conf: str, slurm_local_node: str):
    n = slurm_local_node
    if parse_squeue(_sh("squeue", "-h", "-w", n, "-o", "%i|%u|%T|%j")) or show(n).drained:
        pytest.skip(f"{n} is in use by someone else; the drill would disturb it")
    yield n
    subprocess.run(["scontrol", "delete", f"ReservationName=fleethealth-verify-{n}"], capture_output=True, timeout=30)
    restore(n)


def _repaired_and_resolved(w, clock, n: str):
    inc = incident(n, "gpu_fell_off_bus", now=clock.t)
    w.handle(inc)
    assert show(n).drained_for(inc.id)
    clock.t += 5
    w.handle(incident(n, "gpu_fell_off_bus", now=clock.t, id=inc.id, state="resolved"))
    t = w.tickets.open_for(n, inc.component)
    with w.store.tx():
        w.tickets.set_state(t.id, "repaired", clock.t, note="GPU reseated")
    return inc, t


def _until(w, clock, pred, what: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    recs = []
    while time.monotonic() < deadline:
        clock.t += 11  # past post_repair_retry_s
        recs += w.tick()
        if pred(recs):
            return recs
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {[(r.kind, r.outcome, r.reason[:80]) for r in recs]}")


def _worker(tmp_path: Path, command: str):
    s = AllSettings(guards=GuardSettings(max_drain_fraction=0.5),
                    remediation=RemediationSettings(hooks=HookSettings(post_repair_retry_s=10.0)),
                    verify=VerifySettings(command=command, time_limit_min=2, output_dir=str(tmp_path)))
    clock = Clock()
    return make_worker(tmp_path, s, scheduler=SlurmScheduler(s.slurm), clock=clock), clock


def test_passing_verification_resumes_the_node(tmp_path: Path, node: str) -> None:
    w, clock = _worker(tmp_path, "echo verify-ok on $(hostname -s); exit 0")
    inc, t = _repaired_and_resolved(w, clock, node)
    recs = w.tick()
    assert [(r.kind, r.outcome) for r in recs if r.kind == "resume"] == [("resume", "refused")]
    assert "submitted" in recs[-1].reason and show(node).drained is False, "resumed into the reservation"
    resv = _sh("scontrol", "show", "reservation", f"fleethealth-verify-{node}")
    assert f"Nodes={node}" in resv and "MAINT" in resv
    recs = _until(w, clock, lambda rs: any(r.kind == "resume" and r.outcome == "done" for r in rs), "the resume")
    assert not show(node).drained
    assert subprocess.run(["scontrol", "show", "reservation", f"fleethealth-verify-{node}"],
                          capture_output=True, text=True).returncode != 0, "reservation deleted"
    assert w.tickets.get(t.id).state == "repaired"


def test_failing_verification_keeps_it_drained_and_reopens_the_ticket(tmp_path: Path, node: str) -> None:
    w, clock = _worker(tmp_path, "echo nvlink 3 still down; exit 3")
    inc, t = _repaired_and_resolved(w, clock, node)
    w.tick()
    recs = _until(w, clock, lambda rs: any(r.kind == "resume" and "FAILED" in r.reason for r in rs), "the failure")
    st = show(node)
    assert st.drained and st.drained_for(inc.id), st
    t2 = w.tickets.get(t.id)
    assert t2.state == "open" and "nvlink 3 still down" in t2.evidence[-1]["fact"]
    assert not any(r.kind == "resume" and r.outcome == "done" for r in recs)
    # the reopened ticket keeps it drained on later ticks: no second verification job
    clock.t += 30
    assert not [r for r in w.tick() if r.kind == "resume"]


def test_job_fields() -> None:
    f = job_fields("JobId=12 JobName=fleethealth-verify JobState=COMPLETED ExitCode=0:0 StdOut=/tmp/x.out")
    assert f["JobState"] == "COMPLETED" and f["ExitCode"] == "0:0" and f["StdOut"] == "/tmp/x.out"
