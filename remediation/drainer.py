"""Drains and resumes through the scheduler, behind the guards (the worker's effect engine).

Never touches a node an operator drained (drained with a reason not starting ``fleethealth:``);
recognises its own drain after a crash; queues drains past the cluster / rack cap (with an alert)
and retries them in :meth:`process_queue`; resumes a node only when every incident that holds it
is healthy again and its ticket, if it has one, is closed as repaired.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from fleethealth.schema import ActionRecord, Incident, decode_incident, encode
from remediation import guards
from remediation.scheduler import NodeNotFound, NodeState, NoScheduler, Pending, SchedulerError, drain_reason
from remediation.store import FINAL, DrainRow

if TYPE_CHECKING:
    from remediation.worker import RemediationWorker


class Drainer:
    def __init__(self, worker: RemediationWorker) -> None:
        self.w = worker
        self._sizes: dict[str, tuple[float, int | None]] = {}

    def cluster_size(self, cluster: str) -> int | None:
        configured = self.w.settings.guards.cluster_sizes.get(cluster)
        if configured:
            return configured
        cached = self._sizes.get(cluster)
        if cached and time.monotonic() - cached[0] < 60:
            return cached[1]
        try:
            n = self.w.scheduler.cluster_size()
        except SchedulerError:
            n = None
        self._sizes[cluster] = (time.monotonic(), n)
        return n

    def context(self, inc: Incident) -> guards.DrainContext:
        g = self.w.settings.guards
        active = self.w.store.active_drains(inc.cluster)
        return guards.DrainContext(
            host=inc.host, cluster=inc.cluster, rack=inc.rack, cluster_size=self.cluster_size(inc.cluster),
            drained_in_cluster=len(active), drained_in_rack=sum(1 for d in active if inc.rack and d.rack == inc.rack),
            recent_drains_of_host=self.w.store.drains_done_since(inc.host, self.w.clock() - g.rate_window_s))

    # ------------------------------------------------------------------ drain

    def drain(self, inc: Incident, why: str, *, from_queue: bool = False) -> list[ActionRecord]:
        w = self.w
        node = w.scheduler.node_name(inc.host)
        key = f"{inc.id}|drain|{node}"
        st = w.decided(key)
        if st in FINAL or (st == "queued" and not from_queue):
            return []
        details = {"node": node, "scheduler": w.scheduler.name}
        v = w.gate(inc, fresh=not from_queue)  # a queued drain was fresh when it was queued
        if not v.allow:
            return [w.emit(inc, "drain", node, v.outcome, v.reason, key=key, details={**details, "guard": v.guard})]
        no_scheduler = isinstance(w.scheduler, NoScheduler)
        if no_scheduler and not w.dry_run:
            return [w.emit(inc, "drain", node, "skipped", "no scheduler configured (--scheduler none): not drained",
                           key=key, details=details)]
        try:
            ns = w.scheduler.node_state(node)
        except NodeNotFound as exc:
            return [w.emit(inc, "drain", node, "failed", f"node not found: {exc}", key=key, details=details)]
        except SchedulerError as exc:
            return [w.emit(inc, "drain", node, "failed", str(exc), key=key, details=details)]
        details["state_before"] = ns.state
        if ns.drained and not ns.ours:
            w.metrics.refusals.labels("operator_drain").inc()
            return [w.emit(inc, "drain", node, "refused",
                           f"refused: operator drain ({ns.state}, reason {ns.reason or '<none>'!r}); left alone",
                           key=key, details=details)]
        reason = drain_reason(inc.id, inc.failure_mode)
        if ns.drained_for(inc.id):  # our own drain, done before a crash or by an earlier replay
            return [w.emit(inc, "drain", node, "done", f"drain already in place ({ns.reason}); recorded, not repeated",
                           key=key, details={**details, "reconciled": "true"}, in_tx=self._bookkeep(inc, node))]
        if ns.drained and ns.ours:
            hold = self._hold(inc, node)
            return [w.emit(inc, "drain", node, "skipped", f"already drained by fleethealth ({ns.reason}); "
                           "this incident now also holds it", key=key, details=details, in_tx=hold)]
        stale = w.store.drain_of(node)
        if stale is not None:  # our record says drained, the scheduler says not: someone resumed it
            w.store.remove_drain(node)
        verdict = guards.drain(w.settings.guards, self.context(inc))
        if not verdict.allow:
            return self._held_back(inc, node, key, verdict, why, details)
        if w.dry_run:
            return [w.emit(inc, "drain", node, "dry_run", f"would drain {node} with reason {reason!r}: {why}",
                           key=key, details=details)]
        w.store.set_effect(key, inc.id, "drain", node, "intent", w.clock())
        try:
            res = w.scheduler.drain(node, reason, inc.failure_mode)
        except SchedulerError as exc:
            return [w.emit(inc, "drain", node, "failed", str(exc), key=key, details=details)]
        w.crash_point("drain")
        out = [w.emit(inc, "drain", node, "done", f"drained {node}: {why}", key=key,
                      details={**details, **res.details}, in_tx=self._bookkeep(inc, node))]
        for step, target in res.done_steps:
            out.append(w.emit(inc, "drain", target, "done", f"{step} {target} from {node}",
                              key=f"{inc.id}|{step}|{target}", details={"step": step, "node": node, "target": target}))
        for p in res.pending:
            out.append(self._queue_step(inc, node, p))
        return out

    def _bookkeep(self, inc: Incident, node: str):  # type: ignore[no-untyped-def]
        def f() -> None:
            self.w.store.add_drain(DrainRow(node, inc.host, inc.cluster, inc.rack, inc.id, inc.failure_mode,
                                            self.w.clock()))
            self.w.store.add_hold(node, inc.id, inc.host, inc.component, self.w.clock())
        return f

    def _hold(self, inc: Incident, node: str):  # type: ignore[no-untyped-def]
        def f() -> None:
            if self.w.store.drain_of(node) is not None:
                self.w.store.add_hold(node, inc.id, inc.host, inc.component, self.w.clock())
        return f

    def _held_back(self, inc: Incident, node: str, key: str, v: guards.Verdict, why: str,
                   details: dict[str, str]) -> list[ActionRecord]:
        w = self.w
        w.metrics.refusals.labels(v.guard).inc()
        if v.outcome == "refused" or w.dry_run:
            outcome = "dry_run" if w.dry_run else "refused"
            return [w.emit(inc, "drain", node, outcome, v.reason, key=key, details={**details, "guard": v.guard})]
        payload = {"incident": encode(inc).decode(), "why": why, "node": node}
        rec = w.emit(inc, "drain", node, "queued", v.reason, key=key, details={**details, "guard": v.guard},
                     in_tx=lambda: w.store.enqueue(key, "drain", inc.host, inc.cluster, payload, v.reason, w.clock()))
        alert_key = f"{inc.id}|alert|{v.guard}:{node}"
        out = [rec]
        if w.decided(alert_key) is None:
            res = w.hooks.call("alert", {"host": inc.host, "component": inc.component, "incident": inc.id,
                                         "failure_mode": inc.failure_mode, "node": node, "reason": v.reason},
                               {"action": "alert", "guard": v.guard, "reason": v.reason, "incident": inc.id}) \
                if w.hooks.configured("alert") else None
            out.append(w.emit(inc, "alert", node, "done" if res is None or res.ok else "failed",
                              f"guard {v.guard} held a drain back: {v.reason}", key=alert_key,
                              details={"guard": v.guard, **({"hook": res.detail[:500]} if res else {})}))
        return out

    def _queue_step(self, inc: Incident, node: str, p: Pending) -> ActionRecord:
        w = self.w
        key = f"{inc.id}|{p.step}|{p.target}"
        payload = {"incident": encode(inc).decode(), "node": node, "step": p.step, "target": p.target}
        return w.emit(inc, "drain", p.target, "queued", f"{p.step} of {p.target} blocked, retried later: {p.reason}",
                      key=key, details={"step": p.step, "node": node, "target": p.target},
                      in_tx=lambda: w.store.enqueue(key, p.step, inc.host, inc.cluster, payload, p.reason, w.clock()))

    # ------------------------------------------------------------------ queue + resume

    def process_queue(self) -> list[ActionRecord]:
        w = self.w
        out: list[ActionRecord] = []
        for q in w.store.queued():
            inc = decode_incident(q.payload["incident"])
            if q.kind == "drain":
                healthy = w.store.healthy_since(inc.host, inc.component)
                if healthy is not None and healthy >= inc.last_seen:
                    out.append(w.emit(inc, "drain", q.payload["node"], "skipped", "incident resolved while queued",
                                      key=q.key, in_tx=lambda k=q.key: w.store.dequeue(k)))
                    continue
                if not guards.drain(w.settings.guards, self.context(inc)).allow:
                    continue  # still over the cap: stays queued, no new record
                w.store.dequeue(q.key)
                out += self.drain(inc, q.payload["why"], from_queue=True)
            else:
                try:
                    left = w.scheduler.retry(q.payload["node"], Pending(q.kind, q.payload["target"], q.reason))
                except SchedulerError as exc:
                    w.store.bump_attempts(q.key)
                    out.append(w.emit(inc, "drain", q.payload["target"], "failed", str(exc),
                                      key=f"{q.key}#{q.attempts + 1}", details={"step": q.kind}))
                    continue
                if left is None:
                    out.append(w.emit(inc, "drain", q.payload["target"], "done",
                                      f"{q.kind} {q.payload['target']} succeeded on retry {q.attempts + 1}", key=q.key,
                                      details={"step": q.kind, "node": q.payload["node"],
                                               "target": q.payload["target"]},
                                      in_tx=lambda k=q.key: w.store.dequeue(k)))
                else:
                    w.store.bump_attempts(q.key)
        return out

    def on_healthy(self, inc: Incident) -> list[ActionRecord]:
        return self.check_resumes(only_host=inc.host)

    def _eligible(self, node: str) -> tuple[bool, str]:
        w = self.w
        for h in w.store.holds(node):
            healthy = w.store.healthy_since(h["host"], h["component"])
            if healthy is None or healthy < h["ts"]:
                return False, f"{h['component']} has not reported healthy since the drain"
            t = w.tickets.latest_for(h["host"], h["component"])
            if t is not None and (t.state in ("open", "in_repair") or
                                  (t.state == "closed" and h["incident_id"] in t.incidents)):
                return False, f"ticket {t.id} is {t.state}, not repaired"
        return True, ""

    def check_resumes(self, only_host: str | None = None) -> list[ActionRecord]:
        w = self.w
        out: list[ActionRecord] = []
        for d in w.store.active_drains():
            if only_host is not None and d.host != only_host:
                continue
            ok, _ = self._eligible(d.node)
            if not ok:
                continue
            inc = Incident(id=d.incident_id, host=d.host, cluster=d.cluster, rack=d.rack, component="host",
                           failure_mode=d.failure_mode, severity="info", confidence=1.0, detector="remediation",
                           first_seen=d.ts, last_seen=d.ts, state="resolved")
            key = f"{d.incident_id}|resume|{d.node}@{d.ts:.3f}"
            if w.decided(key) in FINAL:
                continue
            v = w.gate(inc, fresh=False)
            if not v.allow:
                continue  # kill switch: stay drained, say nothing new every tick
            if w.dry_run:
                out.append(w.emit(inc, "resume", d.node, "dry_run", f"would resume {d.node}: repaired and healthy", key=key))
                continue
            try:
                ns: NodeState = w.scheduler.node_state(d.node)
                if not ns.drained or not ns.ours:
                    out.append(w.emit(inc, "resume", d.node, "skipped",
                                      f"{d.node} is no longer drained by fleethealth ({ns.state}, {ns.reason!r}); "
                                      "not touched", key=key, in_tx=lambda n=d.node: w.store.remove_drain(n)))
                    continue
                w.scheduler.resume(d.node)
            except SchedulerError as exc:
                out.append(w.emit(inc, "resume", d.node, "failed", str(exc), key=key, status="failed"))
                continue
            out.append(w.emit(inc, "resume", d.node, "done", f"resumed {d.node}: ticket repaired and node healthy",
                              key=key, details={"scheduler": w.scheduler.name},
                              in_tx=lambda n=d.node: w.store.remove_drain(n)))
        return out
