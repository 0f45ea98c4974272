"""The remediation state store: one SQLite file (WAL) holding idempotency keys, the append-only
audit table, fleethealth's active drains, queued actions, incident sightings (history), health
signals — and, through :mod:`remediation.tickets`, the repair tickets and the webhook outbox.

One file, one connection, so that a decision, its idempotency key, its audit row and its ticket
change commit in the same transaction: a worker killed at any point either did all of it or none.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleethealth.errors import UserError
from fleethealth.schema import ActionRecord, encode

FINAL = frozenset({"done", "dry_run", "skipped"})  # a key in one of these is never acted on again

SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
  key TEXT PRIMARY KEY, incident_id TEXT NOT NULL, kind TEXT NOT NULL, target TEXT NOT NULL,
  status TEXT NOT NULL, ts REAL NOT NULL, detail TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS audit (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, action_id TEXT NOT NULL,
  incident_id TEXT NOT NULL, host TEXT NOT NULL, component TEXT NOT NULL, failure_mode TEXT NOT NULL,
  kind TEXT NOT NULL, outcome TEXT NOT NULL, reason TEXT NOT NULL, record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS audit_host ON audit(host, kind, outcome, ts);
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
  BEGIN SELECT RAISE(ABORT, 'audit is append-only: UPDATE refused'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
  BEGIN SELECT RAISE(ABORT, 'audit is append-only: DELETE refused'); END;
CREATE TABLE IF NOT EXISTS drains (
  node TEXT PRIMARY KEY, host TEXT NOT NULL, cluster TEXT NOT NULL, rack TEXT NOT NULL,
  incident_id TEXT NOT NULL, failure_mode TEXT NOT NULL, ts REAL NOT NULL);
CREATE INDEX IF NOT EXISTS drains_ts ON drains(ts);
CREATE TABLE IF NOT EXISTS holds (
  node TEXT NOT NULL, incident_id TEXT NOT NULL, host TEXT NOT NULL, component TEXT NOT NULL,
  ts REAL NOT NULL, PRIMARY KEY (node, incident_id));
CREATE TABLE IF NOT EXISTS queue (
  key TEXT PRIMARY KEY, kind TEXT NOT NULL, host TEXT NOT NULL, cluster TEXT NOT NULL,
  payload TEXT NOT NULL, reason TEXT NOT NULL, ts REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS queue_guard ON queue(json_extract(payload, '$.guard'), json_extract(payload, '$.scope'))
  WHERE kind='drain';
CREATE TABLE IF NOT EXISTS sightings (
  incident_id TEXT PRIMARY KEY, host TEXT NOT NULL, component TEXT NOT NULL,
  failure_mode TEXT NOT NULL, first_seen REAL NOT NULL);
CREATE INDEX IF NOT EXISTS sightings_comp ON sightings(host, component, failure_mode, first_seen);
CREATE TABLE IF NOT EXISTS health (
  host TEXT NOT NULL, component TEXT NOT NULL, ts REAL NOT NULL, PRIMARY KEY (host, component));
CREATE TABLE IF NOT EXISTS episodes (
  incident_id TEXT PRIMARY KEY, host TEXT NOT NULL, component TEXT NOT NULL, opened REAL NOT NULL,
  resolved REAL);
CREATE INDEX IF NOT EXISTS episodes_open ON episodes(host) WHERE resolved IS NULL;
CREATE TABLE IF NOT EXISTS dry_run_nodes (
  node TEXT PRIMARY KEY, reason TEXT NOT NULL, ts REAL NOT NULL);
"""


@dataclass(frozen=True, slots=True)
class DrainRow:
    node: str
    host: str
    cluster: str
    rack: str
    incident_id: str
    failure_mode: str
    ts: float


@dataclass(frozen=True, slots=True)
class QueuedRow:
    key: str
    kind: str
    host: str
    cluster: str
    payload: dict[str, Any]
    reason: str
    ts: float
    attempts: int


def connect(path: str | Path) -> sqlite3.Connection:
    """Open (creating) the state DB in WAL mode with every table in place."""
    from remediation.tickets import TICKET_SCHEMA

    if str(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        conn.executescript(SCHEMA + TICKET_SCHEMA)
    except sqlite3.DatabaseError as exc:  # garbage, a truncated file, another program's DB (security.md F18)
        raise UserError(f"{path}: not a usable remediation state DB ({exc}); nothing was changed. Restore it "
                        "from a backup or point --state-db elsewhere") from None
    return conn


class RemediationStore:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._lock = threading.RLock()
        self._depth = 0

    @classmethod
    def open(cls, path: str | Path) -> RemediationStore:
        return cls(connect(path))

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (nested calls join the outer one)."""
        with self._lock:
            outer = self._depth == 0
            if outer:
                self.conn.execute("BEGIN IMMEDIATE")
            self._depth += 1
            try:
                yield self.conn
            except BaseException:
                self._depth -= 1
                if outer:
                    self.conn.execute("ROLLBACK")
                raise
            self._depth -= 1
            if outer:
                self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()

    # ------------------------------------------------------------------ idempotency + audit

    def effect(self, key: str) -> tuple[str, str] | None:
        row = self.conn.execute("SELECT status, detail FROM effects WHERE key=?", (key,)).fetchone()
        return (row["status"], row["detail"]) if row else None

    def effect_ts(self, key: str) -> float | None:
        row = self.conn.execute("SELECT ts FROM effects WHERE key=?", (key,)).fetchone()
        return float(row["ts"]) if row else None

    def set_effect(self, key: str, incident_id: str, kind: str, target: str, status: str, ts: float,
                   detail: str = "") -> None:
        with self.tx() as c:
            c.execute("INSERT INTO effects(key, incident_id, kind, target, status, ts, detail) VALUES "
                      "(?,?,?,?,?,?,?) ON CONFLICT(key) DO UPDATE SET status=excluded.status, "
                      "ts=excluded.ts, detail=excluded.detail", (key, incident_id, kind, target, status, ts, detail))

    def audit(self, rec: ActionRecord) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO audit(ts, action_id, incident_id, host, component, failure_mode, kind, "
                      "outcome, reason, record) VALUES (?,?,?,?,?,?,?,?,?,?)",
                      (rec.ts, rec.id, rec.incident_id, rec.host, rec.component, rec.failure_mode,
                       rec.kind, rec.outcome, rec.reason, encode(rec).decode()))

    def audit_rows(self, **where: str) -> list[sqlite3.Row]:
        cond = " AND ".join(f"{k}=?" for k in where) or "1"
        return self.conn.execute(f"SELECT * FROM audit WHERE {cond} ORDER BY seq", tuple(where.values())).fetchall()

    def drains_done_since(self, host: str, since: float) -> int:
        row = self.conn.execute("SELECT COUNT(*) FROM audit WHERE host=? AND kind='drain' AND outcome IN ('done', 'dry_run') "
                                "AND ts>=? AND json_extract(record, '$.details.step') IS NULL", (host, since)).fetchone()
        return int(row[0])

    # ------------------------------------------------------------------ drains

    def add_drain(self, d: DrainRow) -> None:
        with self.tx() as c:
            c.execute("INSERT OR IGNORE INTO drains VALUES (?,?,?,?,?,?,?)",
                      (d.node, d.host, d.cluster, d.rack, d.incident_id, d.failure_mode, d.ts))

    def add_hold(self, node: str, incident_id: str, host: str, component: str, ts: float) -> None:
        with self.tx() as c:
            c.execute("INSERT OR IGNORE INTO holds VALUES (?,?,?,?,?)", (node, incident_id, host, component, ts))

    def holds(self, node: str) -> list[sqlite3.Row]:
        return self.conn.execute("SELECT * FROM holds WHERE node=?", (node,)).fetchall()

    def holds_incident(self, node: str, incident_id: str) -> bool:
        return self.conn.execute("SELECT 1 FROM holds WHERE node=? AND incident_id=?",
                                 (node, incident_id)).fetchone() is not None

    def remove_drain(self, node: str) -> None:
        with self.tx() as c:
            c.execute("DELETE FROM drains WHERE node=?", (node,))
            c.execute("DELETE FROM holds WHERE node=?", (node,))

    def drain_of(self, node: str) -> DrainRow | None:
        row = self.conn.execute("SELECT * FROM drains WHERE node=?", (node,)).fetchone()
        return DrainRow(**dict(row)) if row else None

    def drained_since(self, ts: float) -> list[tuple[str, float]]:
        """(node, ts) of the drains this state DB made at or after ``ts`` (and still holds)."""
        return [(r[0], float(r[1])) for r in self.conn.execute("SELECT node, ts FROM drains WHERE ts>=?", (ts,))]

    def active_drains(self, cluster: str | None = None) -> list[DrainRow]:
        if cluster is None:
            rows = self.conn.execute("SELECT * FROM drains ORDER BY ts").fetchall()
        else:
            rows = self.conn.execute("SELECT * FROM drains WHERE cluster=? ORDER BY ts", (cluster,)).fetchall()
        return [DrainRow(**dict(r)) for r in rows]

    # ------------------------------------------------------------------ queue

    def enqueue(self, key: str, kind: str, host: str, cluster: str, payload: dict[str, Any], reason: str,
                ts: float) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO queue(key, kind, host, cluster, payload, reason, ts) VALUES (?,?,?,?,?,?,?) "
                      "ON CONFLICT(key) DO UPDATE SET reason=excluded.reason",
                      (key, kind, host, cluster, json.dumps(payload, sort_keys=True), reason, ts))

    def queued(self, kind: str | None = None) -> list[QueuedRow]:
        sql = "SELECT * FROM queue" + (" WHERE kind=?" if kind else "") + " ORDER BY ts, key"
        rows = self.conn.execute(sql, (kind,) if kind else ()).fetchall()
        return [QueuedRow(**{**dict(r), "payload": json.loads(r["payload"])}) for r in rows]

    def queued_behind(self, guard: str, scope: str) -> bool:
        """Whether a drain held back by ``guard`` on ``scope`` is queued now."""
        return self.conn.execute("SELECT 1 FROM queue WHERE kind='drain' AND json_extract(payload, '$.guard')=? "
                                 "AND json_extract(payload, '$.scope')=? LIMIT 1", (guard, scope)).fetchone() is not None

    def dequeue(self, key: str) -> None:
        with self.tx() as c:
            c.execute("DELETE FROM queue WHERE key=?", (key,))

    def bump_attempts(self, key: str) -> None:
        with self.tx() as c:
            c.execute("UPDATE queue SET attempts=attempts+1 WHERE key=?", (key,))

    # ------------------------------------------------------------------ history + health

    def note_sighting(self, incident_id: str, host: str, component: str, mode: str, first_seen: float) -> None:
        with self.tx() as c:
            c.execute("INSERT OR IGNORE INTO sightings VALUES (?,?,?,?,?)", (incident_id, host, component, mode, first_seen))

    def prior_on_host(self, host: str, since: float, before: float, exclude: str,
                      skip_modes: tuple[str, ...] = ("app_error", "healthy")) -> set[str]:
        """Earlier episodes on the host in the window, any component and mode but ``skip_modes``."""
        marks = ",".join("?" * len(skip_modes))
        rows = self.conn.execute(
            f"SELECT DISTINCT incident_id FROM sightings WHERE host=? AND first_seen>=? AND first_seen<=? "
            f"AND incident_id<>? AND failure_mode NOT IN ({marks})", (host, since, before, exclude, *skip_modes))
        return {r[0] for r in rows}

    def prior_count(self, host: str, component: str, mode: str, since: float, before: float, exclude: str) -> int:
        row = self.conn.execute(
            "SELECT COUNT(*) FROM sightings WHERE host=? AND component=? AND failure_mode=? AND first_seen>=? "
            "AND first_seen<=? AND incident_id<>?", (host, component, mode, since, before, exclude)).fetchone()
        return int(row[0])

    def note_healthy(self, host: str, component: str, ts: float) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO health VALUES (?,?,?) ON CONFLICT(host, component) DO UPDATE SET "
                      "ts=MAX(ts, excluded.ts)", (host, component, ts))

    def healthy_since(self, host: str, component: str) -> float | None:
        """When ``component`` of ``host`` last reported healthy (``host`` never stands in for a GPU)."""
        row = self.conn.execute("SELECT ts FROM health WHERE host=? AND component=?", (host, component)).fetchone()
        return float(row[0]) if row else None

    # ------------------------------------------------------------------ episodes (resolution per incident id)

    def note_open(self, incident_id: str, host: str, component: str, ts: float) -> None:
        """An episode is open (first sighting wins; a late update after the resolution changes nothing)."""
        with self.tx() as c:
            c.execute("INSERT OR IGNORE INTO episodes(incident_id, host, component, opened) VALUES (?,?,?,?)",
                      (incident_id, host, component, ts))

    def note_resolved(self, incident_id: str, host: str, component: str, ts: float) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO episodes(incident_id, host, component, opened, resolved) VALUES (?,?,?,?,?) "
                      "ON CONFLICT(incident_id) DO UPDATE SET resolved=COALESCE(resolved, excluded.resolved)",
                      (incident_id, host, component, ts, ts))

    def is_resolved(self, incident_id: str) -> bool:
        row = self.conn.execute("SELECT resolved FROM episodes WHERE incident_id=?", (incident_id,)).fetchone()
        return row is not None and row[0] is not None

    def open_episodes(self, host: str) -> list[sqlite3.Row]:
        return self.conn.execute("SELECT * FROM episodes WHERE host=? AND resolved IS NULL ORDER BY opened",
                                 (host,)).fetchall()

    # ------------------------------------------------------------------ dry-run scheduler overlay

    def dry_run_drained(self) -> dict[str, str]:
        return {r["node"]: r["reason"] for r in self.conn.execute("SELECT node, reason FROM dry_run_nodes")}

    def dry_run_reason(self, node: str) -> str | None:
        row = self.conn.execute("SELECT reason FROM dry_run_nodes WHERE node=?", (node,)).fetchone()
        return row[0] if row else None

    def set_dry_run_drained(self, node: str, reason: str | None, ts: float) -> None:
        with self.tx() as c:
            if reason is None:
                c.execute("DELETE FROM dry_run_nodes WHERE node=?", (node,))
            else:
                c.execute("INSERT OR REPLACE INTO dry_run_nodes VALUES (?,?,?)", (node, reason, ts))
