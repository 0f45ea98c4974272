"""What a detector says about one sample: a Finding. Episodes (detectors.engine.episodes) turn a stream of
findings into Incidents with stable ids; ``diagnose`` prints findings directly.

Every detector — rule or model — implements ``feed(sample) -> list[Finding]`` and ``reset()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from fleethealth.schema import Evidence, Sample


@dataclass(slots=True)
class Finding:
    host: str
    component: str  # GPU UUID (or "gpu<index>" when no UUID), "mlx5_0/1", DIMM label, PCI address, "host"
    failure_mode: str  # from fleethealth.taxonomy
    severity: str  # critical | major | minor | info
    confidence: float
    detector: str  # rule id, or "model:<name>@<version>"
    ts: float  # time from the sample (never the wall clock)
    evidence: list[Evidence] = field(default_factory=list)
    recommended_action: list[str] = field(default_factory=list)
    xid: int | None = None
    nvidia_bucket: str | None = None
    cluster: str = "default"
    rack: str = ""


class Detector(Protocol):
    name: str

    def feed(self, sample: Sample) -> list[Finding]: ...

    def reset(self) -> None: ...
