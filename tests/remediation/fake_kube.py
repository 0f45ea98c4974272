"""A hand-written fake Kubernetes API server (no API server runs here): a real HTTP server on
127.0.0.1 (random port, stdlib http.server in a thread) answering the calls remediation makes, the
way the real API does, errors included:

  GET   /api/v1/nodes, /api/v1/nodes/{name}        404 + Status for an unknown node
  PATCH /api/v1/nodes/{name}                       merge / strategic-merge patch (JSON)
  GET   /api/v1/pods?fieldSelector=spec.nodeName=N
  POST  /api/v1/namespaces/{ns}/pods/{pod}/eviction 201; 429 + Status (DisruptionBudget cause) when
        a PodDisruptionBudget would be violated; 404 for an unknown pod

PDBs are modelled as (namespace, label selector, minAvailable); an eviction removes the pod.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


def status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "details": details or {}, "code": code}


def merge(dst: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (lists replace; null deletes)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(dst) if isinstance(dst, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


class FakeKube:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.pdbs: list[tuple[str, dict[str, str], int]] = []
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}  # batch/v1 Jobs (verification)
        self.logs: dict[tuple[str, str], str] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self._rv = 100
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"null")

            def do_GET(self) -> None:  # noqa: N802
                with fake.lock:
                    self._send(*fake.get(self.path))

            def do_PATCH(self) -> None:  # noqa: N802
                ctype = self.headers.get("Content-Type", "")
                body = self._body()
                with fake.lock:
                    self._send(*fake.patch(self.path, ctype, body))

            def do_DELETE(self) -> None:  # noqa: N802
                with fake.lock:
                    self._send(*fake.delete(self.path))

            def do_POST(self) -> None:  # noqa: N802
                body = self._body()
                with fake.lock:
                    self._send(*fake.post(self.path, body))

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ state

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.nodes[name] = {"kind": "Node", "apiVersion": "v1",
                            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                                         "annotations": {},
                                         "resourceVersion": str(self._bump())},
                            "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}

    def add_pod(self, ns: str, name: str, node: str, labels: dict[str, str] | None = None,
                owner_kind: str | None = None) -> None:
        meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels or {}, "uid": f"uid-{ns}-{name}"}
        if owner_kind:
            meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner_kind, "name": f"{name}-owner",
                                        "uid": f"owner-{name}", "controller": True}]
        self.pods[(ns, name)] = {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.local/app:1"}]},
                                 "status": {"phase": "Running"}}

    def add_pdb(self, ns: str, selector: dict[str, str], min_available: int) -> None:
        self.pdbs.append((ns, selector, min_available))

    def finish_job(self, ns: str, name: str, *, succeeded: bool, log: str) -> None:
        """What the kubelet and job controller would do: the Job's pod ran, with this output."""
        pod = f"{name}-abcde"
        self.pods[(ns, pod)] = {"kind": "Pod", "apiVersion": "v1",
                                "metadata": {"name": pod, "namespace": ns, "labels": {"job-name": name}},
                                "spec": self.jobs[(ns, name)]["spec"]["template"]["spec"],
                                "status": {"phase": "Succeeded" if succeeded else "Failed"}}
        self.logs[(ns, pod)] = log
        self.jobs[(ns, name)]["status"] = {"succeeded": 1} if succeeded else {"failed": 1}

    def delete(self, path: str) -> tuple[int, dict[str, Any]]:
        self.requests.append(("DELETE", urlparse(path).path))
        m = re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs/([^/]+)", urlparse(path).path)
        if m and self.jobs.pop((m.group(1), m.group(2)), None) is not None:
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
        return 404, status(404, "NotFound", "not found")

    def _bump(self) -> int:
        self._rv += 1
        return self._rv

    # ------------------------------------------------------------------ routes

    def get(self, raw: str) -> tuple[int, dict[str, Any]]:
        u = urlparse(raw)
        self.requests.append(("GET", u.path))
        if u.path == "/api/v1/nodes":
            return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": list(self.nodes.values())}
        m = re.fullmatch(r"/api/v1/nodes/([^/]+)", u.path)
        if m:
            node = self.nodes.get(m.group(1))
            if node is None:
                return 404, status(404, "NotFound", f'nodes "{m.group(1)}" not found',
                                   {"name": m.group(1), "kind": "nodes"})
            return 200, node
        m = re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs/([^/]+)", u.path)
        if m:
            job = self.jobs.get((m.group(1), m.group(2)))
            return (200, job) if job else (404, status(404, "NotFound", f'jobs "{m.group(2)}" not found'))
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log", u.path)
        if m:
            return 200, self.logs.get((m.group(1), m.group(2)), "")  # type: ignore[return-value]
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", u.path)
        if m:
            sel = parse_qs(u.query).get("labelSelector", [""])[0]
            key, _, val = sel.partition("=")
            items = [p for (ns, _), p in self.pods.items() if ns == m.group(1)
                     and (not key or p["metadata"].get("labels", {}).get(key) == val)]
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)", u.path)
        if m:
            pod = self.pods.get((m.group(1), m.group(2)))
            if pod is None:
                return 404, status(404, "NotFound", f'pods "{m.group(2)}" not found', {"name": m.group(2), "kind": "pods"})
            return 200, pod
        if u.path == "/api/v1/pods":
            sel = parse_qs(u.query).get("fieldSelector", [""])[0]
            items = list(self.pods.values())
            if sel:
                key, _, val = sel.partition("=")
                if key != "spec.nodeName":
                    return 400, status(400, "BadRequest", f'"{key}" is not a known field selector')
                items = [p for p in items if p["spec"].get("nodeName") == val]
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
        return 404, status(404, "NotFound", "the server could not find the requested resource")

    def patch(self, path: str, ctype: str, body: Any) -> tuple[int, dict[str, Any]]:
        self.requests.append(("PATCH", path))
        m = re.fullmatch(r"/api/v1/nodes/([^/]+)", path)
        if not m:
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        if "merge-patch+json" not in ctype:  # merge and strategic-merge only
            return 415, status(415, "UnsupportedMediaType", f'the body of the request was in an unknown format: {ctype}')
        node = self.nodes.get(m.group(1))
        if node is None:
            return 404, status(404, "NotFound", f'nodes "{m.group(1)}" not found', {"name": m.group(1), "kind": "nodes"})
        new = merge(node, body)
        new["metadata"]["resourceVersion"] = str(self._bump())
        self.nodes[m.group(1)] = new
        return 200, new

    def post(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        self.requests.append(("POST", path))
        jm = re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs", path)
        if jm:
            name = body["metadata"]["name"]
            if (jm.group(1), name) in self.jobs:
                return 409, status(409, "AlreadyExists", f'jobs "{name}" already exists')
            self.jobs[(jm.group(1), name)] = {**body, "status": {"active": 1}}
            return 201, self.jobs[(jm.group(1), name)]
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction", path)
        if not m:
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        ns, name = m.groups()
        if not isinstance(body, dict) or body.get("kind") not in (None, "Eviction"):
            return 400, status(400, "BadRequest", "body must be an Eviction")
        pod = self.pods.get((ns, name))
        if pod is None:
            return 404, status(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
        labels = pod["metadata"]["labels"]
        for pns, sel, min_avail in self.pdbs:
            if pns != ns or any(labels.get(k) != v for k, v in sel.items()):
                continue
            healthy = sum(1 for (n2, _), p in self.pods.items()
                          if n2 == ns and all(p["metadata"]["labels"].get(k) == v for k, v in sel.items()))
            if healthy - 1 < min_avail:
                return 429, status(429, "TooManyRequests",
                                   "Cannot evict pod as it would violate the pod's disruption budget.",
                                   {"causes": [{"reason": "DisruptionBudget", "message":
                                                f"The disruption budget needs {min_avail} healthy pods and has "
                                                f"{healthy} currently"}]})
        del self.pods[(ns, name)]
        return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
