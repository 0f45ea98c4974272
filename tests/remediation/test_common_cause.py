"""Common-cause incidents: a leaf switch dying behind 30 of 100 hosts is one parent incident, one
alert and one ticket, with the hosts' drains held as the policy says; its resolution decides the
children again. Topology comes from the operator's file, never from a message's labels."""

from __future__ import annotations

from pathlib import Path

import pytest

from remediation.scheduler import expand_hostlist
from remediation.settings import AllSettings, CommonCauseSettings, GuardSettings
from remediation.topology import TopologyError, parse_slurm_topology, parse_topology_file
from tests.remediation.helpers import Clock, incident, make_worker
from tests.remediation.memory_scheduler import MemoryScheduler

HOSTS = expand_hostlist("gpu-node-[001-100]")
TOPOLOGY = """
version: 1
switch:
  leaf-a: "gpu-node-[001-032]"
  leaf-b: "gpu-node-[033-064]"
  leaf-c: "gpu-node-[065-100]"
rack: {r1: "gpu-node-[001-008]", r2: "gpu-node-[009-016]", r3: "gpu-node-[017-024]", r4: "gpu-node-[025-032]"}
pdu: {pdu-1: "gpu-node-[001-050]"}
"""


def worker(tmp: Path, clock: Clock, topology: str = TOPOLOGY, **cc):
    (tmp / "topology.yaml").write_text(topology)
    s = AllSettings(guards=GuardSettings(nodes=["gpu-node-[001-100]"]),
                    common_cause=CommonCauseSettings(topology=str(tmp / "topology.yaml"), **cc))
    racks = {h: f"r{(i // 8) + 1}" for i, h in enumerate(HOSTS)}
    sched = MemoryScheduler(HOSTS, racks)
    return make_worker(tmp, s, scheduler=sched, clock=clock), sched


def port_down(host: str, now: float, **kw):
    return incident(host, "net_link_down", now=now, component="mlx5_0/1", severity="critical", **kw)


def counts(w):
    c = w.store.conn
    alerts = c.execute("SELECT COUNT(*) FROM audit WHERE kind='alert'").fetchone()[0]
    tickets = c.execute("SELECT COUNT(*) FROM tickets").fetchone()[0]
    parents = c.execute("SELECT COUNT(*) FROM cc_parents").fetchone()[0]
    return parents, alerts, tickets


def test_leaf_switch_drill_30_of_100_hosts(tmp_path: Path) -> None:
    clock = Clock(1_800_000_000.0)
    w, sched = worker(tmp_path, clock)
    failing = HOSTS[:30]  # 30 of leaf-a's 32 hosts, across racks r1..r4
    incs = []
    for h in failing:
        clock.t += 0.2  # all within 6 s
        inc = port_down(h, clock.t, rack="forged-rack", cluster="forged")
        incs.append(inc)
        w.handle(inc)
    clock.t += 60
    w.tick()
    parents, alerts, tickets = counts(w)
    assert (parents, alerts, tickets) == (1, 1, 1)
    (pid, grp), = w.store.conn.execute("SELECT id, grp FROM cc_parents").fetchall()
    assert grp == "switch:leaf-a", "the shared part is the switch, not a rack or the PDU"
    t = w.store.conn.execute("SELECT host, component, priority, evidence FROM tickets").fetchone()
    assert (t[0], t[1], t[2]) == ("leaf-a", "switch:leaf-a", "high")
    assert "30 of 32 hosts on switch leaf-a" in t[3]
    assert sched.calls == [], "default policy holds every child's drain behind the parent"
    held = w.common_cause.children(pid)
    assert len(held) == 30 and {s for _, _, s in held} == {"held"}
    from prometheus_client import generate_latest

    m = generate_latest(w.metrics.registry).decode()
    assert 'fleethealth_remediation_common_cause_open{kind="switch"} 1.0' in m
    assert "fleethealth_remediation_common_cause_held 30.0" in m
    # replaying the whole burst changes nothing
    for inc in incs:
        w.handle(inc)
    w.tick()
    assert counts(w) == (1, 1, 1) and sched.calls == []


def test_the_switch_comes_back_and_nothing_was_drained(tmp_path: Path) -> None:
    clock = Clock(1_800_000_000.0)
    w, sched = worker(tmp_path, clock)
    incs = [port_down(h, clock.t) for h in HOSTS[:10]]
    for inc in incs:
        w.handle(inc)
    for inc in incs:
        clock.t += 1
        w.handle(port_down(inc.host, clock.t, id=inc.id, state="resolved"))
    state = w.store.conn.execute("SELECT state, reason FROM cc_parents").fetchone()
    assert state[0] == "resolved" and "recovered" in state[1]
    assert w.store.conn.execute("SELECT state FROM tickets").fetchone()[0] == "closed"
    assert sched.calls == []


def test_parent_ticket_closed_with_hosts_still_down_releases_them_through_the_guards(tmp_path: Path) -> None:
    clock = Clock(1_800_000_000.0)
    w, sched = worker(tmp_path, clock)
    incs = [port_down(h, clock.t) for h in HOSTS[:6]]
    for inc in incs:
        w.handle(inc)
    assert sched.calls == []
    tid = w.store.conn.execute("SELECT id FROM tickets").fetchone()[0]
    with w.store.tx():
        w.tickets.set_state(tid, "repaired", clock.t, note="switch replaced")
    clock.t += 5
    recs = w.tick()
    released = [r for r in recs if r.kind == "noop" and "released" in r.reason]
    assert len(released) == 6
    drains = [r for r in recs if r.kind == "drain"]
    # decided on their own now: the rack cap (2 of rack r1) drains two and queues the rest
    assert {r.outcome for r in drains} <= {"done", "queued"} and sum(r.outcome == "done" for r in drains) >= 1
    assert len(sched.calls) == sum(r.outcome == "done" for r in drains)
    # the released hosts do not form a new parent from the same sightings
    clock.t += 1
    w.handle(port_down(HOSTS[7], clock.t))
    assert w.store.conn.execute("SELECT COUNT(*) FROM cc_parents WHERE state='open'").fetchone()[0] == 0


def test_one_host_alone_waits_settle_s_then_is_drained_as_usual(tmp_path: Path) -> None:
    clock = Clock(1_800_000_000.0)
    w, sched = worker(tmp_path, clock)
    recs = w.handle(port_down(HOSTS[40], clock.t))
    assert [(r.kind, r.outcome) for r in recs] == [("queued", "queued")]
    assert sched.calls == []
    clock.t += 10
    assert w.tick() == [] and sched.calls == []
    clock.t += 25
    recs = w.tick()
    assert ("drain", "done") in [(r.kind, r.outcome) for r in recs] and sched.calls == [("drain", HOSTS[40])]
    assert counts(w) == (0, 0, 1)


def test_two_hosts_are_below_the_threshold(tmp_path: Path) -> None:
    clock = Clock(1_800_000_000.0)
    w, sched = worker(tmp_path, clock)
    w.handle(port_down(HOSTS[0], clock.t))
    w.handle(port_down(HOSTS[1], clock.t))
    clock.t += 31
    w.tick()
    assert counts(w)[0] == 0 and len(sched.calls) == 2


def test_mode_a_part_cannot_explain_is_never_held(tmp_path: Path) -> None:
    """A DRAM UCE on 10 hosts of one switch is 10 GPUs, not the switch: decided at once."""
    clock = Clock(1_800_000_000.0)
    w, sched = worker(tmp_path, clock)
    for h in HOSTS[:10]:
        w.handle(incident(h, "gpu_dram_uce", now=clock.t))
    assert counts(w)[0] == 0
    assert not w.store.conn.execute("SELECT COUNT(*) FROM cc_sightings").fetchone()[0]


def test_without_topology_nothing_changes(tmp_path: Path) -> None:
    s = AllSettings(guards=GuardSettings(nodes=["gpu-node-[001-100]"]))
    w = make_worker(tmp_path, s, scheduler=MemoryScheduler(HOSTS))
    assert w.common_cause is None
    recs = w.handle(port_down(HOSTS[0], 1_800_000_000.0))
    assert ("drain", "done") in [(r.kind, r.outcome) for r in recs]


def test_policy_can_drain_children_anyway(tmp_path: Path) -> None:
    """'policy decides': a site whose policy drains common-cause children gets the drains (guards apply)."""
    from remediation.policy import parse_policy

    policy = parse_policy("""
version: 1
rules:
  - {name: parent, match: {common_cause: parent}, actions: [ticket, alert]}
  - {name: child, match: {common_cause: child}, actions: [drain]}
  - {name: other, match: {failure_mode: net_link_down}, actions: [drain, ticket]}
""", "site.yaml")
    clock = Clock(1_800_000_000.0)
    (tmp_path / "topology.yaml").write_text(TOPOLOGY)
    s = AllSettings(guards=GuardSettings(nodes=["gpu-node-[001-100]"]),
                    common_cause=CommonCauseSettings(topology=str(tmp_path / "topology.yaml")))
    sched = MemoryScheduler(HOSTS)
    w = make_worker(tmp_path, s, scheduler=sched, clock=clock, policy=policy)
    for h in HOSTS[:5]:
        w.handle(port_down(h, clock.t))
    assert counts(w)[:2] == (1, 1)
    assert len(sched.calls) >= 1  # drained up to the caps


def test_topology_file_errors_name_the_file() -> None:
    with pytest.raises(TopologyError, match="topo.yaml: unknown part kind 'row'"):
        parse_topology_file("version: 1\nrow: {a: x}\n", "topo.yaml")
    with pytest.raises(TopologyError, match="switch.leaf: bad host list"):
        parse_topology_file("version: 1\nswitch: {leaf: 'n[1-'}\n", "topo.yaml")
    with pytest.raises(TopologyError, match="version: 1"):
        parse_topology_file("switch: {}\n", "topo.yaml")


def test_slurm_topology_leaf_switches() -> None:
    text = ("SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=gpu-node-[001-004]\n"
            "SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=gpu-node-[005-008]\n"
            "SwitchName=spine Level=1 LinkSpeed=1 Nodes=gpu-node-[001-008] Switches=leaf[1-2]\n")
    topo = parse_slurm_topology(text)
    assert sorted(topo.groups) == ["switch:leaf1", "switch:leaf2"]
    assert [g.key for g in topo.of_host("gpu-node-006")] == ["switch:leaf2"]


# --------------------------------------------------------------------------- lemon hosts


def test_lemon_host_three_gpus_in_five_days_escalates(tmp_path: Path) -> None:
    """V9 of the review: GPU-A, then GPU-B 20 min later, then GPU-C 3 days later on one host. The
    third episode (2 earlier ones within 7 days, other components) escalates the host to RMA."""
    clock = Clock(1_800_000_000.0)
    s = AllSettings(guards=GuardSettings(nodes=["gpu-node-[001-100]"]))
    w = make_worker(tmp_path, s, scheduler=MemoryScheduler(HOSTS), clock=clock)
    day = 86400.0
    a = incident("gpu-node-007", "gpu_dram_uce", now=clock.t, component="GPU-a")
    w.handle(a)
    clock.t += 1200
    b = incident("gpu-node-007", "gpu_hw_error", now=clock.t, component="GPU-b")
    w.handle(b)
    rules = [r[0] for r in w.store.conn.execute("SELECT reason FROM audit WHERE incident_id IN (?,?)", (a.id, b.id))]
    assert not any("lemon" in r for r in rules), "two episodes are not a lemon yet"
    clock.t += 3 * day
    c = incident("gpu-node-007", "gpu_dram_uce", now=clock.t, component="GPU-c")
    recs = w.handle(c)
    assert any("lemon host" in r.reason for r in recs)
    t = w.tickets.open_for("gpu-node-007", "GPU-c")
    assert t is not None and t.priority == "rma"
    # a different host with one old episode is not a lemon
    clock.t += 1
    d = incident("gpu-node-008", "gpu_dram_uce", now=clock.t, component="GPU-d")
    assert not any("lemon" in r.reason for r in w.handle(d))


def test_lemon_window_and_app_errors(tmp_path: Path) -> None:
    clock = Clock(1_800_000_000.0)
    s = AllSettings(guards=GuardSettings(nodes=["gpu-node-[001-100]"]))
    w = make_worker(tmp_path, s, scheduler=MemoryScheduler(HOSTS), clock=clock)
    for i in range(3):  # application Xids are the job's, not the host's
        w.handle(incident("gpu-node-009", "app_error", now=clock.t + i, component=f"GPU-{i}", severity="info"))
    w.handle(incident("gpu-node-009", "gpu_hw_error", now=clock.t + 10, component="GPU-x"))
    clock.t += 8 * 86400  # older than the 7-day window
    recs = w.handle(incident("gpu-node-009", "gpu_hw_error", now=clock.t, component="GPU-y"))
    assert not any("lemon" in r.reason for r in recs)


def test_common_cause_children_do_not_make_a_lemon(tmp_path: Path) -> None:
    clock = Clock(1_800_000_000.0)
    w, _ = worker(tmp_path, clock)
    for _round in range(2):  # two switch outages: net_link_down held behind a parent each time
        incs = [port_down(h, clock.t) for h in HOSTS[:5]]
        for inc in incs:
            w.handle(inc)
        for inc in incs:
            w.handle(port_down(inc.host, clock.t, id=inc.id, state="resolved"))
        clock.t += 3600
    recs = w.handle(incident(HOSTS[0], "gpu_hw_error", now=clock.t, component="GPU-z"))
    assert not any("lemon" in r.reason for r in recs)


def test_config_sections_are_checked_at_start_up(tmp_path: Path) -> None:
    from fleethealth.config import ConfigError, load_config
    from remediation.settings import load_settings

    good = tmp_path / "ok.toml"
    good.write_text(f'[common_cause]\ntopology = "{tmp_path / "topology.yaml"}"\nmin_hosts = 4\n'
                    '[jobs]\ndeadline_s = 7200\n[verify]\ncommand = "dcgmi diag -r 2"\n')
    s = load_settings(load_config(good))
    assert (s.common_cause.min_hosts, s.jobs.deadline_s, s.verify.command) == (4, 7200.0, "dcgmi diag -r 2")
    bad = tmp_path / "bad.toml"
    bad.write_text("[common_cause]\nmin_hosts = 1\n")
    with pytest.raises(ConfigError, match=r"bad.toml: \[common_cause\].min_hosts"):
        load_settings(load_config(bad))
    s = load_settings(load_config(good))
    with pytest.raises(TopologyError, match="cannot read the topology file"):
        make_worker(tmp_path, s)


# --------------------------------------------------------------------------- jobs on a queued drain


class _Jobs:
    """Job control as the Slurm one answers (the real one: tests/remediation/test_jobs_slurm.py)."""

    def __init__(self) -> None:
        from remediation.jobs import Job

        self.running = {h: [Job(f"{100 + i}", "alice", "RUNNING", "train")] for i, h in enumerate(HOSTS)}
        self.calls: list[tuple[str, str]] = []

    def on_node(self, node: str):
        return list(self.running.get(node, []))

    def requeue(self, job_id: str) -> None:
        self.calls.append(("requeue", job_id))

    def down(self, node: str, reason: str) -> None:
        self.calls.append(("down", node))


def test_a_drain_queued_behind_the_rack_cap_requeues_its_jobs_when_it_goes(tmp_path: Path) -> None:
    clock = Clock(1_800_000_000.0)
    s = AllSettings(guards=GuardSettings(nodes=["gpu-node-[001-100]"]))
    racks = {h: f"r{(i // 8) + 1}" for i, h in enumerate(HOSTS)}
    sched = MemoryScheduler(HOSTS, racks)
    w = make_worker(tmp_path, s, scheduler=sched, clock=clock)
    jobs = _Jobs()
    w.job_control.jobs = jobs  # type: ignore[assignment]
    incs = [incident(h, "gpu_fell_off_bus", now=clock.t) for h in HOSTS[:3]]  # rack r1: cap 2
    for inc in incs:
        w.handle(inc)
    assert jobs.calls == [("requeue", "100"), ("down", HOSTS[0]), ("requeue", "101"), ("down", HOSTS[1])]
    w.handle(incident(HOSTS[0], "gpu_fell_off_bus", now=clock.t, id=incs[0].id, state="resolved"))
    t = w.tickets.open_for(HOSTS[0], incs[0].component)
    with w.store.tx():
        w.tickets.set_state(t.id, "repaired", clock.t)
    clock.t += 5
    w.tick()  # host 1 resumes: room in the rack
    assert ("resume", HOSTS[0]) in sched.calls
    clock.t += 15
    w.tick()  # the queued drain of host 3 goes, and its job is requeued
    assert ("drain", HOSTS[2]) in sched.calls
    assert jobs.calls[-2:] == [("requeue", "102"), ("down", HOSTS[2])]
