"""The remediation worker: incidents in, guarded effects and action records out.

``RemediationWorker.handle(incident)`` decides by the policy, passes every effect through the
guards, acts through the scheduler / operator hooks / ticket store, and returns the
:class:`ActionRecord` s it wrote (each also on ``fleet.actions.v1`` and in the audit table).
``tick()`` does the periodic work (queued drains and evictions, resumes after repair, ticket
webhook delivery, gauges); ``run(consumer)`` is the consume loop ``fleethealth remediate`` uses.

Exactly-once effects: each effect has an idempotency key ``<incident>|<kind>|<target>``. Before
acting the worker reads the key; a final outcome means "already decided, do nothing". Before a
drain or hook call it writes the key as ``intent``; the outcome, the audit row and any ticket or
drain bookkeeping commit together afterwards. A worker killed between the effect and that commit
finds ``intent`` on restart and asks the scheduler: a node already drained with this incident's
reason is recorded as done, never drained again.

Order of effects: a GPU reset or reboot request goes out only once the scheduler shows this
incident's drain in place on the node (then exactly once, by its key); while the drain is queued
behind a guard the request is queued too. A resolution is tracked per incident id; a node is resumed
only when every episode on its host has resolved (see ``Drainer.check_resumes``).

In a dry run the scheduler is wrapped in :class:`~remediation.scheduler.DryRunScheduler`: the guards,
queue and resume run as live against the real node list, and only the effects are left out.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from fleethealth.bus import ACTIONS, DEADLETTER, Bus, BusError, Consumer, Record
from fleethealth.deadletter import dead_letter_for
from fleethealth.nvml_pause import NvmlPauseError, nvml_paused
from fleethealth.schema import ActionRecord, Evidence, Incident, decode_incident, encode
from remediation import guards
from remediation.common_cause import DETECTOR as CC_DETECTOR
from remediation.common_cause import CommonCause
from remediation.drainer import Drainer
from remediation.hooks import HookResult, OperatorHooks
from remediation.jobs import Job, JobControl, SlurmJobs, urgency_of
from remediation.metrics import RemediationMetrics
from remediation.policy import History, Policy, load_policy
from remediation.scheduler import (
    DryRunScheduler,
    NoScheduler,
    Scheduler,
    SchedulerError,
    drain_reason,
    expand_hostlist,
)
from remediation.settings import AllSettings
from remediation.store import FINAL, RemediationStore
from remediation.tickets import TicketStore, WebhookSink, discard_outbox
from remediation.topology import Topology, load_topology_file, parse_slurm_topology
from remediation.verify import KubeVerifier, SlurmVerifier, Verifier

log = logging.getLogger(__name__)
CRASH_ENV = "FLEETHEALTH_TEST_CRASH_AFTER"  # test-only: "drain" or "record" -> os._exit(137) there
DAY = 86400.0


@dataclass
class RunStats:
    incidents: int = 0
    dead_letters: int = 0
    actions: int = 0
    bus_errors: int = 0  # polls, publishes, flushes and commits the bus failed (the worker carried on)


class RemediationWorker:
    def __init__(self, settings: AllSettings | None = None, *, bus: Bus | None = None,
                 store: RemediationStore | str | Path | None = None, scheduler: Scheduler | None = None,
                 policy: Policy | None = None, hooks: OperatorHooks | None = None,
                 ticket_sink: WebhookSink | None = None, metrics: RemediationMetrics | None = None,
                 clock: Callable[[], float] = time.time, consumer_name: str = "remediation",
                 topology: Topology | None = None) -> None:
        self.settings = settings or AllSettings()
        rs = self.settings.remediation
        self.bus = bus
        if store is None or isinstance(store, str | Path):
            store = RemediationStore.open(store or rs.db)
        self.store = store
        self.tickets = TicketStore(store.conn)
        self.real_scheduler: Scheduler = scheduler or NoScheduler(
            [n for expr in self.settings.guards.nodes for n in expand_hostlist(expr)])
        self.dry_run = rs.dry_run
        # what every decision reads and drains through; in a dry run, an overlay that changes nothing
        self.scheduler: Scheduler = DryRunScheduler(self.real_scheduler, store) if self.dry_run \
            else self.real_scheduler
        self.policy = policy or load_policy(rs.policy)
        self.hooks = hooks or OperatorHooks(rs.hooks)
        self.sink = ticket_sink
        self.metrics = metrics or RemediationMetrics()
        self.clock = clock
        self.consumer_name = consumer_name
        self.crash_after = os.environ.get(CRASH_ENV, "")
        self.drainer = Drainer(self)
        slurm = self.real_scheduler.name == "slurm"
        vs = self.settings.verify
        self.verifier: Verifier | None = SlurmVerifier(store.conn, self.real_scheduler, vs.command, time_limit_min=vs.time_limit_min,
                                      output_dir=vs.output_dir, sbatch=vs.sbatch, clock=clock,
                                      on_fail=self._verification_failed) if slurm and vs.command else None
        api = getattr(self.real_scheduler, "api_client", None)
        if vs.command and self.real_scheduler.name == "kubernetes" and api is not None:
            self.verifier = KubeVerifier(api, vs.command, image=vs.image, namespace=vs.namespace,
                                         time_limit_min=vs.time_limit_min, clock=clock,
                                         on_fail=self._verification_failed, conn=store.conn)
        self.job_control = JobControl(store.conn, SlurmJobs(self.real_scheduler, self.settings.jobs.squeue)
                                      if slurm else None)
        topo = topology if topology is not None else self._topology()
        self.common_cause = CommonCause(store.conn, topo, self.settings.common_cause) if len(topo) else None
        self.dead_letter_count = 0
        self.bus_errors = 0

    # ------------------------------------------------------------------ recording

    def emit(self, inc: Incident, kind: str, target: str, outcome: str, reason: str, *,
             key: str | None = None, details: dict[str, str] | None = None, status: str | None = None,
             in_tx: Callable[[], None] | None = None) -> ActionRecord:
        """Write one decision: idempotency key + audit row (+ ``in_tx`` bookkeeping) in one
        transaction, then publish it on fleet.actions.v1."""
        key = key or f"{inc.id}|{kind}|{target}"
        rec = ActionRecord(id=key[:256], incident_id=inc.id, host=inc.host, component=inc.component,
                           failure_mode=inc.failure_mode, kind=kind, outcome=outcome,  # type: ignore[arg-type]
                           reason=reason[:8000], ts=self.clock(),
                           details={k: str(v)[:8000] for k, v in (details or {}).items()})
        with self.store.tx():
            if in_tx is not None:
                in_tx()
            self.store.set_effect(key, inc.id, kind, target, status or outcome, rec.ts, reason[:500])
            self.store.audit(rec)
        self.metrics.actions.labels(kind, outcome).inc()
        if self.bus is not None:
            try:
                self.bus.publish(ACTIONS, inc.host, encode(rec))
            except BusError as exc:  # the decision is in the audit already; only its announcement failed
                self.bus_error("publish", exc, f"action {key!r} is in the audit but not on {ACTIONS}")
        log.info("remediation %s %s", kind, outcome, extra={"incident": inc.id, "host": inc.host,
                                                             "target": target, "reason": reason[:300]})
        return rec

    def decided(self, key: str) -> str | None:
        st = self.store.effect(key)
        return st[0] if st else None

    def gate(self, inc: Incident, *, fresh: bool = True) -> guards.Verdict:
        g = self.settings.guards
        v = guards.kill_switch(g, bool(g.kill_switch_file) and Path(g.kill_switch_file or "").exists())
        if v.allow and fresh:
            v = guards.freshness(g, inc.last_seen, self.clock())
        if not v.allow:
            self.metrics.refusals.labels(v.guard).inc()
        return v

    def crash_point(self, where: str) -> None:
        if self.crash_after == where:
            log.warning("test crash hook: exiting at %s", where)
            os._exit(137)

    # ------------------------------------------------------------------ incidents

    def history(self, inc: Incident, common_cause: str = "none") -> History:
        out = {}
        for days in self.policy.history_windows:
            out[days] = self.store.prior_count(inc.host, inc.component, inc.failure_mode,
                                               inc.first_seen - days * DAY, inc.first_seen, inc.id)
        on_host: dict[float, int] = {}
        if self.policy.host_history_windows:
            # a common cause's children were the shared part's fault, not the host's
            not_its_own = self.common_cause.child_ids(inc.host) if self.common_cause is not None else set()
            for days in self.policy.host_history_windows:
                prior = self.store.prior_on_host(inc.host, inc.first_seen - days * DAY, inc.first_seen, inc.id)
                on_host[days] = len(prior - not_its_own)
        return History(out, on_host, common_cause)

    def handle(self, inc: Incident, *, settled: bool = False) -> list[ActionRecord]:
        """``settled``: an incident that waited for a common cause to form and none did."""
        if self.dry_run:  # nothing outside the state DB happens: one transaction per incident
            with self.store.tx():
                return self._handle(inc, settled)
        return self._handle(inc, settled)

    def _handle(self, inc: Incident, settled: bool) -> list[ActionRecord]:
        if not settled:
            self.metrics.incidents.labels(inc.state).inc()
        now = self.clock()  # the receiver's clock: a message's own timestamps never stand in for it
        if inc.state == "resolved":
            self.store.note_resolved(inc.id, inc.host, inc.component, now)
            self.store.note_healthy(inc.host, inc.component, now)
            out: list[ActionRecord] = []
            if self.common_cause is not None:
                with self.store.tx():
                    parent = self.common_cause.resolved(inc, now)
                if parent is not None:
                    out += self._common_cause_resolved(parent, "every host that formed it has recovered")
            return out + self.drainer.on_healthy(inc)
        if inc.failure_mode == "healthy":
            self.store.note_healthy(inc.host, inc.component, now)
            return self.drainer.on_healthy(inc)
        with self.store.tx():
            self.store.note_sighting(inc.id, inc.host, inc.component, inc.failure_mode, inc.first_seen)
            self.store.note_open(inc.id, inc.host, inc.component, now)
        out = []
        role = "none"
        if self.common_cause is not None and not inc.detector.startswith(CC_DETECTOR):
            with self.store.tx():
                v = self.common_cause.observe(inc, now, settled=settled)
            if v.formed is not None:
                out += self.act(v.formed, History({}, {}, "parent"))
                for child in v.children:  # they were waiting: held now, with this one
                    out += self.act(child, self.history(child, "child"))
            if v.parent is not None:
                role = "child"
            elif v.wait:
                key = f"{inc.id}|settle|{inc.host}"
                if self.decided(key) is None:
                    out.append(self.emit(inc, "queued", inc.host, "queued",
                                         f"waits up to {self.settings.common_cause.settle_s:.0f} s for other hosts of "
                                         "its shared parts (common cause) before its own decision", key=key,
                                         status="waiting"))
                return out
        return out + self.act(inc, self.history(inc, role))

    def act(self, inc: Incident, hist: History) -> list[ActionRecord]:
        """The policy's decision for one incident, carried out through the guards."""
        decision = self.policy.decide(inc, hist)
        out: list[ActionRecord] = []
        for action in decision.actions:
            if action == "drain":
                recs = self.drainer.drain(inc, decision.reason)
                out += recs
                if any(r.kind == "drain" and r.outcome in ("done", "dry_run") and "step" not in r.details
                       for r in recs):
                    job_recs, inc = self.after_drain(inc, urgency_of(inc.severity, decision.urgency))
                    out += job_recs  # and the ticket below carries the job ids
            elif action in ("reset_gpu", "reboot"):
                out += self.hook_request(inc, action, decision.reason)
            elif action == "ticket":
                out += self._ticket(inc, decision.ticket_priority, decision.reason, hist)
            elif action in ("alert", "annotate"):
                out += self._notify(inc, action, decision.reason)
            elif action == "none":
                key = f"{inc.id}|noop|{inc.host}"
                if self.decided(key) is None:
                    out.append(self.emit(inc, "noop", inc.host, "skipped", decision.reason, key=key))
        return out

    def hook_request(self, inc: Incident, action: str, why: str, *, from_queue: bool = False) -> list[ActionRecord]:
        """A GPU reset or reboot request, handed to the operator hook only once the scheduler shows
        this incident's drain in place on the node; queued while that drain is queued."""
        kind = "reset_gpu" if action == "reset_gpu" else "reboot_request"
        target = f"{inc.host}/{inc.component}" if action == "reset_gpu" else inc.host
        key = f"{inc.id}|{kind}|{target}"
        st = self.decided(key)
        if st in FINAL or (st == "queued" and not from_queue):
            return []
        done = (lambda: self.store.dequeue(key)) if from_queue else None
        if st == "intent":  # killed after calling the hook, before recording: never call it twice
            return [self.emit(inc, kind, target, "skipped", "interrupted after the hook was called; outcome "
                              "unknown, not repeated (check the operator queue)", key=key, in_tx=done)]
        v = self.gate(inc, fresh=not from_queue)
        if not v.allow:
            if from_queue and v.guard == "kill_switch":
                return []
            return [self.emit(inc, kind, target, v.outcome, v.reason, key=key, details={"guard": v.guard},
                              in_tx=done)]
        node = self.scheduler.node_name(inc.host)
        in_place, state = self.drainer.drain_in_place(inc, node)
        if not in_place:
            drain_st = self.decided(f"{inc.id}|drain|{node}")
            if drain_st == "queued":  # the drain waits on a guard: so does the request
                if from_queue:
                    return []
                payload = {"incident": encode(inc).decode(), "why": why, "node": node, "target": target}
                return [self.emit(inc, kind, target, "queued",
                                  f"{action} waits for the drain of {node} (queued behind a guard): {state}", key=key,
                                  details={"node": node},
                                  in_tx=lambda: self.store.enqueue(key, kind, inc.host, inc.cluster, payload,
                                                                   f"waiting for the drain of {node}", self.clock()))]
            reason = (f"{action} not requested: {state} (drain {drain_st or 'not requested'}); a reset or "
                      "reboot goes only to a node whose drain is in place")
            # Re-evaluated on every update of the incident, recorded once per distinct refusal: the
            # same refusal again (e.g. --scheduler none, drain skipped) is no new decision.
            if self.store.effect(key) == ("refused", reason[:500]):
                return []
            self.metrics.refusals.labels("not_drained").inc()
            return [self.emit(inc, kind, target, "refused", reason, key=key,
                              details={"node": node, "guard": "not_drained"}, in_tx=done)]
        if self.dry_run:
            return [self.emit(inc, kind, target, "dry_run", f"would request {action} via the operator hook: {why}",
                              key=key, details={"node": node}, in_tx=done)]
        fields = {"host": inc.host, "component": inc.component, "incident": inc.id,
                  "failure_mode": inc.failure_mode, "node": node, "reason": why}
        if not self.hooks.configured(action):
            return [self.emit(inc, kind, target, "skipped",
                              f"no operator hook configured for {action}; request left to a person", key=key,
                              in_tx=done)]
        self.store.set_effect(key, inc.id, kind, target, "intent", self.clock())
        res = self._call_reset_hook(inc, fields) if action == "reset_gpu" else \
            self.hooks.call(action, fields, {"action": kind, **fields})
        return [self.emit(inc, kind, target, "done" if res.ok else "failed",
                          f"{action} request handed to the operator hook ({state}): {res.detail}", key=key,
                          details={"hook": res.detail[:500], "node": node}, in_tx=done)]

    def _call_reset_hook(self, inc: Incident, fields: dict[str, str]) -> HookResult:
        """The reset hook, with NVML released around it where the collector's pause file is
        configured (the collector must let go of the GPU or nvidia-smi -r refuses). No release
        confirmed within the wait: no reset, the request fails with the reason."""
        payload: dict[str, Any] = {"action": "reset_gpu", **fields}
        hs = self.settings.remediation.hooks
        if not hs.nvml_pause_file:
            return self.hooks.call("reset_gpu", fields, payload)
        try:
            with nvml_paused(hs.nvml_pause_file, wait_s=hs.nvml_release_wait_s, owner=f"remediation {inc.id}"):
                res = self.hooks.call("reset_gpu", fields, payload)
        except NvmlPauseError as exc:
            return HookResult(False, True, f"reset not requested: {exc}")
        return HookResult(res.ok, res.configured, f"{res.detail} (NVML released around it: {hs.nvml_pause_file})")

    def _ticket(self, inc: Incident, priority: str, why: str, hist: History) -> list[ActionRecord]:
        target = f"{inc.host}/{inc.component}"
        key = f"{inc.id}|ticket|{target}#{inc.update_seq}"
        if self.decided(key) in FINAL:
            return []
        if self.dry_run:  # no ticket is written; the first would open one, later ones would update it
            opened = self.store.conn.execute(
                "SELECT 1 FROM audit WHERE host=? AND kind='ticket_opened' AND outcome='dry_run' AND component=? "
                "LIMIT 1", (inc.host, inc.component)).fetchone() is not None
            kind = "ticket_updated" if opened else "ticket_opened"
            return [self.emit(inc, kind, target, "dry_run",
                              f"would {'update the' if opened else 'open a'} {priority} ticket: {why}", key=key)]
        box: dict[str, str] = {}

        def write() -> None:
            t, event = self.tickets.open_or_update(inc, priority, self.clock())
            box.update(ticket=str(t.id), event=event, priority=t.priority, occurrences=str(t.occurrences))

        # The ticket change, the key and the audit row commit together; the record kind follows
        # the event, which is only known inside the transaction.
        with self.store.tx():
            if self.decided(key) in FINAL:  # another worker on this state DB decided it meanwhile
                return []
            write()
            kind = "ticket_opened" if box["event"] == "opened" else "ticket_updated"
            prior = sum(hist.prior_within.values())
            reason = f"ticket {box['ticket']} {box['event']} ({box['priority']}): {why}"
            if box["event"] == "escalated":
                reason += f"; escalated after {prior} earlier episode(s) on {inc.component}"
            rec = self.emit(inc, kind, target, "done", reason, key=key, details=box)
        return [rec]

    def _notify(self, inc: Incident, action: str, why: str) -> list[ActionRecord]:
        key = f"{inc.id}|{action}|{inc.host}/{inc.component}"
        if self.decided(key) in FINAL:
            return []
        if self.dry_run:
            return [self.emit(inc, action, inc.host, "dry_run", f"would {action}: {why}", key=key)]
        detail = ""
        outcome = "done"
        if self.hooks.configured(action):
            res = self.hooks.call(action, {"host": inc.host, "component": inc.component, "incident": inc.id,
                                           "failure_mode": inc.failure_mode, "node": inc.host, "reason": why},
                                  {"action": action, "incident": inc.id, "host": inc.host, "reason": why})
            detail, outcome = res.detail, ("done" if res.ok else "failed")
        return [self.emit(inc, action, inc.host, outcome, why, key=key, details={"hook": detail} if detail else None)]

    # ------------------------------------------------------------------ bus loop

    def dead_letter(self, rec: Record, reason: str) -> None:
        self.metrics.dead_letters.inc()
        self.dead_letter_count += 1
        log.warning("dead-lettered incident", extra={"offset": rec.offset, "partition": rec.partition,
                                                      "reason": reason[:300]})
        if self.bus is not None:
            dl = dead_letter_for(rec, reason, self.consumer_name, self.clock())
            try:
                self.bus.publish(DEADLETTER, rec.key, encode(dl))
            except BusError as exc:  # the message itself stays on its topic at this offset
                self.bus_error("publish", exc, f"dead letter of partition {rec.partition} offset {rec.offset} not sent")

    def handle_record(self, rec: Record) -> list[ActionRecord]:
        """Decode one bus record and handle it; never raises for a bad message or a handler bug."""
        try:
            inc = decode_incident(rec.value)
        except ValueError as exc:  # ContractError is a ValueError
            self.dead_letter(rec, str(exc))
            return []
        try:
            return self.handle(inc)
        except Exception as exc:
            log.exception("handling incident %s failed", inc.id)
            self.dead_letter(rec, f"remediation failure: {type(exc).__name__}: {exc}")
            return []

    def tick(self) -> list[ActionRecord]:
        """Periodic work: settled incidents, common causes closed by their ticket, queued
        drains/evictions, resumes after repair, webhook delivery, gauges."""
        if self.dry_run:  # one transaction: nothing outside the state DB happens
            with self.store.tx():
                out = (self.common_cause_tick() + self.drainer.process_queue() + self.job_deadlines_tick()
                       + self.drainer.check_resumes())
        else:
            out = (self.common_cause_tick() + self.drainer.process_queue() + self.job_deadlines_tick()
                   + self.drainer.check_resumes())
        if self.sink is not None:
            self.sink.deliver()
        else:
            with self.store.tx() as c:
                discard_outbox(c)
        self.update_gauges()
        return out

    def _verification_failed(self, node: str, host: str, detail: str) -> None:
        """Reopen the repaired tickets of what holds the node, with the verification's output."""
        now = self.clock()
        with self.store.tx():
            for h in self.store.holds(node):
                t = self.tickets.latest_for(h["host"], h["component"])
                if t is not None and t.state == "repaired":
                    self.tickets.reopen(t.id, now, f"reopened: {detail}")

    # ------------------------------------------------------------------ jobs on a drained node

    def urgency(self, inc: Incident) -> str:
        """What the policy says a drain of this incident does to the node's jobs (fatal | predictive)."""
        return urgency_of(inc.severity, self.policy.decide(inc, self.history(inc)).urgency)

    def after_drain(self, inc: Incident, urgency: str) -> tuple[list[ActionRecord], Incident]:
        """Fatal: requeue the node's jobs, then DOWN. Predictive: let them finish until the deadline.
        Returns the records and the incident with the job ids added to its evidence."""
        jc = self.job_control
        if jc.jobs is None:
            return [], inc
        node = self.scheduler.node_name(inc.host)
        try:
            jobs = jc.jobs.on_node(node)
        except SchedulerError as exc:
            return [self.emit(inc, "drain", node, "failed", f"could not list the jobs on {node}: {exc}",
                              key=f"{inc.id}|jobs|{node}", details={"step": "jobs"})], inc
        now = self.clock()
        ids = ", ".join(j.describe() for j in jobs) or "none"
        inc = msgspec.structs.replace(inc, evidence=[*inc.evidence[:255], Evidence(
            fact=f"jobs on {node} when it was drained ({urgency}): {ids}"[:4000], ts=now)])
        out: list[ActionRecord] = []
        if urgency == "predictive":
            if jobs:
                key = f"{inc.id}|deadline|{node}"
                if self.decided(key) is None:
                    due = now + self.settings.jobs.deadline_s
                    out.append(self.emit(inc, "drain", node, "dry_run" if self.dry_run else "done",
                                         f"predictive drain: jobs {', '.join(j.id for j in jobs)} may finish; "
                                         f"those still running at the deadline ({self.settings.jobs.deadline_s:.0f} s) "
                                         "are requeued", key=key,
                                         details={"step": "deadline", "jobs": ",".join(j.id for j in jobs), "node": node},
                                         in_tx=None if self.dry_run else
                                         (lambda: jc.watch(node, inc.id, due, jobs, encode(inc).decode()))))
            return out, inc
        for j in jobs:
            out += self._requeue(inc, node, j, "fatal fault: the job cannot go on on this node")
        key = f"{inc.id}|down|{node}"
        # DOWN cuts off whatever did not leave with the requeue; a node with no job stays DRAINed
        if jobs and self.decided(key) not in FINAL:
            if self.dry_run:
                out.append(self.emit(inc, "drain", node, "dry_run", f"would set {node} DOWN", key=key,
                                     details={"step": "down", "node": node}))
            else:
                try:
                    jc.jobs.down(node, drain_reason(inc.id, inc.failure_mode))
                    out.append(self.emit(inc, "drain", node, "done", f"set {node} DOWN after requeueing its jobs: "
                                         "nothing is placed on it until it is resumed", key=key,
                                         details={"step": "down", "node": node}))
                except SchedulerError as exc:
                    out.append(self.emit(inc, "drain", node, "failed", f"could not set {node} DOWN: {exc}", key=key,
                                         details={"step": "down", "node": node}))
        return out, inc

    def _requeue(self, inc: Incident, node: str, job: Job, why: str) -> list[ActionRecord]:
        assert self.job_control.jobs is not None
        key = f"{inc.id}|requeue|{job.id}"
        if self.decided(key) in FINAL:
            return []
        details = {"step": "requeue", "job": job.id, "user": job.user, "node": node}
        if self.dry_run:
            return [self.emit(inc, "drain", f"job:{job.id}", "dry_run", f"would requeue job {job.id}: {why}", key=key,
                              details=details)]
        try:
            self.job_control.jobs.requeue(job.id)
        except SchedulerError as exc:
            return [self.emit(inc, "drain", f"job:{job.id}", "failed", f"requeue of job {job.id} failed: {exc}",
                              key=key, details=details)]
        return [self.emit(inc, "drain", f"job:{job.id}", "done", f"requeued job {job.id} from {node}: {why}", key=key,
                          details=details)]

    def job_deadlines_tick(self) -> list[ActionRecord]:
        jc = self.job_control
        if jc.jobs is None:
            return []
        out: list[ActionRecord] = []
        for node, incident_id, payload in jc.due(self.clock()):
            inc = decode_incident(payload)
            if self.store.drain_of(node) is not None:  # still drained by us: what still runs goes
                try:
                    jobs = jc.jobs.on_node(node)
                except SchedulerError:
                    continue  # retried next tick
                for j in jobs:
                    out += self._requeue(inc, node, j, "predictive drain's deadline passed")
            with self.store.tx():
                jc.done(node, incident_id)
        return out

    # ------------------------------------------------------------------ common causes

    def _topology(self) -> Topology:
        """What hosts share, from the operator's file and (optionally) Slurm: never from messages."""
        cc = self.settings.common_cause
        topo = load_topology_file(cc.topology) if cc.topology else Topology()
        text_of = getattr(self.real_scheduler, "topology_text", None)
        if cc.slurm_topology and text_of is not None:
            parse_slurm_topology(text_of(), topo)
        return topo

    def common_cause_tick(self) -> list[ActionRecord]:
        cc = self.common_cause
        if cc is None:
            return []
        now = self.clock()
        out: list[ActionRecord] = []
        for inc in cc.due(now):  # waited their time and no parent formed: decided alone
            out += self.handle(inc, settled=True)
        for parent in cc.open_parents():
            t = self.tickets.latest_for(parent.host, parent.component)
            if t is not None and t.state in ("repaired", "closed"):
                with self.store.tx():
                    closed = cc.close_parent(parent.id, now, f"ticket {t.id} {t.state}")
                if closed is not None:
                    out += self._common_cause_resolved(closed, f"its ticket {t.id} was marked {t.state}")
        with self.store.tx():
            grown = cc.grown(now)
        for parent in grown:  # more hosts joined: the part's open ticket gets the new list
            if self.dry_run or self.tickets.open_for(parent.host, parent.component) is not None:
                out += self._ticket(parent, "high", f"common cause {parent.component}: more hosts joined",
                                    History({}, {}, "parent"))
        with self.store.tx():
            cc.forget_before(now - 2 * self.settings.common_cause.window_s)
        return out

    def _common_cause_resolved(self, parent: Incident, why: str) -> list[ActionRecord]:
        """The shared part is back (or its repair is done): record it, close its ticket if the hosts
        recovered, and decide every child still open on its own."""
        assert self.common_cause is not None
        now = self.clock()
        out = [self.emit(parent, "noop", parent.host, "done", f"common cause {parent.component} resolved: {why}",
                         key=f"{parent.id}|resolved|{parent.host}")]
        t = self.tickets.open_for(parent.host, parent.component)
        if t is not None and not self.dry_run:
            with self.store.tx():
                self.tickets.set_state(t.id, "closed", now, note=f"common cause resolved: {why}", actor="fleethealth")
        with self.store.tx():
            released = self.common_cause.release(parent.id)
        for child in released:
            if self.store.is_resolved(child.id):
                continue
            out.append(self.emit(child, "noop", child.host, "done",
                                 f"released by common cause {parent.component} ({why}): decided on its own",
                                 key=f"{child.id}|released|{parent.id}"))
            out += self.act(child, self.history(child, "none"))
        return out

    def update_gauges(self) -> None:
        m = self.metrics
        m.drained.set(len(self.store.active_drains()))
        m.queued.set(len(self.store.queued()))
        for bucket, n in self.tickets.age_buckets(self.clock()).items():
            m.tickets_open.labels(bucket).set(n)
        if self.sink is not None:
            m.outbox.set(self.sink.pending())
        if self.common_cause is not None:
            by_kind = dict.fromkeys(("switch", "pdu", "rack", "driver", "firmware"), 0)
            for p in self.common_cause.open_parents():
                by_kind[p.component.split(":", 1)[0]] = by_kind.get(p.component.split(":", 1)[0], 0) + 1
            for kind, n in by_kind.items():
                m.common_cause.labels(kind).set(n)
            m.held.set(self.common_cause.held_count())

    def run(self, consumer: Consumer, *, stop: threading.Event | None = None, poll_timeout: float = 1.0,
            exit_when_idle_s: float | None = None, tick_every_s: float = 5.0) -> RunStats:
        stats = RunStats()
        dead_before = self.dead_letter_count
        idle_since = time.monotonic()
        last_tick = 0.0
        errors_before = self.bus_errors
        pause: Callable[[float], object] = stop.wait if stop is not None else time.sleep
        while stop is None or not stop.is_set():
            try:
                records = consumer.poll(timeout=poll_timeout)
            except BusError as exc:  # the broker is away: nothing was handed over, nothing is owed
                self.bus_error("poll", exc, "retrying in 1 s")
                if pause(1.0):
                    break
                # not idleness (as in the detect worker); the tick below still runs: queued drains,
                # settling and ticket delivery need no broker
                records, idle_since = [], time.monotonic()
            for rec in records:
                stats.actions += len(self.handle_record(rec))
                stats.incidents += 1
            if records or time.monotonic() - last_tick >= tick_every_s:
                stats.actions += len(self.tick())
                last_tick = time.monotonic()
            if self.bus is not None:
                try:
                    self.bus.flush()
                except BusError as exc:
                    self.bus_error("flush", exc, "the decisions are in the audit; their records on the bus are not")
            if records:
                self.crash_point("record")
                try:
                    consumer.commit()
                except BusError as exc:
                    # redelivered by the next poll or owner: every decision has an idempotency key, so a
                    # replayed incident repeats nothing (it only updates its ticket's evidence)
                    self.bus_error("commit", exc, "these incidents may be delivered again")
                idle_since = time.monotonic()
            elif exit_when_idle_s is not None and time.monotonic() - idle_since >= exit_when_idle_s:
                break
        stats.dead_letters = self.dead_letter_count - dead_before
        stats.bus_errors = self.bus_errors - errors_before
        return stats

    def bus_error(self, op: str, exc: BusError, consequence: str) -> None:
        """A bus call failed (a broker restart, a network cut): counted, logged, and the worker carries
        on -- a remediation daemon that exits on a broker blip stops draining the whole fleet."""
        self.bus_errors += 1
        self.metrics.bus_errors.labels(op).inc()
        log.warning("bus %s failed (%s): %s", op, consequence, exc)

    def close(self) -> None:
        self.store.close()
