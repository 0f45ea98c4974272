"""Common-cause incidents: many hosts that share a part failing together are one fault of the part.

30 hosts behind one leaf switch reporting ``net_link_down`` within a minute are a dead switch, not
30 bad hosts: draining them all (or queueing 28 drains behind the rack cap, 28 alerts, 30 tickets)
sends 30 technicians to the wrong place. :class:`CommonCause` watches the incidents the worker
handles and, when the hosts of one group (:mod:`remediation.topology`: a leaf switch, PDU, rack,
driver or firmware version, as the operator or Slurm declares it, never a message label) that report
an eligible failure mode within ``window_s`` reach ``min_hosts`` and ``min_fraction`` of the group,
raises one **parent incident** naming the shared part. The worker runs the parent through the
policy (``match: {common_cause: parent}``: by default one ticket and one alert for the part) and every
child — the incidents that formed it and those that follow while it is open — with
``common_cause: child`` (by default: annotate, no drain, no ticket of its own).

Incidents a group could explain wait ``settle_s`` (receiver time) before their own decision, so the
first hosts of a burst are not drained before the parent can form; a host alone is decided when
that time is up (:meth:`due`). With no topology, nothing waits and nothing changes.

The parent resolves when every child has resolved (the part came back), or when the operator
closes the parent's ticket; then the children still open are **released** and decided again on
their own (drains through the guards as usual). State is in the remediation SQLite DB, so a restart
loses no held child.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from fleethealth.schema import Evidence, Incident, decode_incident, encode
from remediation.settings import CommonCauseSettings
from remediation.topology import KINDS, Group, Topology

DETECTOR = "remediation:common_cause"

SCHEMA = """
CREATE TABLE IF NOT EXISTS cc_sightings (
  incident_id TEXT PRIMARY KEY, host TEXT NOT NULL, mode TEXT NOT NULL, seen_at REAL NOT NULL,
  state TEXT NOT NULL, due_at REAL NOT NULL, payload TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS cc_sightings_seen ON cc_sightings(seen_at);
CREATE TABLE IF NOT EXISTS cc_parents (
  id TEXT PRIMARY KEY, grp TEXT NOT NULL, opened_at REAL NOT NULL, state TEXT NOT NULL,
  resolved_at REAL, reason TEXT NOT NULL DEFAULT '', payload TEXT NOT NULL, reported INTEGER NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX IF NOT EXISTS cc_one_open_parent ON cc_parents(grp) WHERE state = 'open';
CREATE TABLE IF NOT EXISTS cc_children (
  parent_id TEXT NOT NULL, incident_id TEXT NOT NULL, host TEXT NOT NULL, state TEXT NOT NULL,
  payload TEXT NOT NULL, PRIMARY KEY (parent_id, incident_id));
"""
# cc_sightings.state: waiting (settling) | decided (its own decision) | child (held by a parent) |
# spent (its parent resolved: it never counts toward a new parent again)


@dataclass(slots=True)
class Verdict:
    """What the correlator says about one incident."""

    wait: bool = False  # settle: decide later (``due``), unless a parent forms first
    parent: Incident | None = None  # the open parent this incident is a child of
    formed: Incident | None = None  # a parent this incident just formed (handle it first)
    children: list[Incident] = field(default_factory=list)  # waiting incidents the new parent took


class CommonCause:
    def __init__(self, conn: sqlite3.Connection, topology: Topology, settings: CommonCauseSettings | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.conn = conn
        self.topology = topology
        self.s = settings or CommonCauseSettings()
        self.clock = clock
        conn.executescript(SCHEMA)
        self.modes = {k: frozenset(v) for k, v in self.s.modes.items()}

    # ------------------------------------------------------------------ grouping

    def groups_for(self, inc: Incident) -> list[Group]:
        """The groups of the incident's host whose kind this failure mode can be a symptom of."""
        return [g for g in self.topology.of_host(inc.host) if inc.failure_mode in self.modes.get(g.kind, ())]

    def open_parent_of(self, groups: list[Group]) -> tuple[str, Incident] | None:
        for g in groups:
            row = self.conn.execute("SELECT id, payload FROM cc_parents WHERE grp=? AND state='open'",
                                    (g.key,)).fetchone()
            if row:
                return row[0], decode_incident(row[1])
        return None

    def _failing(self, g: Group, now: float) -> dict[str, list[tuple[str, str, str]]]:
        """host -> [(incident id, state, payload)] of eligible sightings in the window."""
        out: dict[str, list[tuple[str, str, str]]] = {}
        modes = self.modes.get(g.kind, frozenset())
        for iid, host, mode, state, payload in self.conn.execute(
                "SELECT incident_id, host, mode, state, payload FROM cc_sightings WHERE seen_at >= ? AND state != 'spent'",
                (now - self.s.window_s,)):
            if host in g.hosts and mode in modes:
                out.setdefault(host, []).append((iid, state, payload))
        return out

    def _best_group(self, groups: list[Group], now: float) -> tuple[Group, dict[str, list[tuple[str, str, str]]]] | None:
        best: tuple[tuple[int, float, int, int], Group, dict[str, list[tuple[str, str, str]]]] | None = None
        for g in groups:
            failing = self._failing(g, now)
            n = len(failing)
            frac = n / max(1, len(g.hosts))
            if n < self.s.min_hosts or frac < self.s.min_fraction:
                continue
            rank = (n, frac, -KINDS.index(g.kind), -len(g.hosts))  # explains the most hosts, then the most specific
            if best is None or rank > best[0]:
                best = (rank, g, failing)
        return (best[1], best[2]) if best else None

    # ------------------------------------------------------------------ the worker's calls

    def observe(self, inc: Incident, now: float, *, settled: bool = False) -> Verdict:
        """An open or updated incident arrives (``settled``: it waited its time, decide it now)."""
        groups = self.groups_for(inc)
        if not groups:
            return Verdict()
        payload = encode(inc).decode()
        row = self.conn.execute("SELECT state, due_at FROM cc_sightings WHERE incident_id=?", (inc.id,)).fetchone()
        if row is None:
            state = "decided" if settled or self.s.settle_s <= 0 else "waiting"
            self.conn.execute("INSERT INTO cc_sightings VALUES (?,?,?,?,?,?,?)",
                              (inc.id, inc.host, inc.failure_mode, now, state, now + self.s.settle_s, payload))
        else:
            state = row[0]
            if settled and state == "waiting":
                state = "decided"
            if state == "spent":  # its parent resolved: decided on its own from now on
                self.conn.execute("UPDATE cc_sightings SET payload=? WHERE incident_id=?", (payload, inc.id))
                return Verdict()
            self.conn.execute("UPDATE cc_sightings SET payload=?, state=? WHERE incident_id=?", (payload, state, inc.id))
        found = self.open_parent_of(groups)
        if found is not None:
            self._adopt(found[0], inc)
            return Verdict(parent=found[1])
        best = self._best_group(groups, now)
        if best is None:
            return Verdict(wait=state == "waiting")
        g, failing = best
        parent = self._parent(g, failing, inc, now)
        self.conn.execute("INSERT INTO cc_parents(id, grp, opened_at, state, payload) VALUES (?,?,?,?,?)",
                          (parent.id, g.key, now, "open", encode(parent).decode()))
        taken: list[Incident] = []
        for host_rows in failing.values():
            for iid, st, pl in host_rows:
                if iid == inc.id:
                    continue
                if st == "waiting":  # not decided yet: it becomes a child, held with the rest
                    child = decode_incident(pl)
                    self._adopt(parent.id, child)
                    taken.append(child)
        self._adopt(parent.id, inc)
        self.conn.execute("UPDATE cc_parents SET reported=? WHERE id=?", (len(taken) + 1, parent.id))
        return Verdict(parent=parent, formed=parent, children=taken)

    def _adopt(self, parent_id: str, inc: Incident) -> None:
        self.conn.execute("INSERT INTO cc_children VALUES (?,?,?,?,?) ON CONFLICT(parent_id, incident_id) "
                          "DO UPDATE SET payload=excluded.payload", (parent_id, inc.id, inc.host, "held",
                                                                      encode(inc).decode()))
        self.conn.execute("UPDATE cc_sightings SET state='child' WHERE incident_id=?", (inc.id,))

    def _fact(self, g: Group, hosts: list[str], modes: list[str]) -> str:
        shown = ", ".join(hosts[:40]) + (f" and {len(hosts) - 40} more" if len(hosts) > 40 else "")
        return (f"{len(hosts)} of {len(g.hosts)} hosts on {g.kind} {g.name} report {'/'.join(modes)} within "
                f"{self.s.window_s:.0f} s: a fault of the {g.kind}, not of each host ({shown})")[:4000]

    def _parent(self, g: Group, failing: dict[str, list[tuple[str, str, str]]], inc: Incident, now: float) -> Incident:
        hosts = sorted(failing)
        modes = sorted({decode_incident(pl).failure_mode for rows in failing.values() for _, _, pl in rows})
        mode = inc.failure_mode if inc.failure_mode in modes else modes[0]
        fact = self._fact(g, hosts, modes)
        return Incident(id=f"cc:{g.key}:{int(now)}", host=g.name, cluster=inc.cluster, rack="",
                        component=g.key, failure_mode=mode, severity="critical", confidence=min(1.0, 0.5 + len(hosts) / 20),
                        detector=DETECTOR, first_seen=now, last_seen=now, state="open",
                        evidence=[Evidence(fact=fact, ts=now)], recommended_action=["ticket", "alert"])

    def grown(self, now: float) -> list[Incident]:
        """Open parents that gained children since last reported: the parent as an update (its
        ticket takes the new host list; one update per tick, not one per host)."""
        out = []
        for pid, grp, payload, reported in self.conn.execute(
                "SELECT id, grp, payload, reported FROM cc_parents WHERE state='open'").fetchall():
            rows = self.conn.execute("SELECT host, payload FROM cc_children WHERE parent_id=?", (pid,)).fetchall()
            if len(rows) <= reported:
                continue
            g = self.topology.groups.get(grp)
            parent = decode_incident(payload)
            if g is None:
                continue
            hosts = sorted({h for h, _ in rows})
            modes = sorted({decode_incident(pl).failure_mode for _, pl in rows})
            parent = msgspec.structs.replace(parent, state="updated", last_seen=now, update_seq=len(rows),
                                             evidence=[Evidence(fact=self._fact(g, hosts, modes), ts=now)])
            self.conn.execute("UPDATE cc_parents SET reported=?, payload=? WHERE id=?",
                              (len(rows), encode(parent).decode(), pid))
            out.append(parent)
        return out

    def due(self, now: float) -> list[Incident]:
        """Waiting incidents whose settle time is up and that no parent took: decide them alone."""
        rows = self.conn.execute("SELECT incident_id, payload FROM cc_sightings WHERE state='waiting' AND due_at <= ?",
                                 (now,)).fetchall()
        return [decode_incident(pl) for _, pl in rows]

    def resolved(self, inc: Incident, now: float) -> Incident | None:
        """A child resolved; returns the parent when that was its last open child (the part is back)."""
        self.conn.execute("UPDATE cc_sightings SET state='decided' WHERE incident_id=? AND state='waiting'", (inc.id,))
        rows = self.conn.execute("SELECT parent_id FROM cc_children WHERE incident_id=? AND state='held'",
                                 (inc.id,)).fetchall()
        done: Incident | None = None
        for (pid,) in rows:
            self.conn.execute("UPDATE cc_children SET state='resolved' WHERE parent_id=? AND incident_id=?", (pid, inc.id))
            left = self.conn.execute("SELECT COUNT(*) FROM cc_children WHERE parent_id=? AND state='held'",
                                     (pid,)).fetchone()[0]
            if left == 0:
                done = self.close_parent(pid, now, "every host recovered")
        return done

    def open_parents(self) -> list[Incident]:
        return [decode_incident(pl) for (pl,) in self.conn.execute(
            "SELECT payload FROM cc_parents WHERE state='open' ORDER BY opened_at")]

    def close_parent(self, parent_id: str, now: float, reason: str) -> Incident | None:
        row = self.conn.execute("SELECT payload FROM cc_parents WHERE id=? AND state='open'", (parent_id,)).fetchone()
        if row is None:
            return None
        self.conn.execute("UPDATE cc_parents SET state='resolved', resolved_at=?, reason=? WHERE id=?",
                          (now, reason, parent_id))
        self.conn.execute("UPDATE cc_sightings SET state='spent' WHERE incident_id IN "
                          "(SELECT incident_id FROM cc_children WHERE parent_id=?)", (parent_id,))
        return msgspec.structs.replace(decode_incident(row[0]), state="resolved", last_seen=now)

    def release(self, parent_id: str) -> list[Incident]:
        """The children still held by a resolved parent: the worker decides each again on its own."""
        rows = self.conn.execute("SELECT incident_id, payload FROM cc_children WHERE parent_id=? AND state='held'",
                                 (parent_id,)).fetchall()
        self.conn.execute("UPDATE cc_children SET state='released' WHERE parent_id=? AND state='held'", (parent_id,))
        return [decode_incident(pl) for _, pl in rows]

    def held_count(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM cc_children WHERE state='held'").fetchone()[0])

    def child_ids(self, host: str) -> set[str]:
        """Incidents of this host that were children of a common cause (not the host's own fault)."""
        return {r[0] for r in self.conn.execute("SELECT incident_id FROM cc_children WHERE host=?", (host,))}

    def children(self, parent_id: str) -> list[tuple[str, str, str]]:
        """(incident id, host, state) of every child of a parent."""
        return [tuple(r) for r in self.conn.execute(  # type: ignore[misc]
            "SELECT incident_id, host, state FROM cc_children WHERE parent_id=? ORDER BY host", (parent_id,))]

    def forget_before(self, ts: float) -> None:
        """Drop sightings older than the window that nothing holds (bounded table)."""
        self.conn.execute("DELETE FROM cc_sightings WHERE seen_at < ? AND state != 'waiting'", (ts,))

    def describe(self) -> str:
        return json.dumps({"groups": len(self.topology), "window_s": self.s.window_s, "settle_s": self.s.settle_s,
                           "min_hosts": self.s.min_hosts, "min_fraction": self.s.min_fraction})
