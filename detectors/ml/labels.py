"""Ground truth -> per-row labels: which failure mode (or healthy) each window row carries.

A :class:`Fault` is one labelled episode from the simulator's ground truth: host, component (GPU
UUID, GPU PCI address, port ``mlx5_0/1``, DIMM label, ``host``), failure mode, start, end (``None``
= never cleared). A window row takes the mode of a fault on its component that overlaps the window;
faults on a component the window has no row for (a DIMM, a GPU that vanished from the sample, the
host) label the window's host row.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from detectors.ml.features import WindowFeatures, pci_key

HEALTHY = "healthy"
NOT_SCORED = frozenset({"host_unreachable", "healthy"})  # no telemetry to learn from


@dataclass(frozen=True, slots=True)
class Fault:
    host: str
    component: str
    failure_mode: str
    start: float
    end: float | None = None

    def overlaps(self, t0: float, t1: float, grace_s: float = 0.0) -> bool:
        return self.start <= t1 and (self.end if self.end is not None else math.inf) + grace_s >= t0


class FaultIndex:
    def __init__(self, faults: Iterable[Fault], grace_s: float = 0.0) -> None:
        """``grace_s``: a fault still labels windows that long after its recorded end (evaluation
        uses a grace so that telemetry lagging the ground truth's end is not a false finding)."""
        self.grace_s = grace_s
        self.by_host: dict[str, list[Fault]] = defaultdict(list)
        for f in faults:
            if f.failure_mode not in NOT_SCORED:
                self.by_host[f.host].append(f)

    def faulty_hosts(self) -> set[str]:
        return set(self.by_host)

    def labels(self, w: WindowFeatures) -> dict[str, list[str]]:
        """Per kind, one label per row of ``w`` (same order as the window's ids)."""
        out = {"gpu": [HEALTHY] * len(w.gpu_ids), "port": [HEALTHY] * len(w.port_ids), "host": [HEALTHY]}
        faults = self.by_host.get(w.host)
        if not faults:
            return out
        gpu_of = {c: i for i, c in enumerate(w.gpu_ids)}
        gpu_of.update({p: i for i, p in enumerate(w.gpu_pci) if p})
        port_of = {c: i for i, c in enumerate(w.port_ids)}
        for f in faults:
            if not f.overlaps(w.t0, w.ts, self.grace_s):
                continue
            comp = f.component
            if comp in gpu_of or pci_key(comp) in gpu_of:
                i = gpu_of.get(comp, gpu_of.get(pci_key(comp), 0))
                out["gpu"][i] = f.failure_mode if out["gpu"][i] == HEALTHY else out["gpu"][i]
            elif comp in port_of:
                out["port"][port_of[comp]] = f.failure_mode
            elif out["host"][0] == HEALTHY:
                out["host"][0] = f.failure_mode
        return out
