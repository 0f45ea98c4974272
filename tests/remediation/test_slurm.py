"""Against the real slurmctld started by scripts/services.sh: drains show up in sinfo/scontrol with
the incident id in the reason, resume waits for repair + health, operator drains are left alone,
and the cluster cap holds when 30% of the cluster fails at once."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from remediation.settings import AllSettings, GuardSettings
from remediation.slurm import SlurmScheduler, parse_show_node
from tests.remediation.helpers import incident, kinds, make_worker
from tests.remediation.slurm_util import restore, show, sinfo_reason

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "remediation"


def test_parse_show_node_captured_lines() -> None:
    lines = (FIXTURES / "scontrol_show_node.txt").read_text().splitlines()
    idle = parse_show_node(lines[0], "gpu-node-001")
    assert (idle.state, idle.drained, idle.reason) == ("IDLE", False, "")
    ours = parse_show_node(lines[1], "gpu-node-001")
    assert ours.drained and ours.reason == "fleethealth:inc-1 gpu_dram_uce" and ours.drained_for("inc-1")
    op = parse_show_node(lines[2], "gpu-node-004")
    assert op.drained and not op.ours and op.reason == "operator: fan replaced, burn-in"
    down = parse_show_node(lines[3], "gpu-node-007")
    assert down.drained and down.state == "DOWN+DRAIN+NOT_RESPONDING" and down.reason == "Not responding"


@pytest.fixture
def nodes(slurm_conf: str) -> Iterator[list[str]]:
    used: list[str] = []
    yield used
    restore(*used)


@pytest.mark.slurm
def test_drain_names_incident_and_resume_waits_for_repair_and_health(tmp_path: Path, nodes: list[str]) -> None:
    node = "gpu-node-005"
    nodes.append(node)
    restore(node)
    w = make_worker(tmp_path, scheduler=SlurmScheduler())
    inc = incident(node, "gpu_fell_off_bus")
    recs = w.handle(inc)
    assert kinds(recs) == [("drain", "done"), ("ticket_opened", "done")]
    st = show(node)
    assert st.drained and st.reason == f"fleethealth:{inc.id} gpu_fell_off_bus"
    assert f"fleethealth:{inc.id} gpu_fell_off_bus" in sinfo_reason(node)
    assert w.handle(inc) == []  # replay: no second drain, no second ticket

    [t] = w.tickets.list()
    w.handle(incident(node, "gpu_fell_off_bus", id=inc.id, state="resolved", update_seq=2))
    assert show(node).drained, "healthy but ticket still open: stays drained"
    with w.store.tx():
        w.tickets.set_state(t.id, "repaired", w.clock())
    recs = w.tick()
    assert kinds(recs) == [("resume", "done")]
    assert not show(node).drained
    assert w.store.active_drains() == []


@pytest.mark.slurm
def test_repair_without_health_signal_keeps_node_drained(tmp_path: Path, nodes: list[str]) -> None:
    node = "gpu-node-006"
    nodes.append(node)
    restore(node)
    w = make_worker(tmp_path, scheduler=SlurmScheduler())
    w.handle(incident(node, "pcie_fatal"))
    [t] = w.tickets.list()
    with w.store.tx():
        w.tickets.set_state(t.id, "repaired", w.clock())
    assert w.tick() == [] and show(node).drained
    w.handle(incident(node, "healthy", component="host", severity="info"))
    assert not show(node).drained


@pytest.mark.slurm
def test_operator_drain_is_left_alone(tmp_path: Path, nodes: list[str]) -> None:
    node = "gpu-node-004"
    nodes.append(node)
    restore(node)
    subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=operator: fan replaced, burn-in"],
                   check=True, timeout=15)
    w = make_worker(tmp_path, scheduler=SlurmScheduler())
    recs = w.handle(incident(node, "net_link_down"))
    assert recs[0].kind == "drain" and recs[0].outcome == "refused"
    assert recs[0].reason.startswith("refused: operator drain")
    assert show(node).reason == "operator: fan replaced, burn-in"
    assert w.store.active_drains() == []


@pytest.mark.slurm
def test_unknown_node_is_a_clear_failure(tmp_path: Path, slurm_conf: str) -> None:
    w = make_worker(tmp_path, scheduler=SlurmScheduler())
    [rec, _ticket] = w.handle(incident("gpu-node-999", "pcie_fatal"))
    assert (rec.kind, rec.outcome) == ("drain", "failed") and "not found" in rec.reason


@pytest.mark.slurm
def test_thirty_percent_of_cluster_failing_holds_the_cap(tmp_path: Path, nodes: list[str]) -> None:
    failing = ["gpu-node-001", "gpu-node-002", "gpu-node-003"]  # 3 of a 10-node cluster = 30%
    nodes.extend(failing)
    restore(*failing)
    s = AllSettings(guards=GuardSettings(cluster_sizes={"default": 10}, max_drain_fraction=0.10))
    w = make_worker(tmp_path, s, scheduler=SlurmScheduler())
    incs = [incident(n, "gpu_fell_off_bus") for n in failing]
    recs = [r for inc in incs for r in w.handle(inc)]
    drains = [(r.host, r.outcome) for r in recs if r.kind == "drain"]
    assert drains == [("gpu-node-001", "done"), ("gpu-node-002", "queued"), ("gpu-node-003", "queued")]
    alerts = [r for r in recs if r.kind == "alert"]
    assert len(alerts) == 2 and all("cluster cap: 1 of 10 nodes" in a.reason for a in alerts)
    assert [show(n).drained for n in failing] == [True, False, False]
    assert w.tick() == []  # still over the cap: nothing new, nothing drained
    assert len(w.store.queued("drain")) == 2
    # node 001 repaired and healthy -> resumed -> the next queued drain goes through
    t = w.tickets.open_for("gpu-node-001", incs[0].component)
    assert t is not None
    with w.store.tx():
        w.tickets.set_state(t.id, "repaired", w.clock())
    w.handle(incident("gpu-node-001", "healthy", component="host", severity="info"))
    recs = w.tick()
    assert ("drain", "done") in kinds(recs)
    assert [show(n).drained for n in failing] == [False, True, False]
