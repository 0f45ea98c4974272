"""Ground truth -> per-row labels: which failure mode (or healthy) each window row carries.

A :class:`Fault` is one labelled episode from the simulator's ground truth: host, component (GPU
UUID, GPU PCI address, port ``mlx5_0/1``, DIMM label, ``host``), failure mode, start (onset), end
(``None`` = never cleared), and the *secondary* modes it causes. Faults on a component the window
has no row for (a DIMM, a GPU that vanished from the sample, the host) label the host row.

Two labellings:

* **evaluation** (``training=False``): a row takes the mode of any fault on its component that
  overlaps the window (plus ``grace_s`` after its end); :meth:`FaultIndex.explained` lists the
  modes a finding may also name without being wrong: the fault's secondary modes, and a
  correctable-error storm in the precursor ramp before a UCE (as the scorecard counts them).
* **training** (``training=True``): a row is labelled by what its window can show. An *event*
  mode (a UCE, an AER fatal report, an Xid burst) is visible only in the windows that hold the
  event (onset .. onset + its span); later windows of the same fault show at most a persisting
  secondary state (a DRAM UCE's Xid 63 leaves *row remap pending* set until the GPU reset), so
  they take that secondary mode, or no label at all (the row is not trained on). Precursor ramps
  before a UCE and the two minutes after a fault ends are not trained on either: their label is
  ambiguous, and a wrong "healthy" or "UCE" there is what taught the first model to call every
  pending row remap a DRAM UCE (held-out precision 0 on ``gpu_dram_uce``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from detectors.ml.features import WindowFeatures, pci_key
from fleethealth.taxonomy import PRECURSORS

HEALTHY = "healthy"
NOT_SCORED = frozenset({"host_unreachable", "healthy"})  # no telemetry to learn from
# event modes -> seconds after onset during which their events still arrive (repeats, follow-ups)
EVENT_SPAN_S: dict[str, float] = {
    "gpu_dram_uce": 0.0, "gpu_sram_uce": 0.0, "host_dram_uce": 0.0, "pcie_fatal": 30.0, "app_error": 10.0,
    "gpu_hw_error": 20.0, "gpu_gsp_error": 120.0,
}
SETTLE_S = 120.0  # training: rows this long after a fault's end are not trained on


@dataclass(frozen=True, slots=True)
class Fault:
    host: str
    component: str
    failure_mode: str
    start: float
    end: float | None = None
    secondary: tuple[str, ...] = ()

    def overlaps(self, t0: float, t1: float, grace_s: float = 0.0) -> bool:
        return self.start <= t1 and (self.end if self.end is not None else math.inf) + grace_s >= t0


def training_label(f: Fault, t0: float, t1: float) -> str | None | bool:
    """The label a training row of window (t0, t1] gets from fault ``f`` on its component:
    a mode, None (do not train on the row), or False (the fault says nothing about this window)."""
    end = f.end if f.end is not None else math.inf
    pre = PRECURSORS.get(f.failure_mode)  # a UCE's correctable-error ramp: not trained on
    if pre is not None and f.start - pre.ramp_s <= t1 and t1 < f.start:
        return None
    if t0 > end + SETTLE_S or t1 < f.start:
        return False
    if t0 > end:
        return None
    span = EVENT_SPAN_S.get(f.failure_mode)
    if span is None or t0 < f.start + span:
        return f.failure_mode
    state = [m for m in f.secondary if m not in EVENT_SPAN_S and m not in NOT_SCORED]
    return state[0] if state else None


class FaultIndex:
    def __init__(self, faults: Iterable[Fault], grace_s: float = 0.0, *, training: bool = False) -> None:
        """``grace_s``: evaluation only — a fault still labels windows that long after its recorded
        end (telemetry lagging the ground truth's end is not a false finding). ``training``: label
        by what a window can show (module docstring)."""
        self.grace_s = grace_s
        self.training = training
        self.by_host: dict[str, list[Fault]] = defaultdict(list)
        for f in faults:
            if f.failure_mode not in NOT_SCORED:
                self.by_host[f.host].append(f)

    def faulty_hosts(self) -> set[str]:
        return set(self.by_host)

    def _slots(self, w: WindowFeatures) -> tuple[dict[str, int], dict[str, int]]:
        gpu_of = {c: i for i, c in enumerate(w.gpu_ids)}
        gpu_of.update({p: i for i, p in enumerate(w.gpu_pci) if p})
        return gpu_of, {c: i for i, c in enumerate(w.port_ids)}

    def _where(self, f: Fault, gpu_of: dict[str, int], port_of: dict[str, int]) -> tuple[str, int]:
        comp = f.component
        if comp in gpu_of or pci_key(comp) in gpu_of:
            return "gpu", gpu_of.get(comp, gpu_of.get(pci_key(comp), 0))
        if comp in port_of:
            return "port", port_of[comp]
        return "host", 0

    def labels(self, w: WindowFeatures) -> dict[str, list[str | None]]:
        """Per kind, one label per row of ``w`` (same order as the window's ids); training rows
        labelled None are to be left out."""
        out: dict[str, list[str | None]] = {"gpu": [HEALTHY] * len(w.gpu_ids), "port": [HEALTHY] * len(w.port_ids),
                                            "host": [HEALTHY]}
        faults = self.by_host.get(w.host)
        if not faults:
            return out
        gpu_of, port_of = self._slots(w)
        for f in faults:
            if self.training:
                lab = training_label(f, w.t0, w.ts)
                if lab is False:
                    continue
            elif f.overlaps(w.t0, w.ts, self.grace_s):
                lab = f.failure_mode
            else:
                continue
            kind, i = self._where(f, gpu_of, port_of)
            cur = out[kind][i]
            if cur == HEALTHY or (cur is None and lab is not None):  # the first specific label wins
                out[kind][i] = lab  # type: ignore[assignment]
        return out

    def explained(self, w: WindowFeatures) -> dict[str, list[set[str]]]:
        """Per kind and row: modes a finding may name without being a false one (a fault's
        secondary modes while it lasts, the storm a UCE's precursor ramp resembles)."""
        out: dict[str, list[set[str]]] = {"gpu": [set() for _ in w.gpu_ids], "port": [set() for _ in w.port_ids],
                                          "host": [set()]}
        faults = self.by_host.get(w.host)
        if not faults:
            return out
        gpu_of, port_of = self._slots(w)
        for f in faults:
            kind, i = self._where(f, gpu_of, port_of)
            if f.overlaps(w.t0, w.ts, self.grace_s):
                out[kind][i].update(f.secondary)
            pre = PRECURSORS.get(f.failure_mode)
            if pre is not None and f.start - pre.ramp_s <= w.ts < f.start + self.grace_s:
                out[kind][i].add(pre.storm)
        return out
