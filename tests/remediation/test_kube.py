"""The Kubernetes adapter with the official client against tests/remediation/fake_kube.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client import generate_latest

from remediation.kube import TAINT_KEY, KubernetesScheduler
from remediation.scheduler import NodeNotFound
from remediation.settings import AllSettings, GuardSettings, KubeSettings
from tests.remediation.fake_kube import FakeKube
from tests.remediation.helpers import incident, make_worker


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    k = FakeKube()
    for i in range(1, 5):
        k.add_node(f"gpu-node-00{i}", {"example.com/pool": "a" if i < 3 else "b", "example.com/rack": f"r{i % 2}"})
    k.add_pod("train", "job-0", "gpu-node-001", {"app": "job"})
    k.add_pod("web", "api-0", "gpu-node-001", {"app": "api"})
    k.add_pod("web", "api-1", "gpu-node-002", {"app": "api"})
    k.add_pod("kube-system", "dcgm-exporter-x", "gpu-node-001", {"app": "dcgm"}, owner_kind="DaemonSet")
    k.add_pdb("web", {"app": "api"}, min_available=2)
    yield k
    k.close()


def sched(k: FakeKube, **kw: str) -> KubernetesScheduler:
    cfg = client.Configuration()
    cfg.host = k.url
    return KubernetesScheduler(KubeSettings(**kw), api_client=client.ApiClient(cfg))


def worker(tmp: Path, k: FakeKube):  # type: ignore[no-untyped-def]
    return make_worker(tmp, AllSettings(), scheduler=sched(k))


def test_cordon_taint_evict_and_pdb_429_is_queued_then_retried(tmp_path: Path, kube: FakeKube) -> None:
    w = worker(tmp_path, kube)
    inc = incident("gpu-node-001", "net_link_down")
    recs = w.handle(inc)
    node = kube.nodes["gpu-node-001"]
    assert node["spec"]["unschedulable"] is True
    assert {"key": TAINT_KEY, "value": "net_link_down", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert node["metadata"]["annotations"]["fleethealth.io/drain-reason"] == f"fleethealth:{inc.id} net_link_down"
    evict = {r.details["target"]: r.outcome for r in recs if r.details.get("step") == "evict"}
    assert evict == {"train/job-0": "done", "web/api-0": "queued"}
    queued = next(r for r in recs if r.details.get("target") == "web/api-0")
    assert "disruption budget" in queued.reason and "HTTP 429" in queued.reason
    assert ("kube-system", "dcgm-exporter-x") in kube.pods  # DaemonSet pods stay
    assert ("web", "api-0") in kube.pods and ("train", "job-0") not in kube.pods

    assert w.tick() == []  # still blocked by the PDB: stays queued, no new record
    m = generate_latest(w.metrics.registry).decode()
    assert "fleethealth_remediation_drained_nodes 1.0" in m and "fleethealth_remediation_queued_actions 1.0" in m
    assert 'fleethealth_remediation_actions_total{kind="drain",outcome="queued"} 1.0' in m
    assert 'fleethealth_tickets_open{age_bucket="lt_1d"} 1.0' in m
    kube.add_pod("web", "api-2", "gpu-node-003", {"app": "api"})  # replacement scheduled elsewhere
    recs = w.tick()
    assert [(r.details["target"], r.outcome) for r in recs] == [("web/api-0", "done")]
    assert ("web", "api-0") not in kube.pods and w.store.queued() == []


def test_uncordon_and_untaint_on_repair(tmp_path: Path, kube: FakeKube) -> None:
    kube.nodes["gpu-node-002"]["spec"]["taints"] = [{"key": "nvidia.com/gpu", "value": "x", "effect": "NoSchedule"}]
    w = worker(tmp_path, kube)
    inc = incident("gpu-node-002", "pcie_fatal")
    w.handle(inc)
    assert kube.nodes["gpu-node-002"]["spec"]["unschedulable"] is True
    [t] = w.tickets.list()
    with w.store.tx():
        w.tickets.set_state(t.id, "repaired", w.clock())
    w.handle(incident("gpu-node-002", "pcie_fatal", id=inc.id, state="resolved", update_seq=1))
    node = kube.nodes["gpu-node-002"]
    assert node["spec"]["unschedulable"] is False
    assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "x", "effect": "NoSchedule"}]
    assert "fleethealth.io/drain-reason" not in node["metadata"]["annotations"]


def test_unknown_node_404_is_refused_with_the_apis_words(tmp_path: Path, kube: FakeKube) -> None:
    with pytest.raises(NodeNotFound, match='HTTP 404 NotFound: nodes "ghost" not found'):
        sched(kube).node_state("ghost")
    w = worker(tmp_path, kube)
    rec = w.handle(incident("ghost", "pcie_fatal"))[0]
    assert (rec.kind, rec.outcome) == ("drain", "refused") and 'nodes "ghost" not found' in rec.reason
    assert rec.details["guard"] == "inventory"


def test_operator_cordon_is_left_alone(tmp_path: Path, kube: FakeKube) -> None:
    kube.nodes["gpu-node-003"]["spec"]["unschedulable"] = True  # kubectl cordon by a person
    w = worker(tmp_path, kube)
    rec = w.handle(incident("gpu-node-003", "pcie_fatal"))[0]
    assert rec.outcome == "refused" and "operator drain" in rec.reason
    assert "taints" not in kube.nodes["gpu-node-003"]["spec"]


def test_inventory_groups_and_racks_from_node_labels(kube: FakeKube) -> None:
    inv = sched(kube, group_label="example.com/pool", rack_label="example.com/rack").inventory()
    assert sorted(inv) == [f"gpu-node-00{i}" for i in range(1, 5)]
    assert [(inv[n].groups, inv[n].rack) for n in sorted(inv)] == [(("a",), "r1"), (("a",), "r0"), (("b",), "r1"),
                                                                   (("b",), "r0")]
    assert sched(kube).inventory()["gpu-node-001"].groups == ()  # no label configured: no group


def test_cap_per_node_group_counts_cordoned_nodes_of_that_group(tmp_path: Path, kube: FakeKube) -> None:
    kube.nodes["gpu-node-001"]["spec"]["unschedulable"] = True  # pool a: 1 of 2 unavailable already
    s = AllSettings(guards=GuardSettings(cap_scope="group"))
    w = make_worker(tmp_path, s, scheduler=sched(kube, group_label="example.com/pool"))
    a = w.handle(incident("gpu-node-002", "pcie_fatal", cluster="pool-b-forged"))[0]
    assert (a.outcome, a.details["guard"]) == ("queued", "group_cap") and "group 'a'" in a.reason
    b = w.handle(incident("gpu-node-003", "pcie_fatal"))[0]  # pool b has room
    assert (b.kind, b.outcome) == ("drain", "done")


def test_wait_for_completion_mode_evicts_only_what_outlives_the_deadline(tmp_path: Path, kube: FakeKube) -> None:
    s = sched(kube, drain_mode="wait", wait_deadline_s=600)
    t = [1_800_000_000.0]
    s.clock = lambda: t[0]
    w = make_worker(tmp_path, AllSettings(), scheduler=s)
    recs = w.handle(incident("gpu-node-001", "net_link_down"))
    node = kube.nodes["gpu-node-001"]
    assert node["spec"]["unschedulable"] is True, "cordoned at once"
    assert {(r.details.get("target"), r.outcome) for r in recs if r.details.get("step") == "wait"} == {
        ("train/job-0", "queued"), ("web/api-0", "queued")}
    assert ("train", "job-0") in kube.pods and ("web", "api-0") in kube.pods, "nothing evicted yet"
    assert {q.payload["target"] for q in w.store.queued("wait")} == {"train/job-0", "web/api-0"}
    # job-0 finishes on its own: done, never evicted
    kube.pods[("train", "job-0")]["status"]["phase"] = "Succeeded"
    w.tick()
    assert {q.payload["target"] for q in w.store.queued("wait")} == {"web/api-0"}
    assert ("train", "job-0") in kube.pods
    # past the deadline the pod still running is evicted (through the Eviction API: the PDB holds it)
    t[0] += 601
    w.tick()
    assert ("POST", "/api/v1/namespaces/web/pods/api-0/eviction") in kube.requests
    assert ("web", "api-0") in kube.pods and w.store.queued("wait"), "the PDB still protects api-0"


def _verify_worker(tmp_path: Path, kube: FakeKube):  # type: ignore[no-untyped-def]
    from remediation.settings import HookSettings, RemediationSettings, VerifySettings
    from tests.remediation.helpers import Clock

    clock = Clock()
    s = AllSettings(remediation=RemediationSettings(hooks=HookSettings(post_repair_retry_s=10.0)),
                    verify=VerifySettings(command="dcgmi diag -r 2", image="registry.local/dcgm:4", namespace="fh"))
    w = make_worker(tmp_path, s, scheduler=sched(kube), clock=clock)
    inc = incident("gpu-node-003", "gpu_fell_off_bus", now=clock.t)
    w.handle(inc)
    clock.t += 5
    w.handle(incident("gpu-node-003", "gpu_fell_off_bus", now=clock.t, id=inc.id, state="resolved"))
    t = w.tickets.open_for("gpu-node-003", inc.component)
    with w.store.tx():
        w.tickets.set_state(t.id, "repaired", clock.t)
    recs = w.tick()
    assert [(r.kind, r.outcome) for r in recs if r.kind == "resume"] == [("resume", "refused")]
    (ns, name), = kube.jobs
    spec = kube.jobs[(ns, name)]["spec"]["template"]["spec"]
    assert ns == "fh" and spec["nodeName"] == "gpu-node-003" and spec["restartPolicy"] == "Never"
    assert spec["containers"][0]["command"] == ["/bin/sh", "-c", "dcgmi diag -r 2"]
    assert {"operator": "Exists"} in spec["tolerations"], "it must run on the cordoned, tainted node"
    assert kube.nodes["gpu-node-003"]["spec"]["unschedulable"] is True, "stays cordoned while it runs"
    clock.t += 11
    assert not [r for r in w.tick() if r.kind == "resume" and r.outcome == "done"], "not before the Job ends"
    return w, clock, t, ns, name


def test_kubernetes_verification_job_passes_and_the_node_is_uncordoned(tmp_path: Path, kube: FakeKube) -> None:
    w, clock, t, ns, name = _verify_worker(tmp_path, kube)
    kube.finish_job(ns, name, succeeded=True, log="Diagnostic: Pass")
    clock.t += 11
    recs = w.tick()
    assert ("resume", "done") in [(r.kind, r.outcome) for r in recs]
    assert not kube.nodes["gpu-node-003"]["spec"].get("unschedulable")
    assert (ns, name) not in kube.jobs, "the Job is deleted"


def test_kubernetes_verification_job_fails_and_reopens_the_ticket(tmp_path: Path, kube: FakeKube) -> None:
    w, clock, t, ns, name = _verify_worker(tmp_path, kube)
    kube.finish_job(ns, name, succeeded=False, log="Memory: Fail - GPU 3 DBE")
    clock.t += 11
    recs = w.tick()
    assert not [r for r in recs if r.kind == "resume" and r.outcome == "done"]
    assert kube.nodes["gpu-node-003"]["spec"]["unschedulable"] is True
    t2 = w.tickets.get(t.id)
    assert t2.state == "open" and "GPU 3 DBE" in t2.evidence[-1]["fact"]


def test_count_drained_fleethealth_leaves_operator_cordons_out_of_the_cap(tmp_path: Path, kube: FakeKube) -> None:
    kube.nodes["gpu-node-004"]["spec"]["unschedulable"] = True  # a person's cordon: 1 of 4, the whole cap
    w = make_worker(tmp_path, AllSettings(), scheduler=sched(kube))
    held = w.handle(incident("gpu-node-002", "pcie_fatal"))[0]
    assert (held.outcome, held.details["guard"]) == ("queued", "cluster_cap")
    w2 = make_worker(tmp_path / "b", AllSettings(guards=GuardSettings(count_drained="fleethealth")),
                     scheduler=sched(kube))
    assert w2.handle(incident("gpu-node-003", "pcie_fatal"))[0].outcome == "done"
