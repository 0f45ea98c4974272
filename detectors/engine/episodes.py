"""Findings become incidents: one episode per (host, component, failure mode) while it lasts.

An episode is opened once (state ``open``), sent again as ``updated`` at most every
``update_every_s`` of sample time and only when it learned something (new evidence, higher
severity or confidence; ``update_seq`` bumps), and ``resolved`` when no finding arrived for the
mode's quiet period, or when a reboot / driver reload / GPU reset cleared the component.

The id is stable: a hash of host, component, mode and the episode's first-seen timestamp, so a
replay of the same stream yields the same ids and remediation can deduplicate on it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from detectors.engine.finding import Finding
from fleethealth.schema import Evidence, Incident
from fleethealth.taxonomy import MODES, parse_mode

MAX_EVIDENCE = 32
SEVERITY_RANK = {"info": 0, "minor": 1, "major": 2, "critical": 3}
DEFAULT_QUIET_S = 900.0


def episode_id(host: str, component: str, mode: str, first_seen: float) -> str:
    from hashlib import blake2b  # here: diagnose, which opens no episode, does not load OpenSSL

    h = blake2b(f"{host}|{component}|{mode}|{first_seen:.3f}".encode(), digest_size=10)
    return "inc-" + h.hexdigest()


@dataclass(slots=True)
class Episode:
    id: str
    host: str
    cluster: str
    rack: str
    component: str
    mode: str
    severity: str
    confidence: float
    detector: str
    first_seen: float
    last_seen: float
    quiet_s: float
    evidence: deque[Evidence] = field(default_factory=lambda: deque(maxlen=MAX_EVIDENCE))
    first_evidence: Evidence | None = None
    actions: list[str] = field(default_factory=list)
    xid: int | None = None
    bucket: str | None = None
    update_seq: int = 0
    last_emit: float = 0.0
    dirty: bool = False
    findings: int = 0

    def incident(self, state: str) -> Incident:
        ev = list(self.evidence)
        if self.first_evidence is not None and (not ev or ev[0] is not self.first_evidence):
            ev = [self.first_evidence, *ev[-(MAX_EVIDENCE - 1):]]
        return Incident(
            id=self.id, host=self.host, cluster=self.cluster, rack=self.rack, component=self.component,
            failure_mode=self.mode, severity=self.severity, confidence=round(self.confidence, 4),  # type: ignore[arg-type]
            detector=self.detector, first_seen=self.first_seen, last_seen=max(self.last_seen, self.first_seen),
            state=state, evidence=ev, recommended_action=list(self.actions), xid=self.xid,  # type: ignore[arg-type]
            nvidia_bucket=self.bucket, update_seq=self.update_seq,
        )


class IncidentEpisodes:
    """Open episodes, keyed (host, component, mode); pure: findings and timestamps in, incidents out."""

    def __init__(self, update_every_s: float = 60.0) -> None:
        self.update_every_s = update_every_s
        self.open: dict[tuple[str, str, str], Episode] = {}
        self.by_host: dict[str, set[tuple[str, str, str]]] = {}

    def observe(self, f: Finding, quiet_s: float | None = None) -> Incident | None:
        key = (f.host, f.component, f.failure_mode)
        ep = self.open.get(key)
        q = quiet_s or DEFAULT_QUIET_S
        if ep is None:
            actions = f.recommended_action or [a.value for a in MODES[parse_mode(f.failure_mode)].actions]
            ep = Episode(episode_id(f.host, f.component, f.failure_mode, f.ts), f.host, f.cluster, f.rack,
                         f.component, f.failure_mode, f.severity, f.confidence, f.detector, f.ts, f.ts, q,
                         actions=list(actions), xid=f.xid, bucket=f.nvidia_bucket, last_emit=f.ts, findings=1)
            if f.evidence:
                ep.first_evidence = f.evidence[0]
                ep.evidence.extend(f.evidence)
            self.open[key] = ep
            self.by_host.setdefault(f.host, set()).add(key)
            return ep.incident("open")
        ep.findings += 1
        ep.last_seen = max(ep.last_seen, f.ts)
        ep.quiet_s = max(ep.quiet_s, q)
        escalated = False
        if SEVERITY_RANK.get(f.severity, 0) > SEVERITY_RANK.get(ep.severity, 0):
            ep.severity, escalated = f.severity, True
        if f.confidence > ep.confidence + 1e-9:
            ep.confidence, ep.detector, escalated = f.confidence, f.detector, True
        if ep.xid is None and f.xid is not None:
            ep.xid, ep.bucket, escalated = f.xid, f.nvidia_bucket, True
        for e in f.evidence:
            last = ep.evidence[-1] if ep.evidence else None
            if last is None or last.fact != e.fact or last.line != e.line:
                ep.evidence.append(e)
                ep.dirty = True
        for a in f.recommended_action:
            if a not in ep.actions:
                ep.actions.append(a)
                escalated = True
        if escalated or (ep.dirty and f.ts - ep.last_emit >= self.update_every_s):
            ep.update_seq += 1
            ep.last_emit = f.ts
            ep.dirty = False
            return ep.incident("updated")
        return None

    def expire(self, host: str, now: float) -> list[Incident]:
        """Resolve the host's episodes whose quiet period has passed."""
        keys = self.by_host.get(host)
        if not keys:
            return []
        out = []
        for key in sorted(keys):
            ep = self.open[key]
            if now - ep.last_seen >= ep.quiet_s:
                out.append(self._resolve(key, f"no finding for {ep.quiet_s:.0f}s", now))
        return out

    def clear(self, host: str, now: float, reason: str, component: str | None = None,
              keep_modes: frozenset[str] = frozenset()) -> list[Incident]:
        """Resolve a host's (or one component's) open episodes: a reboot or reset cleared them."""
        keys = self.by_host.get(host)
        if not keys:
            return []
        out = []
        for key in sorted(keys):
            if (component is None or key[1] == component) and key[2] not in keep_modes:
                out.append(self._resolve(key, reason, now))
        return out

    def drop_host(self, host: str) -> None:
        """Forget a host's open episodes without resolving them (another worker owns the host now)."""
        for key in self.by_host.pop(host, set()):
            self.open.pop(key, None)

    def has_open(self, host: str, component: str | None = None, modes: frozenset[str] | None = None) -> bool:
        for _, c, m in self.by_host.get(host, ()):
            if (component is None or c == component) and (modes is None or m in modes):
                return True
        return False

    def open_keys(self, host: str) -> set[tuple[str, str, str]]:
        return self.by_host.get(host, set())

    def _resolve(self, key: tuple[str, str, str], reason: str, now: float) -> Incident:
        ep = self.open.pop(key)
        keys = self.by_host[key[0]]
        keys.discard(key)
        if not keys:
            del self.by_host[key[0]]
        ep.update_seq += 1
        ep.evidence.append(Evidence(fact=f"resolved: {reason}", ts=now))
        return ep.incident("resolved")
