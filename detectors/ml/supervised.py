"""The supervised classifier: per-component windows -> failure mode, trained on simulated fleets.

One HistGradientBoostingClassifier per component kind (GPU, network port, host). A row is only
scored when its *gate* is open — some error counter, flag, Xid, throttle bit or link downshift is
non-zero, or the temperature is out of line — because a quiet window is healthy by construction and
skipping it keeps sklearn off the hot path. Training uses the same gate, so what the model learned
and what it is asked match.

Precision first: a finding needs the top class's probability >= ``threshold`` (from the sidecar,
0.9 by default); it recommends the failure mode's default actions (drain included) only at
``drain_threshold`` and above, and a ticket otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.finding import Finding
from detectors.ml.features import (
    GI,
    GPU_FEATURES,
    HI,
    HOST_FEATURES,
    PI,
    PORT_FEATURES,
    FeatureStream,
    WindowFeatures,
)
from fleethealth.schema import Evidence, Sample
from fleethealth.taxonomy import MODES, FailureMode

KINDS = ("gpu", "port", "host")
FEATURES: dict[str, tuple[str, ...]] = {"gpu": GPU_FEATURES, "port": PORT_FEATURES, "host": HOST_FEATURES}
_GAUGES = {"temp_c", "temp_dev", "temp_z", "power_w", "power_dev", "util_pct", "util_dev",
           "pcie_gen_ratio", "pcie_width_ratio"}
_GPU_QUIET = np.array([i for n, i in GI.items() if n not in _GAUGES])
_PORT_QUIET = np.array([i for n, i in PI.items() if n not in ("rate_ratio", "symbol_dev")])


def gate(kind: str, m: np.ndarray) -> np.ndarray:
    """Boolean mask of rows worth scoring: anything but a quiet, in-line window."""
    if m.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    if kind == "gpu":
        return ((m[:, _GPU_QUIET] != 0).any(axis=1) | (m[:, GI["temp_c"]] >= 85.0)
                | (np.abs(m[:, GI["temp_z"]]) >= 4.0))
    if kind == "port":
        return (m[:, _PORT_QUIET] != 0).any(axis=1) | (m[:, PI["rate_ratio"]] < 0.99)
    return (m != 0).any(axis=1)


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


class SupervisedDetector:
    """``feed(sample) -> list[Finding]`` from the trained per-kind classifiers."""

    def __init__(self, estimators: dict[str, Any], meta: dict[str, Any], stream: FeatureStream | None = None) -> None:
        single_threaded()
        self.models = estimators
        self.meta = meta
        self.version = str(meta.get("version", "0"))
        self.name = f"model:{meta.get('name', 'fault_classifier')}@{self.version}"
        self.threshold = float(meta.get("threshold", 0.9))
        self.drain_threshold = float(meta.get("drain_threshold", 0.97))
        self.stream = stream or FeatureStream(window_s=float(meta.get("window_s", 60.0)))
        self._top = {k: _Top(FEATURES[k]) for k in KINDS}

    def reset(self) -> None:
        self.stream.reset()

    def feed(self, sample: Sample) -> list[Finding]:
        w = self.stream.feed(sample)
        return self.score_window(w) if w is not None else []

    def predict_rows(self, kind: str, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(label index into classes_, probability) per row; ungated rows are healthy with p=1."""
        n = m.shape[0]
        labels = np.full(n, -1)
        probs = np.ones(n)
        g = gate(kind, m)
        model = self.models.get(kind)
        if model is not None and g.any():
            p = model.predict_proba(m[g])
            labels[g] = p.argmax(axis=1)
            probs[g] = p.max(axis=1)
        return labels, probs

    def score_window(self, w: WindowFeatures) -> list[Finding]:
        out: list[Finding] = []
        for kind, (ids, m) in window_rows(w).items():
            labels, probs = self.predict_rows(kind, m)
            for i in np.flatnonzero(labels >= 0):
                mode = str(self.models[kind].classes_[labels[i]])
                if mode == FailureMode.HEALTHY or probs[i] < self.threshold:
                    continue
                comp = ids[i] if kind != "host" or mode.startswith("host_dram") else "host"
                out.append(self._finding(w, comp, mode, float(probs[i]), self._top[kind].evidence(m[i], w.ts)))
        return out

    def _finding(self, w: WindowFeatures, comp: str, mode: str, p: float, ev: list[Evidence]) -> Finding:
        info = MODES[FailureMode(mode)]
        actions = [a.value for a in info.actions] if p >= self.drain_threshold else ["ticket"]
        ev.append(Evidence(fact=f"classifier p({mode})={p:.3f} on window {w.t0:.0f}-{w.ts:.0f}", ts=w.ts))
        return Finding(host=w.host, component=comp, failure_mode=mode, severity=info.severity.value,
                       confidence=round(min(p, 0.999), 4), detector=self.name, ts=w.ts, evidence=ev,
                       recommended_action=actions, cluster=w.cluster, rack=w.rack)


__all__ = ["FEATURES", "KINDS", "SupervisedDetector", "gate", "window_rows", "HI"]
