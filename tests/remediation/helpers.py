"""Shared builders for remediation tests (incidents, workers on a temp SQLite store)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from fleethealth.bus import InProcessBus
from fleethealth.schema import Evidence, Incident
from remediation.settings import AllSettings
from remediation.worker import RemediationWorker


class Clock:
    """A settable clock the worker reads instead of time.time()."""

    def __init__(self, t: float | None = None) -> None:
        self.t = time.time() if t is None else t

    def __call__(self) -> float:
        return self.t


def incident(host: str = "gpu-node-001", mode: str = "gpu_fell_off_bus", *, now: float | None = None,
             **kw: Any) -> Incident:
    now = time.time() if now is None else now
    fields: dict[str, Any] = dict(
        id=f"inc-{uuid.uuid4().hex[:10]}", host=host, component="GPU-0a1b2c3d", failure_mode=mode,
        severity="critical", confidence=0.99, detector="rule:test", first_seen=now - 5, last_seen=now,
        state="open", evidence=[Evidence(fact="Xid 79: GPU has fallen off the bus", ts=now - 5,
                                         line="NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.")])
    fields.update(kw)
    return Incident(**fields)


def make_worker(tmp: Path, settings: AllSettings | None = None, **kw: Any) -> RemediationWorker:
    kw.setdefault("bus", InProcessBus())
    kw.setdefault("store", tmp / "state.sqlite")
    return RemediationWorker(settings or AllSettings(), **kw)


def kinds(records: list[Any]) -> list[tuple[str, str]]:
    return [(r.kind, r.outcome) for r in records]
