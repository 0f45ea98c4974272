"""The supervised classifier: per-component windows -> failure mode, trained on simulated fleets.

One HistGradientBoostingClassifier per component kind (GPU, network port, host). A row is only
scored when its *gate* is open (:mod:`detectors.ml.gate`: something beyond the healthy noise the
model was trained on); training uses the same gate, so what the model learned and what it is
asked match.

Batching: a boosted multiclass model costs ~10 ms per ``predict_proba`` call whatever the row
count (one Cython call per tree), and numpy's gate costs microseconds per call whatever the row
count, so windows are buffered — across hosts — and gated and scored in one call per kind when
the buffer holds ``batch_windows`` windows, when sample time has moved ``batch_s`` past the oldest
buffered window, or on :meth:`SupervisedDetector.flush` (the engine calls it at the end of each
poll batch). A finding carries its window's sample time, never the flush's.

Precision first: a finding needs the top class's probability >= ``threshold`` (from the sidecar,
0.9 by default), and a *state* mode (:data:`STATE_MODES`: link down, thermal, a storm ...) needs it
in ``persist`` consecutive windows of its component (2 by default); it recommends the failure
mode's default actions (drain included) only at ``drain_threshold`` and above, and a ticket
otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.engine.finding import Finding
from detectors.ml.batching import WindowBatcher
from detectors.ml.features import (
    GPU_FEATURES,
    HI,
    HOST_FEATURES,
    PORT_FEATURES,
    FeatureStream,
    WindowFeatures,
    pci_of_gpu,
)
from detectors.ml.gate import Gate
from fleethealth.schema import Evidence
from fleethealth.taxonomy import MODES, FailureMode

KINDS = ("gpu", "port", "host")
FEATURES: dict[str, tuple[str, ...]] = {"gpu": GPU_FEATURES, "port": PORT_FEATURES, "host": HOST_FEATURES}
_GAUGES = {"temp_c", "temp_dev", "temp_z", "power_w", "power_dev", "util_pct", "util_dev",
           "pcie_gen_ratio", "pcie_width_ratio"}


def window_rows(w: WindowFeatures) -> dict[str, tuple[list[str], np.ndarray]]:
    return {"gpu": (w.gpu_ids, w.gpu), "port": (w.port_ids, w.port),
            "host": ([w.dimm], w.host_row.reshape(1, -1))}


@dataclass(slots=True)
class _Top:
    names: tuple[str, ...]

    def evidence(self, row: np.ndarray, ts: float, k: int = 4) -> list[Evidence]:
        nz = [(abs(float(v)), n, float(v)) for n, v in zip(self.names, row, strict=True)
              if v and n not in _GAUGES]
        nz.sort(reverse=True)
        return [Evidence(fact=f"{n}={v:.4g} over the window", ts=ts) for _, n, v in nz[:k]]


def single_threaded() -> None:
    """Score on one OpenMP thread. Our predictions are a few rows at a time; with OpenMP's default
    (one thread per core) each call pays thread wake-up and, on a busy host, spin-waits for cores
    that other workers hold — seconds per call under load. Process-wide on purpose: a detect worker
    is one core's worth of work, and scaling out is by consumer-group members, not threads."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="openmp")


# Modes that name a lasting condition rather than an event: one window of them is also what a
# transient looks like (a link bounce during a switch reboot shows one window of "port down"), so a
# finding needs the same mode on the same component in ``persist`` consecutive windows of the host.
# Events (a UCE, a fatal AER, an Xid burst) leave one window and are found at once.
STATE_MODES = frozenset({"net_link_down", "net_link_bad_cable", "gpu_thermal", "pcie_link_degraded",
                         "gpu_ecc_sbe_storm", "host_dram_ce_storm", "gpu_nvlink_error"})


class SupervisedDetector(WindowBatcher):
    """``feed(sample) -> list[Finding]`` from the trained per-kind classifiers, scored in batches;
    ``flush() -> list[Finding]`` scores what is buffered (call it at the end of a poll batch).

    Windows are buffered whole (:mod:`detectors.ml.batching`) and gated a batch at a time (one
    mask per kind over the stacked rows of every window in the batch), so the healthy path costs a
    list append per window."""

    def __init__(self, estimators: dict[str, Any], meta: dict[str, Any], stream: FeatureStream | None = None, *,
                 batch_windows: int = 1024, batch_s: float = 60.0, persist: int | None = None) -> None:
        single_threaded()
        self.models = estimators
        self.meta = meta
        self.version = str(meta.get("version", "0"))
        self.name = f"model:{meta.get('name', 'fault_classifier')}@{self.version}"
        self.threshold = float(meta.get("threshold", 0.9))
        self.drain_threshold = float(meta.get("drain_threshold", 0.97))
        self.persist = int(persist if persist is not None else meta.get("persist_state_modes", 2))
        self.gate = Gate(meta.get("gate"))
        super().__init__(stream or FeatureStream(window_s=float(meta.get("window_s", 60.0))), batch_windows, batch_s)
        self._top = {k: _Top(FEATURES[k]) for k in KINDS}
        self.stats = {"windows": 0, "rows": 0, "gated": 0, "batches": 0, "held_for_persistence": 0}

    def reset(self) -> None:
        super().reset()
        self.stats = dict.fromkeys(self.stats, 0)

    def score_batch(self, ws: list[WindowFeatures]) -> list[Finding]:
        st = self.stats
        st["windows"] += len(ws)
        st["batches"] += 1
        hits: dict[int, list[tuple[str, int, str, float]]] = {}  # window -> (kind, row, mode, p)
        for kind in KINDS:
            model = self.models.get(kind)
            mats = [w.gpu for w in ws] if kind == "gpu" else [w.port for w in ws] if kind == "port" \
                else [w.host_row for w in ws]  # host: one row per window
            sizes = [m.shape[0] for m in mats] if kind != "host" else [1] * len(mats)
            n = sum(sizes)
            st["rows"] += n
            if model is None or n == 0:
                continue
            m = np.concatenate(mats) if kind != "host" else np.array(mats).reshape(n, -1)
            g = np.flatnonzero(self.gate.mask(kind, m))
            if g.size == 0:
                continue
            st["gated"] += int(g.size)
            p = model.predict_proba(m[g])
            owner = np.repeat(np.arange(len(ws)), sizes)[g]
            start = np.cumsum([0, *sizes[:-1]])
            classes = model.classes_
            for r, i, c, prob in zip(g.tolist(), owner.tolist(), p.argmax(axis=1).tolist(), p.max(axis=1).tolist(),
                                     strict=True):
                mode = str(classes[c])
                if mode != FailureMode.HEALTHY and prob >= self.threshold:
                    hits.setdefault(i, []).append((kind, r - int(start[i]), mode, prob))
        out: list[Finding] = []
        for i, w in enumerate(ws):  # in window order: state modes must persist across a host's windows
            if i not in hits:
                self.advance(w.host, ())
                continue
            h = [(kind, window_rows(w)[kind], row, mode, prob) for kind, row, mode, prob in hits.get(i, ())]
            seen = self.advance(w.host, [(kind, ids[row], mode) for kind, (ids, _), row, mode, _ in h
                                         if mode in STATE_MODES])
            for kind, (ids, m), row, mode, prob in h:
                if mode in STATE_MODES and seen[(kind, ids[row], mode)] < self.persist:
                    st["held_for_persistence"] += 1
                    continue
                out.append(self._decide(w, kind, ids[row], m[row], mode, prob))
        return out

    def _decide(self, w: WindowFeatures, kind: str, comp: str, row: np.ndarray, mode: str, p: float) -> Finding:
        comp = comp if kind != "host" or mode.startswith("host_dram") else "host"
        if kind == "gpu" and mode.startswith("pcie_"):
            comp = pci_of_gpu(w, comp)  # PCIe modes name the device's PCI address, as the rules do
        return self._finding(w, comp, mode, p, self._top[kind].evidence(row, w.ts))

    def _finding(self, w: WindowFeatures, comp: str, mode: str, p: float, ev: list[Evidence]) -> Finding:
        info = MODES[FailureMode(mode)]
        actions = [a.value for a in info.actions] if p >= self.drain_threshold else ["ticket"]
        ev.append(Evidence(fact=f"classifier p({mode})={p:.3f} on window {w.t0:.0f}-{w.ts:.0f}", ts=w.ts))
        return Finding(host=w.host, component=comp, failure_mode=mode, severity=info.severity.value,
                       confidence=round(min(p, 0.999), 4), detector=self.name, ts=w.ts, evidence=ev,
                       recommended_action=actions, cluster=w.cluster, rack=w.rack)


__all__ = ["FEATURES", "KINDS", "SupervisedDetector", "window_rows", "HI"]
