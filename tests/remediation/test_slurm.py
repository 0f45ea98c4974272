"""Against the real slurmctld started by scripts/services.sh: drains show up in sinfo/scontrol with
the incident id in the reason, resume waits for repair + health, operator drains are left alone,
and the cluster cap holds when 30% of the cluster fails at once."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from remediation.settings import AllSettings, GuardSettings, HookSettings, RemediationSettings
from remediation.slurm import SlurmScheduler, parse_show_node
from tests.remediation.helpers import Clock, incident, kinds, make_worker
from tests.remediation.slurm_util import restore, show, sinfo_reason, wait_for_room

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
    wait_for_room()
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
def test_repair_without_the_episode_resolving_keeps_node_drained(tmp_path: Path, nodes: list[str]) -> None:
    node = "gpu-node-006"
    nodes.append(node)
    restore(node)
    w = make_worker(tmp_path, scheduler=SlurmScheduler())
    inc = incident(node, "pcie_fatal")
    w.handle(inc)
    [t] = w.tickets.list()
    with w.store.tx():
        w.tickets.set_state(t.id, "repaired", w.clock())
    assert w.tick() == [] and show(node).drained
    # a host-level "healthy" (or another episode resolving) does not stand in for this episode (F4)
    w.handle(incident(node, "healthy", component="host", severity="info"))
    other = incident(node, "host_unreachable", component="host")
    w.handle(other)
    w.handle(incident(node, "host_unreachable", component="host", id=other.id, state="resolved"))
    assert show(node).drained
    recs = w.handle(incident(node, "pcie_fatal", id=inc.id, state="resolved"))
    assert kinds(recs) == [("resume", "done")] and not show(node).drained


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
def test_unknown_node_is_refused(tmp_path: Path, slurm_conf: str) -> None:
    w = make_worker(tmp_path, scheduler=SlurmScheduler())
    [rec, _ticket] = w.handle(incident("gpu-node-999", "pcie_fatal"))
    assert (rec.kind, rec.outcome) == ("drain", "refused") and "not in the scheduler's node list" in rec.reason


def unavailable_now() -> list[str]:
    """Nodes of the shared test cluster that are drained/down now (other tests may hold some)."""
    return sorted(n for n, st in SlurmScheduler().inventory().items() if st.drained)


@pytest.mark.slurm
def test_inventory_lists_every_node_with_partitions(slurm_conf: str) -> None:
    inv = SlurmScheduler().inventory()
    assert {f"gpu-node-00{i}" for i in range(1, 9)} <= set(inv)
    assert all("gpu" in st.groups for st in inv.values())
    line = (FIXTURES / "scontrol_show_node.txt").read_text().splitlines()[0]
    rack = parse_show_node(line.replace("ActiveFeatures=gpu", "ActiveFeatures=gpu,rack_r07"), "gpu-node-001", "rack_")
    assert rack.rack == "r07"


@pytest.mark.slurm
def test_thirty_percent_of_cluster_failing_holds_the_cap(tmp_path: Path, nodes: list[str]) -> None:
    failing = ["gpu-node-001", "gpu-node-002", "gpu-node-003"]  # 3 of the 9-node cluster: the cap is 1
    nodes.extend(failing)
    restore(*failing)
    busy = unavailable_now()
    w = make_worker(tmp_path, AllSettings(guards=GuardSettings(max_drain_fraction=0.10)), scheduler=SlurmScheduler())
    size = len(SlurmScheduler().inventory())
    incs = [incident(n, "gpu_fell_off_bus") for n in failing]
    recs = [r for inc in incs for r in w.handle(inc)]
    drains = [(r.host, r.outcome) for r in recs if r.kind == "drain"]
    room = max(0, 1 - len(busy))  # another test may hold a node of the shared cluster
    assert drains == [(n, "done" if i < room else "queued") for i, n in enumerate(failing)]
    alerts = [r for r in recs if r.kind == "alert"]
    assert len(alerts) == 1 and f"of {size} nodes in cluster" in alerts[0].reason  # one alert per cap trip
    assert w.tick() == []  # still over the cap: nothing new, nothing drained
    if room == 0:
        return
    assert [show(n).drained for n in failing] == [True, False, False]
    assert len(w.store.queued("drain")) == 2
    # node 001's episode resolves, its ticket is repaired -> resumed -> the next queued drain goes through
    t = w.tickets.open_for("gpu-node-001", incs[0].component)
    assert t is not None
    with w.store.tx():
        w.tickets.set_state(t.id, "repaired", w.clock())
    w.handle(incident("gpu-node-001", "gpu_fell_off_bus", id=incs[0].id, state="resolved"))
    recs = w.tick()
    assert ("drain", "done") in kinds(recs)
    assert [show(n).drained for n in failing] == [False, True, False]


def _hook(tmp: Path, name: str, code: int = 0) -> tuple[list[str], Path]:
    out = tmp / f"{name}.calls"
    script = tmp / name
    script.write_text(f"#!{sys.executable}\nimport sys\nopen({str(out)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                      f"sys.stderr.write('hook says {code}')\nsys.exit({code})\n")
    script.chmod(0o755)
    return [str(script), "{node}", "{component}"], out


@pytest.mark.slurm
def test_reset_request_goes_to_the_hook_once_the_drain_is_in_place(tmp_path: Path, nodes: list[str]) -> None:
    node = "gpu-node-005"
    nodes.append(node)
    restore(node)
    argv, calls = _hook(tmp_path, "request-reset")
    s = AllSettings(remediation=RemediationSettings(hooks=HookSettings(reset_gpu=argv)))
    w = make_worker(tmp_path, s, scheduler=SlurmScheduler())
    inc = incident(node, "gpu_row_remap_pending", severity="major")
    if unavailable_now():
        pytest.skip("another test holds a node of the shared cluster: the cap (1 of 9) is taken")
    recs = w.handle(inc)
    assert kinds(recs) == [("drain", "done"), ("reset_gpu", "done")]
    assert calls.read_text() == f"{node} {inc.component}\n"
    assert w.handle(inc) == [] and calls.read_text().count("\n") == 1  # replay: not called twice


@pytest.mark.slurm
def test_failing_and_missing_hooks_are_recorded_with_their_words(tmp_path: Path, nodes: list[str]) -> None:
    node = "gpu-node-005"
    nodes.append(node)
    restore(node)
    argv, _ = _hook(tmp_path, "request-reboot", code=3)
    s = AllSettings(remediation=RemediationSettings(hooks=HookSettings(reboot=argv)))
    w = make_worker(tmp_path, s, scheduler=SlurmScheduler())
    if unavailable_now():
        pytest.skip("another test holds a node of the shared cluster: the cap (1 of 9) is taken")
    recs = w.handle(incident(node, "gpu_fell_off_bus", nvidia_bucket="RESTART_BM"))
    rb = next(r for r in recs if r.kind == "reboot_request")
    assert rb.outcome == "failed" and "exit 3" in rb.reason and "hook says 3" in rb.reason
    restore(node)
    w2 = make_worker(tmp_path / "b", scheduler=SlurmScheduler())
    recs = w2.handle(incident(node, "gpu_gsp_error"))
    r = next(r for r in recs if r.kind == "reset_gpu")
    assert r.outcome == "skipped" and "no operator hook" in r.reason


@pytest.mark.slurm
def test_post_repair_check_gates_the_resume(tmp_path: Path, nodes: list[str]) -> None:
    node = "gpu-node-004"
    nodes.append(node)
    restore(node)
    verdict = tmp_path / "verdict"
    verdict.write_text("1")
    check = [sys.executable, "-c", f"import sys; print('dcgmi diag -r 2 on', sys.argv[1]); "
             f"sys.exit(int(open({str(verdict)!r}).read()))", "{node}"]
    clock = Clock()
    s = AllSettings(remediation=RemediationSettings(hooks=HookSettings(post_repair_check=check)))
    w = make_worker(tmp_path, s, scheduler=SlurmScheduler(), clock=clock)
    if wait_for_room():
        pytest.skip("another test holds a node of the shared cluster: the cap (1 of 9) is taken")
    inc = incident(node, "gpu_gsp_error", now=clock.t)
    assert kinds(w.handle(inc))[0] == ("drain", "done")
    recs = w.handle(incident(node, "gpu_gsp_error", id=inc.id, state="resolved"))
    assert kinds(recs) == [("resume", "refused")] and "post-repair check failed" in recs[0].reason
    assert f"dcgmi diag -r 2 on {node}" in recs[0].reason and show(node).drained
    verdict.write_text("0")
    assert w.tick() == []  # a failed check is retried after post_repair_retry_s, not every tick
    clock.t += 601
    assert kinds(w.tick()) == [("resume", "done")] and not show(node).drained
