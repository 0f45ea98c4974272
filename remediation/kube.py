"""Kubernetes through the official ``kubernetes`` client: cordon, taint, evict, uncordon.

Drain = set ``spec.unschedulable``, add the taint ``fleethealth.io/failure-mode=<mode>:NoSchedule``,
note the reason in the annotation ``fleethealth.io/drain-reason``, then evict the node's pods with
the policy/v1 Eviction subresource. An eviction the API answers with 429 (a PodDisruptionBudget
would be violated) is returned as :class:`Pending` for the worker to retry later; DaemonSet and
mirror pods are not evicted (as ``kubectl drain`` does not).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from kubernetes import client
from kubernetes import config as kubeconfig
from kubernetes.client.rest import ApiException

from remediation.scheduler import DrainResult, NodeNotFound, NodeState, Pending, SchedulerError
from remediation.settings import KubeSettings

TAINT_KEY = "fleethealth.io/failure-mode"
REASON_ANNOTATION = "fleethealth.io/drain-reason"
WAIT_PREFIX = "running to completion until "  # + unix time: the wait-for-completion deadline


def _status_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    msg = body.get("message") or exc.reason or ""
    causes = [c.get("message", "") for c in (body.get("details") or {}).get("causes", []) if isinstance(c, dict)]
    return f"HTTP {exc.status} {body.get('reason', '')}: {msg}" + (f" ({'; '.join(causes)})" if causes else "")


class KubernetesScheduler:
    name = "kubernetes"

    def __init__(self, settings: KubeSettings | None = None, api_client: client.ApiClient | None = None) -> None:
        self.s = settings or KubeSettings()
        self.clock = time.time  # wait-for-completion deadlines
        if api_client is None:
            if self.s.host:
                cfg = client.Configuration()
                cfg.host = self.s.host
                api_client = client.ApiClient(cfg)
            elif not self.s.kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
                # in a pod (deploy/kubernetes): the ServiceAccount's token and CA
                cfg = client.Configuration()
                try:
                    kubeconfig.load_incluster_config(client_configuration=cfg)
                except kubeconfig.ConfigException as exc:
                    raise SchedulerError(f"kubernetes: cannot load the in-cluster config: {exc}") from None
                api_client = client.ApiClient(cfg)
            else:
                try:
                    api_client = kubeconfig.new_client_from_config(config_file=self.s.kubeconfig, context=self.s.context)
                except (kubeconfig.ConfigException, OSError) as exc:
                    raise SchedulerError(f"kubernetes: cannot load kubeconfig: {exc}") from None
        self.api_client = api_client  # also for the verification Jobs (remediation/verify.py)
        self.api = client.CoreV1Api(api_client)
        self._t = self.s.request_timeout_s

    def _call(self, what: str, node: str, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, _request_timeout=self._t, **kw)
        except ApiException as exc:
            if exc.status == 404:
                raise NodeNotFound(f"kubernetes {what} {node}: {_status_message(exc)}") from None
            raise SchedulerError(f"kubernetes {what} {node}: {_status_message(exc)}") from None
        except Exception as exc:  # urllib3 connection errors and timeouts
            raise SchedulerError(f"kubernetes {what} {node}: {type(exc).__name__}: {exc}") from None

    def node_name(self, host: str) -> str:
        return self.s.node_names.get(host, host)

    def _state(self, n: Any) -> NodeState:
        name = n.metadata.name
        cordoned = bool(n.spec and n.spec.unschedulable)
        annotations = (n.metadata.annotations or {}) if n.metadata else {}
        labels = (n.metadata.labels or {}) if n.metadata else {}
        reason = annotations.get(REASON_ANNOTATION, "")
        group = labels.get(self.s.group_label, "") if self.s.group_label else ""
        rack = labels.get(self.s.rack_label, "") if self.s.rack_label else ""
        return NodeState(name, "cordoned" if cordoned else "schedulable", cordoned, reason if cordoned else "",
                         groups=(group,) if group else (), rack=rack)

    def node_state(self, node: str) -> NodeState:
        return self._state(self._call("get node", node, self.api.read_node, node))

    def _taints(self, node: str) -> list[dict[str, Any]]:
        n = self._call("get node", node, self.api.read_node, node)
        return [self.api.api_client.sanitize_for_serialization(t) for t in ((n.spec and n.spec.taints) or [])]

    def drain(self, node: str, reason: str, failure_mode: str) -> DrainResult:
        taints = [t for t in self._taints(node) if t.get("key") != TAINT_KEY]
        taints.append({"key": TAINT_KEY, "value": failure_mode, "effect": "NoSchedule"})
        body = {"metadata": {"annotations": {REASON_ANNOTATION: reason}},
                "spec": {"unschedulable": True, "taints": taints}}
        self._call("cordon", node, self.api.patch_node, node, body)
        res = DrainResult(details={"scheduler": "kubernetes", "node": node, "reason": reason,
                                   "taint": f"{TAINT_KEY}={failure_mode}:NoSchedule"})
        if not self.s.evict:
            return res
        try:
            pods = self._call("list pods on", node, self.api.list_pod_for_all_namespaces,
                              field_selector=f"spec.nodeName={node}")
        except SchedulerError as exc:  # cordoned already: report the drain, say evictions did not start
            res.details["evict_error"] = str(exc)[:1000]
            return res
        for pod in pods.items:
            meta = pod.metadata
            owners = meta.owner_references or []
            if any(o.kind == "DaemonSet" for o in owners) or "kubernetes.io/config.mirror" in (meta.annotations or {}):
                continue
            if pod.status and pod.status.phase in ("Succeeded", "Failed"):
                continue
            target = f"{meta.namespace}/{meta.name}"
            if self.s.drain_mode == "wait":  # runs to completion; evicted only past the deadline
                res.pending.append(Pending("wait", target, f"{WAIT_PREFIX}{self.clock() + self.s.wait_deadline_s:.0f}"))
                continue
            left = self.retry(node, Pending("evict", target, ""))
            if left is None:
                res.done_steps.append(("evict", target))
            else:
                res.pending.append(left)
        return res

    def retry(self, node: str, pending: Pending) -> Pending | None:
        if pending.step == "wait":
            return self._wait(node, pending)
        if pending.step != "evict":
            raise SchedulerError(f"kubernetes: unknown pending step {pending.step!r}")
        ns, _, name = pending.target.partition("/")
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=ns))
        try:
            self.api.create_namespaced_pod_eviction(name, ns, body, _request_timeout=self._t)
        except ApiException as exc:
            if exc.status == 404:
                return None  # the pod is gone already: nothing left to evict
            if exc.status == 429:
                return Pending("evict", pending.target, _status_message(exc))
            raise SchedulerError(f"kubernetes evict {pending.target}: {_status_message(exc)}") from None
        except Exception as exc:
            raise SchedulerError(f"kubernetes evict {pending.target}: {type(exc).__name__}: {exc}") from None
        return None

    def _wait(self, node: str, pending: Pending) -> Pending | None:
        """Wait-for-completion: done when the pod finished or is gone; evicted once the deadline
        (kept in the pending reason, so a restarted worker keeps it) has passed."""
        ns, _, name = pending.target.partition("/")
        try:
            pod = self.api.read_namespaced_pod(name, ns, _request_timeout=self._t)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise SchedulerError(f"kubernetes read pod {pending.target}: {_status_message(exc)}") from None
        except Exception as exc:
            raise SchedulerError(f"kubernetes read pod {pending.target}: {type(exc).__name__}: {exc}") from None
        if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
            return None
        try:
            deadline = float(pending.reason.split(WAIT_PREFIX, 1)[1].split()[0])
        except (IndexError, ValueError):
            deadline = 0.0  # no readable deadline: do not wait forever
        if self.clock() < deadline:
            return pending
        left = self.retry(node, Pending("evict", pending.target, ""))
        return None if left is None else Pending("wait", pending.target, f"{WAIT_PREFIX}0 ({left.reason})")

    def resume(self, node: str) -> None:
        taints = [t for t in self._taints(node) if t.get("key") != TAINT_KEY]
        body = {"metadata": {"annotations": {REASON_ANNOTATION: None}},
                "spec": {"unschedulable": False, "taints": taints}}
        self._call("uncordon", node, self.api.patch_node, node, body)

    def inventory(self) -> dict[str, NodeState]:
        nodes = self._call("list", "nodes", self.api.list_node)
        return {st.node: st for st in (self._state(n) for n in nodes.items)}
