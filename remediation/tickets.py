"""Repair tickets: one per host + component while it is open, evidence attached, history kept.

States: ``open`` -> ``in_repair`` -> ``repaired`` | ``closed``. A recurring fault on the same
component updates the open ticket (and escalates its priority) instead of opening another.
Every ticket event is also written, in the same transaction, to an ``outbox`` table; a
:class:`WebhookSink` POSTs outbox rows as JSON with retries and exponential backoff and deletes a
row only once the receiver answered 2xx — a down or slow webhook loses nothing. A row the receiver
refuses for good (a 4xx other than 408/429: too large, malformed for it, unauthorised) moves to
``outbox_dead`` with the status and the receiver's words, and the rows behind it go on; a 5xx, a
timeout or a refused connection keeps the row (and the order) and retries with backoff.
"""

from __future__ import annotations

import builtins
import json
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleethealth.errors import UserError
from fleethealth.schema import Incident, to_builtins

log = logging.getLogger(__name__)

STATES = ("open", "in_repair", "repaired", "closed")
OPEN_STATES = ("open", "in_repair")
PRIORITY_RANK = {"normal": 0, "high": 1, "rma": 2}
TRANSITIONS = {"open": {"in_repair", "repaired", "closed"}, "in_repair": {"repaired", "closed", "open"},
               "repaired": set(), "closed": set()}
MAX_EVIDENCE = 200  # evidence items kept per ticket (oldest dropped first; all stay in history)

TICKET_SCHEMA = """
CREATE TABLE IF NOT EXISTS tickets (
  id INTEGER PRIMARY KEY AUTOINCREMENT, host TEXT NOT NULL, component TEXT NOT NULL,
  failure_mode TEXT NOT NULL, state TEXT NOT NULL, priority TEXT NOT NULL, title TEXT NOT NULL,
  evidence TEXT NOT NULL, incidents TEXT NOT NULL, occurrences INTEGER NOT NULL,
  opened_at REAL NOT NULL, updated_at REAL NOT NULL, closed_at REAL);
CREATE UNIQUE INDEX IF NOT EXISTS one_open_ticket ON tickets(host, component) WHERE state IN ('open', 'in_repair');
CREATE TABLE IF NOT EXISTS ticket_history (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, ticket_id INTEGER NOT NULL, ts REAL NOT NULL,
  event TEXT NOT NULL, detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, ticket_id INTEGER NOT NULL, event TEXT NOT NULL,
  payload TEXT NOT NULL, created REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
  next_attempt REAL NOT NULL, last_error TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS outbox_dead (
  seq INTEGER PRIMARY KEY, ticket_id INTEGER NOT NULL, event TEXT NOT NULL, payload TEXT NOT NULL,
  created REAL NOT NULL, attempts INTEGER NOT NULL, failed_at REAL NOT NULL, status INTEGER NOT NULL,
  reason TEXT NOT NULL);
"""


class TicketError(UserError):
    """No such ticket, or a state change the lifecycle does not allow."""


@dataclass(frozen=True, slots=True)
class Ticket:
    id: int
    host: str
    component: str
    failure_mode: str
    state: str
    priority: str
    title: str
    evidence: list[dict[str, Any]]
    incidents: list[str]
    occurrences: int
    opened_at: float
    updated_at: float
    closed_at: float | None

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> Ticket:
        d = dict(r)
        d["evidence"] = json.loads(d["evidence"])
        d["incidents"] = json.loads(d["incidents"])
        return cls(**d)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


class TicketStore:
    """Ticket operations on the shared state connection; callers own the transaction
    (:meth:`remediation.store.RemediationStore.tx`) so a ticket change commits with its decision."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def get(self, ticket_id: int) -> Ticket:
        row = self.conn.execute("SELECT * FROM tickets WHERE id=?", (ticket_id,)).fetchone()
        if row is None:
            raise TicketError(f"no ticket {ticket_id}")
        return Ticket.from_row(row)

    def open_for(self, host: str, component: str) -> Ticket | None:
        row = self.conn.execute("SELECT * FROM tickets WHERE host=? AND component=? AND state IN ('open','in_repair')",
                                (host, component)).fetchone()
        return Ticket.from_row(row) if row else None

    def latest_for(self, host: str, component: str) -> Ticket | None:
        row = self.conn.execute("SELECT * FROM tickets WHERE host=? AND component=? ORDER BY id DESC LIMIT 1",
                                (host, component)).fetchone()
        return Ticket.from_row(row) if row else None

    def list(self, state: str | None = None, host: str | None = None) -> list[Ticket]:
        cond, args = [], []
        if state:
            cond.append("state=?")
            args.append(state)
        if host:
            cond.append("host=?")
            args.append(host)
        sql = "SELECT * FROM tickets" + (" WHERE " + " AND ".join(cond) if cond else "") + " ORDER BY id"
        return [Ticket.from_row(r) for r in self.conn.execute(sql, args)]

    def history(self, ticket_id: int) -> builtins.list[dict[str, Any]]:
        rows = self.conn.execute("SELECT ts, event, detail FROM ticket_history WHERE ticket_id=? ORDER BY seq",
                                 (ticket_id,)).fetchall()
        return [{"ts": r["ts"], "event": r["event"], "detail": json.loads(r["detail"])} for r in rows]

    def _event(self, t: Ticket, event: str, detail: dict[str, Any], now: float) -> None:
        self.conn.execute("INSERT INTO ticket_history(ticket_id, ts, event, detail) VALUES (?,?,?,?)",
                          (t.id, now, event, json.dumps(detail, sort_keys=True)))
        payload = {"event": event, "ticket": t.as_dict(), "detail": detail, "ts": now}
        self.conn.execute("INSERT INTO outbox(ticket_id, event, payload, created, next_attempt) VALUES (?,?,?,?,?)",
                          (t.id, event, json.dumps(payload, sort_keys=True), now, now))

    def open_or_update(self, inc: Incident, priority: str, now: float) -> tuple[Ticket, str]:
        """Open a ticket for the incident's component, or add the incident to the open one.
        Returns (ticket, event) with event ``opened``, ``updated`` or ``escalated``."""
        ev = [to_builtins(e) | {"incident": inc.id} for e in inc.evidence] or [
            {"fact": f"{inc.failure_mode} reported by {inc.detector}", "incident": inc.id}]
        cur = self.open_for(inc.host, inc.component)
        if cur is None:
            title = f"{inc.failure_mode} on {inc.host} {inc.component}"
            c = self.conn.execute(
                "INSERT INTO tickets(host, component, failure_mode, state, priority, title, evidence, incidents, "
                "occurrences, opened_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (inc.host, inc.component, inc.failure_mode, "open", priority, title, json.dumps(ev[-MAX_EVIDENCE:]),
                 json.dumps([inc.id]), 1, now, now))
            t = self.get(int(c.lastrowid or 0))
            self._event(t, "opened", {"incident": inc.id, "priority": priority, "detector": inc.detector}, now)
            return t, "opened"
        escalate = PRIORITY_RANK[priority] > PRIORITY_RANK[cur.priority]
        new_prio = priority if escalate else cur.priority
        incidents = cur.incidents if inc.id in cur.incidents else [*cur.incidents, inc.id]
        occurrences = len(incidents)
        evidence = (cur.evidence + ev)[-MAX_EVIDENCE:]
        self.conn.execute("UPDATE tickets SET priority=?, evidence=?, incidents=?, occurrences=?, updated_at=? "
                          "WHERE id=?", (new_prio, json.dumps(evidence), json.dumps(incidents), occurrences, now, cur.id))
        t = self.get(cur.id)
        event = "escalated" if escalate else "updated"
        self._event(t, event, {"incident": inc.id, "failure_mode": inc.failure_mode, "from": cur.priority,
                               "priority": new_prio, "occurrences": occurrences}, now)
        return t, event

    def set_state(self, ticket_id: int, state: str, now: float, note: str = "", actor: str = "operator") -> Ticket:
        if state not in STATES:
            raise TicketError(f"unknown ticket state {state!r}; states: {', '.join(STATES)}")
        t = self.get(ticket_id)
        if state not in TRANSITIONS[t.state]:
            raise TicketError(f"ticket {ticket_id} is {t.state}; it cannot become {state}")
        closed = now if state in ("repaired", "closed") else None
        self.conn.execute("UPDATE tickets SET state=?, updated_at=?, closed_at=? WHERE id=?", (state, now, closed, ticket_id))
        prev = t.state
        t = self.get(ticket_id)
        self._event(t, state, {"note": note, "actor": actor, "from": prev}, now)
        return t

    def reopen(self, ticket_id: int, now: float, fact: str, actor: str = "fleethealth") -> Ticket:
        """A repaired ticket whose node then failed its verification job (remediation/verify.py): open
        again with the output as evidence. Only this path leaves ``repaired``: the repair did not take;
        an operator's lifecycle keeps ``repaired`` final (a new fault opens a new ticket)."""
        t = self.get(ticket_id)
        if t.state != "repaired":
            raise TicketError(f"ticket {ticket_id} is {t.state}; only a repaired ticket is reopened by verification")
        evidence = (t.evidence + [{"fact": fact[:8000], "ts": now}])[-MAX_EVIDENCE:]
        self.conn.execute("UPDATE tickets SET state='open', evidence=?, updated_at=?, closed_at=NULL WHERE id=?",
                          (json.dumps(evidence), now, ticket_id))
        t = self.get(ticket_id)
        self._event(t, "reopened", {"note": fact[:4000], "actor": actor, "from": "repaired"}, now)
        return t

    def age_buckets(self, now: float) -> dict[str, int]:
        out = {"lt_1d": 0, "1d_7d": 0, "7d_30d": 0, "gt_30d": 0}
        for (opened,) in self.conn.execute("SELECT opened_at FROM tickets WHERE state IN ('open','in_repair')"):
            age = now - opened
            key = "lt_1d" if age < 86400 else "1d_7d" if age < 7 * 86400 else "7d_30d" if age < 30 * 86400 else "gt_30d"
            out[key] += 1
        return out


# --------------------------------------------------------------------------- webhook sink


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    sent: int
    failed: int
    pending: int
    dead: int = 0  # moved to outbox_dead in this round (the receiver refused them for good)


@dataclass(frozen=True, slots=True)
class PostResult:
    ok: bool
    error: str = ""
    permanent_status: int = 0  # a 4xx the receiver will give again: no retry helps


class WebhookSink:
    """POST outbox rows to a Jira/ServiceNow-style webhook. Each row carries an
    ``Idempotency-Key`` header (``fleethealth-outbox-<seq>``) so a receiver can drop a resend."""

    def __init__(self, conn: sqlite3.Connection, url: str, *, timeout_s: float = 5.0, attempts: int = 3,
                 backoff_s: float = 0.5, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.time) -> None:
        self.conn, self.url, self.timeout_s = conn, url, timeout_s
        self.attempts, self.backoff_s, self.sleep, self.clock = attempts, backoff_s, sleep, clock
        import requests  # only where tickets are delivered: `tickets list` does not pay for it

        self.session = requests.Session()
        self._request_error = requests.RequestException

    def pending(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    def dead(self) -> list[sqlite3.Row]:
        return self.conn.execute("SELECT * FROM outbox_dead ORDER BY seq").fetchall()

    def _post(self, seq: int, payload: str) -> PostResult:
        """One delivery with in-call retries (5xx, 408, 429, timeouts, connection errors)."""
        err = ""
        for i in range(self.attempts):
            if i:
                self.sleep(self.backoff_s * (2 ** (i - 1)))
            try:
                r = self.session.post(self.url, data=payload, timeout=self.timeout_s, headers={
                    "Content-Type": "application/json", "Idempotency-Key": f"fleethealth-outbox-{seq}"})
            except self._request_error as exc:
                err = f"{type(exc).__name__}: {exc}"
                continue
            if 200 <= r.status_code < 300:
                return PostResult(True)
            err = f"HTTP {r.status_code}: {r.text[:200]}"
            if 400 <= r.status_code < 500 and r.status_code not in (408, 429):
                return PostResult(False, err, r.status_code)  # the receiver rejects this event
        return PostResult(False, err)

    def deliver(self, limit: int = 100) -> DeliveryReport:
        now = self.clock()
        rows = self.conn.execute("SELECT seq, ticket_id, payload, attempts FROM outbox WHERE next_attempt<=? "
                                 "ORDER BY seq LIMIT ?",
                                 (now, limit)).fetchall()
        sent = failed = dead = 0
        for r in rows:
            res = self._post(r["seq"], r["payload"])
            if res.ok:
                self.conn.execute("DELETE FROM outbox WHERE seq=?", (r["seq"],))
                sent += 1
                continue
            failed += 1
            attempts = r["attempts"] + 1
            if res.permanent_status:  # this event will never be taken: set it aside, deliver the rest
                dead += 1
                own = not self.conn.in_transaction
                if own:
                    self.conn.execute("BEGIN IMMEDIATE")
                try:
                    self.conn.execute(
                        "INSERT OR REPLACE INTO outbox_dead(seq, ticket_id, event, payload, created, attempts, "
                        "failed_at, status, reason) SELECT seq, ticket_id, event, payload, created, ?, ?, ?, ? "
                        "FROM outbox WHERE seq=?",
                        (attempts, self.clock(), res.permanent_status, res.error[:1000], r["seq"]))
                    self.conn.execute("DELETE FROM outbox WHERE seq=?", (r["seq"],))
                except BaseException:
                    if own:
                        self.conn.execute("ROLLBACK")
                    raise
                if own:
                    self.conn.execute("COMMIT")
                log.error("ticket webhook refused an event for good; moved to outbox_dead, later events go on",
                          extra={"seq": r["seq"], "ticket": r["ticket_id"], "status": res.permanent_status,
                                 "error": res.error[:200]})
                continue
            delay = min(3600.0, max(self.backoff_s, 0.01) * (2 ** min(attempts, 12)))
            self.conn.execute("UPDATE outbox SET attempts=?, next_attempt=?, last_error=? WHERE seq=?",
                              (attempts, self.clock() + delay, res.error[:1000], r["seq"]))
            log.warning("ticket webhook delivery failed; kept in outbox",
                        extra={"seq": r["seq"], "attempts": attempts, "retry_in_s": round(delay, 2),
                               "error": res.error[:200]})
            break  # the receiver is down or slow: keep order, later events wait for this one
        return DeliveryReport(sent, failed, self.pending(), dead)


def discard_outbox(conn: sqlite3.Connection) -> None:
    """With no webhook configured, the outbox is not needed (history keeps every event)."""
    conn.execute("DELETE FROM outbox")
