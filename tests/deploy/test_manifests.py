"""deploy/: the Kubernetes manifests load through the official client's models without losing a
field, every container's arguments parse with fleethealth's own CLI, the scrape config finds every
metrics port, and the systemd units pass ``systemd-analyze verify``."""

from __future__ import annotations

import inspect
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from fleetcli.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
SYSTEMD = ROOT / "deploy" / "systemd"
KINDS = {  # apiVersion/kind -> the client's model
    ("v1", "Namespace"): "V1Namespace", ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "ServiceAccount"): "V1ServiceAccount", ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("v1", "Service"): "V1Service", ("apps/v1", "DaemonSet"): "V1DaemonSet", ("apps/v1", "Deployment"): "V1Deployment",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
}


class _Response:  # what older clients' ApiClient.deserialize reads: the body as .data
    def __init__(self, obj: dict[str, Any]) -> None:
        self.data = json.dumps(obj)


def _docs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path.name, doc))
    return out


def _model(doc: dict[str, Any]) -> Any:
    api = client.ApiClient()
    kind = KINDS[(doc["apiVersion"], doc["kind"])]
    if "response_text" in inspect.signature(api.deserialize).parameters:  # kubernetes >= 35
        return api.deserialize(json.dumps(doc), kind, "application/json")
    return api.deserialize(_Response(doc), kind)  # type: ignore[call-arg, arg-type]


def _strip_none(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_strip_none(v) for v in obj]
    return obj


def _normalise(obj: Any) -> Any:
    """YAML ints for quantities / int-or-string come back as they went in; compare as text."""
    if isinstance(obj, dict):
        return {k: _normalise(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_normalise(v) for v in obj]
    return str(obj)


DOCS = _docs()
IDS = [f"{name}:{d['kind']}/{d['metadata']['name']}" for name, d in DOCS]


def test_the_manifests_are_all_there() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in DOCS}
    assert ("DaemonSet", "fleethealth-collector") in kinds
    for svc in ("detect", "remediate", "fleet-metrics"):
        assert ("Deployment", f"fleethealth-{svc}") in kinds
    assert ("ConfigMap", "fleethealth-prometheus") in kinds and ("ConfigMap", "fleethealth-prometheus-rules") in kinds


@pytest.mark.parametrize(("name", "doc"), DOCS, ids=IDS)
def test_loads_through_the_official_models_without_losing_a_field(name: str, doc: dict[str, Any]) -> None:
    """The client's models drop keys they do not know; a typo (``volumeMount``, ``hostpath``)
    or a field at the wrong level shows up as a difference after the round trip."""
    model = _model(doc)
    assert type(model).__name__ == KINDS[(doc["apiVersion"], doc["kind"])]
    back = _strip_none(client.ApiClient().sanitize_for_serialization(model))
    assert _normalise(back) == _normalise(doc), f"{name}: fields lost in the round trip"


def test_a_typo_is_caught_by_the_round_trip() -> None:
    _, ds = next((n, d) for n, d in DOCS if d["kind"] == "DaemonSet")
    bad = json.loads(json.dumps(ds))
    c = bad["spec"]["template"]["spec"]["containers"][0]
    c["volumeMount"] = c.pop("volumeMounts")
    back = _strip_none(client.ApiClient().sanitize_for_serialization(_model(bad)))
    assert _normalise(back) != _normalise(bad)


def _workloads():
    for _, d in DOCS:
        if d["kind"] in ("DaemonSet", "Deployment"):
            yield d


@pytest.mark.parametrize("doc", list(_workloads()), ids=lambda d: d["metadata"]["name"])
def test_container_arguments_parse_with_the_cli(doc: dict[str, Any]) -> None:
    parser = build_parser()
    for c in doc["spec"]["template"]["spec"]["containers"]:
        args = parser.parse_args(c["args"])
        assert args.func, c["args"]
        ports = {p["containerPort"] for p in c.get("ports", []) if p.get("name") == "metrics"}
        served = getattr(args, "metrics_port", None) or getattr(args, "exporter_port", None)
        assert ports == {served}, f"{c['name']}: port named metrics {ports} but it serves {served}"
        addr = getattr(args, "metrics_addr", None) or getattr(args, "exporter_address", None)
        assert addr == "0.0.0.0", f"{c['name']}: a pod must listen beyond 127.0.0.1 to be scraped"


def test_collector_daemonset_has_what_the_collector_reads_and_no_more() -> None:
    ds = next(d for d in _workloads() if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    c = spec["containers"][0]
    args = build_parser().parse_args(c["args"])
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    host_paths = {m["mountPath"]: volumes[m["name"]]["hostPath"]["path"] for m in c["volumeMounts"]}
    assert host_paths[args.sysfs_root] == "/sys" and mounts[args.sysfs_root]["readOnly"]
    assert host_paths[args.proc_root] == "/proc" and mounts[args.proc_root]["readOnly"]
    assert host_paths[args.kmsg_file] == "/dev/kmsg"
    assert volumes[mounts[args.kmsg_file]["name"]]["hostPath"]["type"] == "CharDevice"
    assert host_paths[args.state_dir] == "/var/lib/fleethealth" and not mounts[args.state_dir].get("readOnly")
    sec = c["securityContext"]
    assert sec["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}, "only /dev/kmsg needs a capability"
    assert not sec.get("privileged") and sec["allowPrivilegeEscalation"] is False and sec["readOnlyRootFilesystem"]
    assert "nvidia.com/gpu" not in json.dumps(c.get("resources", {})), "the collector must not take a GPU from jobs"
    assert {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"} in c["env"]
    host_env = next(e for e in c["env"] if e["name"] == "FLEETHEALTH_HOST")
    assert host_env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", "host name from the node, not the pod"
    assert {"operator": "Exists"} in spec["tolerations"], "keep collecting on drained (tainted) nodes"


def test_remediation_is_one_worker_with_the_rights_it_uses() -> None:
    dep = next(d for d in _workloads() if d["metadata"]["name"] == "fleethealth-remediate")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    role = next(d for _, d in DOCS if d["kind"] == "ClusterRole")
    verbs = {(r["apiGroups"][0], res): set(r["verbs"]) for r in role["rules"] for res in r["resources"]}
    assert "patch" in verbs[("", "nodes")] and "create" in verbs[("", "pods/eviction")]
    assert "delete" not in verbs[("", "pods")], "pods leave through the Eviction API (PDBs), never delete"
    binding = next(d for _, d in DOCS if d["kind"] == "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == dep["spec"]["template"]["spec"]["serviceAccountName"]


def test_scrape_config_keeps_every_metrics_port_and_sets_the_cluster() -> None:
    cm = next(d for _, d in DOCS if d["metadata"]["name"] == "fleethealth-prometheus")
    prom = yaml.safe_load(cm["data"]["prometheus.yml"])
    assert "/etc/prometheus/rules/*.yaml" in prom["rule_files"]
    for w in _workloads():
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert labels.get("fleethealth.io/scrape") == "true", w["metadata"]["name"]
        kept = []
        for job in prom["scrape_configs"]:
            ok = True
            for rc in job["relabel_configs"]:
                if rc.get("action") != "keep":
                    continue
                src = rc["source_labels"][0]
                value = {"__meta_kubernetes_pod_label_fleethealth_io_scrape": labels.get("fleethealth.io/scrape"),
                         "__meta_kubernetes_pod_label_app_kubernetes_io_name": labels["app.kubernetes.io/name"],
                         "__meta_kubernetes_pod_container_port_name": "metrics"}[src]
                ok &= bool(re.fullmatch(rc["regex"], value or ""))
            if ok:
                kept.append(job["job_name"])
        assert len(kept) == 1, f"{w['metadata']['name']} scraped by {kept}"
    for job in prom["scrape_configs"]:
        assert any(rc.get("target_label") == "cluster" for rc in job["relabel_configs"]), job["job_name"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing")
def test_scrape_config_passes_promtool(tmp_path: Path) -> None:
    cm = next(d for _, d in DOCS if d["metadata"]["name"] == "fleethealth-prometheus")
    rules_cm = next(d for _, d in DOCS if d["metadata"]["name"] == "fleethealth-prometheus-rules")
    (tmp_path / "rules").mkdir()
    for key, text in rules_cm["data"].items():
        (tmp_path / "rules" / key).write_text(text)
    cfg = yaml.safe_load(cm["data"]["prometheus.yml"].replace("/etc/prometheus/rules/", f"{tmp_path}/rules/"))
    # Debian's Prometheus is built without Kubernetes service discovery (promtool refuses the key):
    # check the relabelling, intervals and rule files with a static target in its place.
    for job in cfg["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs")[0]["role"] == "pod"
        job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    r = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


# --------------------------------------------------------------------------- systemd


UNITS = sorted(SYSTEMD.glob("*.service"))


def test_a_unit_for_every_service() -> None:
    names = {u.stem for u in UNITS}
    assert {"fleethealth-collector", "fleethealth-detect", "fleethealth-remediate",
            "fleethealth-fleet-metrics"} <= names


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_unit_command_parses_with_the_cli(unit: Path) -> None:
    text = unit.read_text().replace("\\\n", " ")
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    argv = exec_start.split("=", 1)[1].split()[1:]
    assert build_parser().parse_args(argv).func


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    exe = shutil.which("fleethealth") or str(Path(__import__("sys").executable).with_name("fleethealth"))
    copies = []
    for unit in UNITS:
        dst = tmp_path / unit.name
        dst.write_text(unit.read_text().replace("/opt/fleethealth/.venv/bin/fleethealth", exe))
        copies.append(str(dst))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", *copies], capture_output=True, text=True, timeout=120)
    problems = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert r.returncode == 0 and not problems, "\n".join(problems)


def test_the_shipped_remediation_config_loads(tmp_path: Path) -> None:
    from fleethealth.config import load_config
    from remediation.settings import load_settings

    cm = next(d for _, d in DOCS if d["metadata"]["name"] == "fleethealth-config")
    (tmp_path / "fleethealth.toml").write_text(cm["data"]["fleethealth.toml"])
    s = load_settings(load_config(tmp_path / "fleethealth.toml"))
    assert s.remediation.scheduler == "kubernetes" and s.remediation.dry_run is True
