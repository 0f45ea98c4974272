"""Drains and resumes through the scheduler, behind the guards (the worker's effect engine).

Never touches a node an operator drained (drained with a reason not starting ``fleethealth:``);
recognises its own drain after a crash; counts the caps on the scheduler's own node list
(:meth:`Drainer.context`), never on a message's ``cluster`` / ``rack`` labels; refuses a node the
scheduler does not list; queues a drain that the rate window, a group cap or a rack cap defers (one
alert) and retries it in :meth:`process_queue`; resumes a node only when every episode open on the
host and every incident holding the node has resolved, its ticket (if any) is closed as repaired and
the post-repair check (if configured) passed.

The decision to drain and the drain call run in one SQLite write transaction (``BEGIN IMMEDIATE``):
a second worker on the same state DB waits, then finds the incident decided and the node counted,
so two workers racing on one incident make one drain call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from fleethealth.schema import ActionRecord, Incident, decode_incident, encode
from remediation import guards
from remediation.scheduler import (
    NodeNotFound,
    NodeState,
    NoScheduler,
    Pending,
    SchedulerError,
    drain_reason,
    expand_hostlist,
)
from remediation.store import FINAL, DrainRow

if TYPE_CHECKING:
    from remediation.worker import RemediationWorker

REQUESTS = ("reset_gpu", "reboot_request")  # queue kinds of hook requests waiting for a drain


class Drainer:
    def __init__(self, worker: RemediationWorker) -> None:
        self.w = worker
        self._snap: _Snapshot | None = None
        self._snap_mono = 0.0
        self._racks: dict[str, str] = {}
        for rack, lists in worker.settings.guards.racks.items():
            for expr in lists:
                for n in expand_hostlist(expr):
                    self._racks[n] = rack

    # ------------------------------------------------------------------ the scheduler's view

    def inventory(self, *, refresh: bool = False) -> dict[str, NodeState]:
        return self.snapshot(refresh=refresh).nodes

    def snapshot(self, *, refresh: bool = False) -> _Snapshot:
        """The scheduler's node list with its per-group / per-rack counts, re-read at most every
        ``[guards].inventory_ttl_s`` seconds (drains made through this state DB since are added from
        the store in :meth:`context`, so a cached listing never under-counts our own drains)."""
        ttl = self.w.settings.guards.inventory_ttl_s
        if refresh or self._snap is None or time.monotonic() - self._snap_mono >= ttl:
            nodes = self.w.scheduler.inventory()
            all_ = self.w.settings.guards.count_drained == "all"
            now = self.w.clock()
            snap = _Snapshot(nodes, now, {"": len(nodes)}, {"": set()}, {}, now)
            for n, st in nodes.items():
                busy = st.drained and (all_ or st.ours)
                for g in st.groups:
                    snap.size[g] = snap.size.get(g, 0) + 1
                    snap.busy.setdefault(g, set())
                rack = self.rack_of(n, st)
                if rack:
                    snap.rack_busy.setdefault(rack, set())
                if busy:
                    snap.busy[""].add(n)
                    for g in st.groups:
                        snap.busy[g].add(n)
                    if rack:
                        snap.rack_busy[rack].add(n)
            self._snap, self._snap_mono = snap, time.monotonic()
        return self._snap

    def _catch_up(self, snap: _Snapshot) -> None:
        """Count the drains this state DB (any worker on it) made since the listing was taken."""
        for n, ts in self.w.store.drained_since(snap.seen_until):
            snap.seen_until = max(snap.seen_until, ts)
            st = snap.nodes.get(n)
            if st is None:
                continue
            snap.busy[""].add(n)
            for grp in st.groups:
                snap.busy[grp].add(n)
            rack = self.rack_of(n, st)
            if rack:
                snap.rack_busy.setdefault(rack, set()).add(n)

    def _released(self, node: str) -> None:
        """This worker resumed ``node``: it no longer counts against a cap (no need to wait for a re-listing)."""
        if self._snap is not None:
            for busy in (*self._snap.busy.values(), *self._snap.rack_busy.values()):
                busy.discard(node)

    def racks_configured(self) -> bool:
        s = self.w.settings
        return bool(self._racks or s.slurm.rack_feature_prefix or s.kubernetes.rack_label)

    def rack_of(self, node: str, st: NodeState | None) -> str:
        return self._racks.get(node) or (st.rack if st else "")

    def context(self, inc: Incident, node: str) -> guards.DrainContext:
        """The drain guards' inputs, from the scheduler's node list. Raises SchedulerError when the
        scheduler cannot list its nodes (the drain is then queued, not guessed)."""
        w = self.w
        g = w.settings.guards
        snap = self.snapshot()
        if node not in snap.nodes:
            snap = self.snapshot(refresh=True)  # a node added since the last listing
        st = snap.nodes.get(node)
        recent = w.store.drains_done_since(inc.host, w.clock() - g.rate_window_s)
        racks_configured = self.racks_configured()
        if st is None:
            return guards.DrainContext(host=inc.host, node=node, listed=False, groups=(), scope=g.cap_scope,
                                       rack="", rack_unavailable=0, racks_configured=racks_configured,
                                       recent_drains_of_host=recent)
        self._catch_up(snap)
        keys = st.groups if g.cap_scope == "group" and st.groups else ("",)
        groups = tuple(guards.GroupCount(k or "cluster", snap.size[k], len(snap.busy[k])) for k in keys)
        rack = self.rack_of(node, st)
        rack_unavail = len(snap.rack_busy.get(rack, ())) if rack else 0
        return guards.DrainContext(host=inc.host, node=node, listed=True, groups=groups, scope=g.cap_scope,
                                   rack=rack, rack_unavailable=rack_unavail, racks_configured=racks_configured,
                                   recent_drains_of_host=recent)

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
            if from_queue and v.guard == "kill_switch":
                return []  # stays queued while the switch is engaged
            return [w.emit(inc, "drain", node, v.outcome, v.reason, key=key, details={**details, "guard": v.guard},
                           in_tx=(lambda: w.store.dequeue(key)) if from_queue else None)]
        if isinstance(w.real_scheduler, NoScheduler) and not w.dry_run:
            return [w.emit(inc, "drain", node, "skipped", "no scheduler configured (--scheduler none): not drained",
                           key=key, details=details, in_tx=(lambda: w.store.dequeue(key)) if from_queue else None)]
        alerts: list[tuple[guards.Verdict, str]] = []
        with w.store.tx():  # decision + drain call in one write transaction (racing workers wait here)
            out = self._drain_locked(inc, why, node, key, details, from_queue, alerts)
        for verdict, alert_node in alerts:  # operator hooks run outside the transaction
            out += self._alert(inc, alert_node, verdict)
        return out

    def _drain_locked(self, inc: Incident, why: str, node: str, key: str, details: dict[str, str],
                      from_queue: bool, alerts: list[tuple[guards.Verdict, str]]) -> list[ActionRecord]:
        w = self.w
        st = w.decided(key)  # again, inside the transaction: another worker may have decided it
        if st in FINAL or (st == "queued" and not from_queue):
            return []
        done = (lambda: w.store.dequeue(key)) if from_queue else None
        try:
            ns = w.scheduler.node_state(node)
        except NodeNotFound as exc:
            w.metrics.refusals.labels("inventory").inc()
            return [w.emit(inc, "drain", node, "refused", f"node not in the scheduler's node list: {exc}", key=key,
                           details={**details, "guard": "inventory"}, in_tx=done)]
        except SchedulerError as exc:
            if from_queue:
                return []
            return [w.emit(inc, "drain", node, "failed", str(exc), key=key, details=details)]
        details["state_before"] = ns.state
        if ns.drained and not ns.ours:
            w.metrics.refusals.labels("operator_drain").inc()
            return [w.emit(inc, "drain", node, "refused",
                           f"refused: operator drain ({ns.state}, reason {ns.reason or '<none>'!r}); left alone",
                           key=key, details=details, in_tx=done)]
        reason = drain_reason(inc.id, inc.failure_mode)
        if ns.drained_for(inc.id):  # our own drain, done before a crash or by an earlier replay
            return [w.emit(inc, "drain", node, "dry_run" if w.dry_run else "done",
                           f"drain already in place ({ns.reason}); recorded, not repeated", key=key,
                           details={**details, "reconciled": "true"}, in_tx=_both(self._bookkeep(inc, node), done))]
        if ns.drained and ns.ours:
            return [w.emit(inc, "drain", node, "skipped", f"already drained by fleethealth ({ns.reason}); "
                           "this incident now also holds it", key=key, details=details,
                           in_tx=_both(self._hold(inc, node), done))]
        if w.store.drain_of(node) is not None:  # our record says drained, the scheduler says not: someone resumed it
            w.store.remove_drain(node)
        try:
            ctx = self.context(inc, node)
        except SchedulerError as exc:
            verdict = guards.Verdict(False, "inventory", "queued",
                                     f"the scheduler's node list is unavailable ({exc}); drain queued", scope="list")
        else:
            verdict = guards.drain(w.settings.guards, ctx)
        if not verdict.allow:
            return self._held_back(inc, node, key, verdict, why, details, from_queue, alerts)
        if not w.dry_run:  # the intent marks a real call in flight (nothing to protect in a dry run)
            w.store.set_effect(key, inc.id, "drain", node, "intent", w.clock())
        try:
            res = w.scheduler.drain(node, reason, inc.failure_mode)
        except SchedulerError as exc:
            if from_queue:
                w.store.set_effect(key, inc.id, "drain", node, "queued", w.clock())
                return []
            return [w.emit(inc, "drain", node, "failed", str(exc), key=key, details=details)]
        w.crash_point("drain")
        text = f"would drain {node} with reason {reason!r}: {why}" if w.dry_run else f"drained {node}: {why}"
        out = [w.emit(inc, "drain", node, "dry_run" if w.dry_run else "done", text, key=key,
                      details={**details, **res.details}, in_tx=_both(self._bookkeep(inc, node), done))]
        for step, target in res.done_steps:
            out.append(w.emit(inc, "drain", target, "done", f"{step} {target} from {node}",
                              key=f"{inc.id}|{step}|{target}", details={"step": step, "node": node, "target": target}))
        for p in res.pending:
            out.append(self._queue_step(inc, node, p))
        return out

    def _bookkeep(self, inc: Incident, node: str) -> Callable[[], None]:
        def f() -> None:
            self.w.store.add_drain(DrainRow(node, inc.host, inc.cluster, inc.rack, inc.id, inc.failure_mode,
                                            self.w.clock()))
            self.w.store.add_hold(node, inc.id, inc.host, inc.component, self.w.clock())
        return f

    def _hold(self, inc: Incident, node: str) -> Callable[[], None]:
        def f() -> None:
            if self.w.store.drain_of(node) is not None:
                self.w.store.add_hold(node, inc.id, inc.host, inc.component, self.w.clock())
        return f

    def _held_back(self, inc: Incident, node: str, key: str, v: guards.Verdict, why: str, details: dict[str, str],
                   from_queue: bool, alerts: list[tuple[guards.Verdict, str]]) -> list[ActionRecord]:
        w = self.w
        if from_queue:  # still deferred: stays queued, no new record every tick
            return []
        w.metrics.refusals.labels(v.guard).inc()
        if v.outcome == "refused":
            return [w.emit(inc, "drain", node, "refused", v.reason, key=key, details={**details, "guard": v.guard})]
        payload = {"incident": encode(inc).decode(), "why": why, "node": node, "guard": v.guard, "scope": v.scope}
        # one alert per trip of a guard on a scope: none while another drain it holds back is queued
        first = not w.store.queued_behind(v.guard, v.scope)
        rec = w.emit(inc, "drain", node, "queued", v.reason, key=key, details={**details, "guard": v.guard},
                     in_tx=lambda: w.store.enqueue(key, "drain", inc.host, inc.cluster, payload, v.reason, w.clock()))
        if first:
            alerts.append((v, node))
        return [rec]

    def _alert(self, inc: Incident, node: str, v: guards.Verdict) -> list[ActionRecord]:
        """The alert for a guard that started holding drains back (its scope had none queued)."""
        w = self.w
        alert_key = f"{inc.id}|alert|{v.guard}:{node}"
        if w.decided(alert_key) is not None:
            return []
        text = f"guard {v.guard} held a drain back: {v.reason}"
        if w.dry_run:
            return [w.emit(inc, "alert", node, "dry_run", f"would alert: {text}", key=alert_key,
                           details={"guard": v.guard})]
        res = w.hooks.call("alert", {"host": inc.host, "component": inc.component, "incident": inc.id,
                                     "failure_mode": inc.failure_mode, "node": node, "reason": v.reason},
                           {"action": "alert", "guard": v.guard, "reason": v.reason, "incident": inc.id}) \
            if w.hooks.configured("alert") else None
        return [w.emit(inc, "alert", node, "done" if res is None or res.ok else "failed", text, key=alert_key,
                       details={"guard": v.guard, **({"hook": res.detail[:500]} if res else {})})]

    def _queue_step(self, inc: Incident, node: str, p: Pending) -> ActionRecord:
        w = self.w
        key = f"{inc.id}|{p.step}|{p.target}"
        payload = {"incident": encode(inc).decode(), "node": node, "step": p.step, "target": p.target}
        return w.emit(inc, "drain", p.target, "queued", f"{p.step} of {p.target} blocked, retried later: {p.reason}",
                      key=key, details={"step": p.step, "node": node, "target": p.target},
                      in_tx=lambda: w.store.enqueue(key, p.step, inc.host, inc.cluster, payload, p.reason, w.clock()))

    def drain_in_place(self, inc: Incident, node: str) -> tuple[bool, str]:
        """Whether the scheduler shows a fleethealth drain on ``node`` that this incident holds."""
        w = self.w
        try:
            ns = w.scheduler.node_state(node)
        except SchedulerError as exc:
            return False, f"scheduler cannot say whether {node} is drained: {exc}"
        if not ns.drained:
            return False, f"{node} is not drained ({ns.state})"
        if not ns.ours:
            return False, f"{node} is drained by someone else ({ns.reason or ns.state!r})"
        if not w.store.holds_incident(node, inc.id):
            return False, f"{node} is drained by fleethealth for another incident, not held by this one"
        return True, f"{node} drained ({ns.state}, {ns.reason!r})"

    # ------------------------------------------------------------------ queue + resume

    def process_queue(self) -> list[ActionRecord]:
        w = self.w
        out: list[ActionRecord] = []
        rows = w.store.queued()
        rows.sort(key=lambda q: q.kind in REQUESTS)  # drains first: a request waits for its drain
        for q in rows:
            inc = decode_incident(q.payload["incident"])
            if q.kind in ("drain", *REQUESTS) and w.store.is_resolved(inc.id):
                kind = "drain" if q.kind == "drain" else q.kind
                out.append(w.emit(inc, kind, q.payload["node"] if q.kind == "drain" else q.payload["target"],
                                  "skipped", "incident resolved while queued", key=q.key,
                                  in_tx=partial(w.store.dequeue, q.key)))
                continue
            if q.kind == "drain":
                recs = self.drain(inc, q.payload["why"], from_queue=True)
                out += recs
                if any(r.kind == "drain" and r.outcome in ("done", "dry_run") and "step" not in r.details
                       for r in recs):  # the jobs on the node, as for a drain that went at once
                    out += w.after_drain(inc, w.urgency(inc))[0]
            elif q.kind in REQUESTS:
                out += w.hook_request(inc, "reset_gpu" if q.kind == "reset_gpu" else "reboot", q.payload["why"],
                                      from_queue=True)
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
                                      in_tx=partial(w.store.dequeue, q.key)))
                else:
                    w.store.bump_attempts(q.key)
        return out

    def on_healthy(self, inc: Incident) -> list[ActionRecord]:
        return self.check_resumes(only_host=inc.host)

    def _eligible(self, d: DrainRow) -> tuple[bool, str]:
        w = self.w
        for h in w.store.holds(d.node):
            if not w.store.is_resolved(h["incident_id"]):
                return False, f"incident {h['incident_id']} ({h['component']}) holding the node is still open"
        for ep in w.store.open_episodes(d.host):
            return False, f"episode {ep['incident_id']} on {ep['component']} is still open"
        for h in w.store.holds(d.node):
            t = w.tickets.latest_for(h["host"], h["component"])
            if t is not None and (t.state in ("open", "in_repair") or
                                  (t.state == "closed" and h["incident_id"] in t.incidents)):
                return False, f"ticket {t.id} is {t.state}, not repaired"
        return True, ""

    def post_repair_check(self, node: str, host: str) -> tuple[bool, str]:
        """The configured post-repair check (``[remediation.hooks].post_repair_check``); passes when
        none is configured. Replace or extend this to gate resumes on an active validation job."""
        w = self.w
        if w.verifier is not None:  # a verification job on the node (remediation/verify.py)
            try:
                return w.verifier.check(node, host)
            except SchedulerError as exc:
                return False, f"verification could not run: {exc}"
        if not w.hooks.configured("post_repair_check"):
            return True, ""
        res = w.hooks.call("post_repair_check", {"host": host, "node": node, "component": "host", "incident": "",
                                                 "failure_mode": "", "reason": "post-repair check"},
                           {"action": "post_repair_check", "host": host, "node": node})
        return res.ok, res.detail

    def check_resumes(self, only_host: str | None = None) -> list[ActionRecord]:
        w = self.w
        out: list[ActionRecord] = []
        for d in w.store.active_drains():
            if only_host is not None and d.host != only_host:
                continue
            ok, _ = self._eligible(d)
            if not ok:
                continue
            inc = Incident(id=d.incident_id, host=d.host, cluster=d.cluster, rack=d.rack, component="host",
                           failure_mode=d.failure_mode, severity="info", confidence=1.0, detector="remediation",
                           first_seen=d.ts, last_seen=d.ts, state="resolved")
            key = f"{d.incident_id}|resume|{d.node}@{d.ts:.3f}"
            st = w.decided(key)
            if st in FINAL:
                continue
            v = w.gate(inc, fresh=False)
            if not v.allow:
                continue  # kill switch: stay drained, say nothing new every tick
            if w.hooks.configured("post_repair_check") or w.verifier is not None:
                if w.dry_run:
                    out.append(w.emit(inc, "resume", d.node, "dry_run",
                                      f"would run the post-repair check, then resume {d.node} if it passes", key=key,
                                      in_tx=partial(self._resumed, d.node)))
                    continue
                last = w.store.effect_ts(key)
                if st == "refused" and last is not None and \
                        w.clock() - last < w.settings.remediation.hooks.post_repair_retry_s:
                    continue
                passed, detail = self.post_repair_check(d.node, d.host)
                if not passed:
                    out.append(w.emit(inc, "resume", d.node, "refused",
                                      f"post-repair check failed, {d.node} stays drained: {detail}", key=key,
                                      details={"check": detail[:500]}))
                    continue
            if w.dry_run:
                out.append(w.emit(inc, "resume", d.node, "dry_run",
                                  f"would resume {d.node}: every episode resolved, repaired", key=key,
                                  in_tx=partial(self._resumed, d.node)))
                continue
            try:
                ns: NodeState = w.scheduler.node_state(d.node)
                if not ns.drained or not ns.ours:
                    out.append(w.emit(inc, "resume", d.node, "skipped",
                                      f"{d.node} is no longer drained by fleethealth ({ns.state}, {ns.reason!r}); "
                                      "not touched", key=key, in_tx=partial(w.store.remove_drain, d.node)))
                    continue
                w.scheduler.resume(d.node)
            except SchedulerError as exc:
                out.append(w.emit(inc, "resume", d.node, "failed", str(exc), key=key, status="failed"))
                continue
            out.append(w.emit(inc, "resume", d.node, "done",
                              f"resumed {d.node}: every episode on it resolved, ticket repaired or none",
                              key=key, details={"scheduler": w.scheduler.name},
                              in_tx=partial(w.store.remove_drain, d.node)))
            self._released(d.node)
        return out

    def _resumed(self, node: str) -> None:
        """Dry run: the would-be resume frees the node in the overlay and the bookkeeping."""
        self.w.scheduler.resume(node)
        self.w.store.remove_drain(node)
        self._released(node)


@dataclass
class _Snapshot:
    """One listing of the scheduler's nodes and what the caps count on it."""

    nodes: dict[str, NodeState]
    clock: float  # the worker's clock when it was taken
    size: dict[str, int]  # group -> nodes listed ("" = the whole scheduler)
    busy: dict[str, set[str]]  # group -> unavailable nodes
    rack_busy: dict[str, set[str]]  # rack -> unavailable nodes
    seen_until: float  # drains in the store up to this time are counted in busy / rack_busy


def _both(a: Callable[[], None], b: Callable[[], None] | None) -> Callable[[], None]:
    if b is None:
        return a

    def f() -> None:
        a()
        b()
    return f
