"""Unsupervised peer comparison (in the spirit of ByteDance's Minder): a component far from its peers.

Peers are the other GPUs of the host, the other network ports of the host, and the other hosts of
the rack. Each window turns a component into a *deviation vector* — its value minus the peers'
median, on log rates for counters — so load, ambient temperature and workload cancel out. Then:

1. an *envelope* learned on healthy training windows: per deviation feature, ``k`` times its 99.9th
   percentile on healthy data, and never below an absolute floor (8 °C, one e-fold of rate ...);
2. an IsolationForest fitted on healthy deviation vectors confirms the row is unusual as a whole
   (``score_samples`` below the healthy 5th percentile: the forest's score saturates outside its
   training range, so it confirms rather than decides);
3. the outlier must persist ``persist`` consecutive windows (3 by default).

Only rows outside the envelope reach the forest, so sklearn stays off the hot path. A finding names
the closest failure mode of its most deviant feature but always recommends a ticket — never a
drain — and carries confidence <= 0.9: see docs/detectors.md, "ML".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detectors.finding import Finding
from detectors.ml.features import GI, HI, PI, PORT_COUNTERS, FeatureStream, WindowFeatures
from fleethealth.schema import Evidence, Sample

GPU_RATES = ("dram_ce_rate", "sram_ce_rate", "pcie_replay_rate", "aer_cor_rate", "nvlink_crc_rate",
             "nvlink_replay_rate", "nvlink_recovery_rate")
PEER_FEATURES: dict[str, tuple[str, ...]] = {
    "gpu": ("temp_adj", "power_adj", *(f"{r}_dev" for r in GPU_RATES)),
    "port": (*(f"{c}_dev" for c in PORT_COUNTERS), "rate_deficit"),
    "rack": ("gpu_temp_mean_dev", "edac_ce_dev", "port_err_dev"),
}
FLOORS: dict[str, tuple[float, ...]] = {
    "gpu": (8.0, 60.0, *(1.0,) * len(GPU_RATES)),
    "port": (*(0.7,) * len(PORT_COUNTERS), 0.25),
    "rack": (8.0, 1.0, 1.0),
}
MODE_OF: dict[str, str] = {
    "temp_adj": "gpu_thermal", "power_adj": "gpu_hw_error", "dram_ce_rate_dev": "gpu_ecc_sbe_storm",
    "sram_ce_rate_dev": "gpu_ecc_sbe_storm", "pcie_replay_rate_dev": "pcie_link_degraded",
    "aer_cor_rate_dev": "pcie_link_degraded", "nvlink_crc_rate_dev": "gpu_nvlink_error",
    "nvlink_replay_rate_dev": "gpu_nvlink_error", "nvlink_recovery_rate_dev": "gpu_nvlink_error",
    "rate_deficit": "net_link_bad_cable", "gpu_temp_mean_dev": "gpu_thermal", "edac_ce_dev": "host_dram_ce_storm",
    "port_err_dev": "net_link_bad_cable",
    **{f"{c}_dev": "net_link_bad_cable" for c in PORT_COUNTERS},
}
_GPU_RATE_COLS = [GI[r] for r in GPU_RATES]
_PORT_RATE_COLS = [PI[f"{c}_rate"] for c in PORT_COUNTERS]


def _med_dev(x: np.ndarray) -> np.ndarray:
    return x - np.median(x, axis=0) if x.shape[0] >= 3 else np.zeros_like(x)


def gpu_deviations(m: np.ndarray, slopes: dict[str, float]) -> np.ndarray:
    if m.shape[0] < 3:
        return np.zeros((m.shape[0], len(PEER_FEATURES["gpu"])))
    util = m[:, GI["util_dev"]]
    temp = m[:, GI["temp_dev"]] - slopes.get("temp_per_util", 0.0) * util
    power = m[:, GI["power_dev"]] - slopes.get("power_per_util", 0.0) * util
    rates = _med_dev(np.log1p(m[:, _GPU_RATE_COLS]))
    return np.column_stack([temp, power, rates])


def port_deviations(m: np.ndarray) -> np.ndarray:
    rates = _med_dev(np.log1p(m[:, _PORT_RATE_COLS]))
    deficit = 1.0 - m[:, PI["rate_ratio"]] if m.shape[0] >= 3 else np.zeros(m.shape[0])
    return np.column_stack([rates, deficit])


def host_summary(w: WindowFeatures) -> np.ndarray:
    """One host's rack-comparison vector: mean GPU temperature, log EDAC CE rate, log port errors."""
    t = float(w.gpu[:, GI["temp_c"]].mean()) if w.gpu.shape[0] else 0.0
    pe = float(np.log1p(w.port[:, _PORT_RATE_COLS].sum(axis=1)).max()) if w.port.shape[0] else 0.0
    return np.array([t, float(np.log1p(w.host_row[HI["edac_ce_rate"]])), pe])


@dataclass(slots=True)
class PeerModel:
    """What training learned for one kind: envelope, forest, score threshold."""

    names: tuple[str, ...]
    limit: np.ndarray  # per feature: max(k * healthy 99.9th pct of |dev|, floor)
    forest: Any = None
    score_thr: float = -np.inf

    def outliers(self, dev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask of flagged rows, index of the most deviant feature per row)."""
        ratio = np.abs(dev) / self.limit
        over = (ratio > 1.0).any(axis=1)
        top = ratio.argmax(axis=1)
        if over.any() and self.forest is not None:
            scores = self.forest.score_samples(dev[over])
            over[np.flatnonzero(over)] = scores < self.score_thr
        return over, top


@dataclass(slots=True)
class _RackView:
    hosts: dict[str, tuple[float, np.ndarray]] = field(default_factory=dict)


class PeerDetector:
    """``feed(sample) -> list[Finding]``: components out of line with their peers, persistently."""

    def __init__(self, models: dict[str, PeerModel], meta: dict[str, Any], stream: FeatureStream | None = None,
                 persist: int | None = None) -> None:
        self.models = models
        self.meta = meta
        self.version = str(meta.get("version", "0"))
        self.name = f"model:{meta.get('name', 'peer_anomaly')}@{self.version}"
        self.slopes: dict[str, float] = dict(meta.get("slopes", {}))
        self.persist = int(persist if persist is not None else meta.get("persist", 3))
        self.stream = stream or FeatureStream(window_s=float(meta.get("window_s", 60.0)))
        self.racks: dict[str, _RackView] = {}
        self.streak: dict[tuple[str, str], int] = {}

    def reset(self) -> None:
        self.stream.reset()
        self.racks.clear()
        self.streak.clear()

    def feed(self, sample: Sample) -> list[Finding]:
        w = self.stream.feed(sample)
        return self.score_window(w) if w is not None else []

    def flush(self) -> list[Finding]:
        """Nothing is buffered: the forest only confirms rare envelope breaches, scored at once."""
        return []

    def deviations(self, w: WindowFeatures) -> dict[str, tuple[list[str], np.ndarray]]:
        out = {"gpu": (w.gpu_ids, gpu_deviations(w.gpu, self.slopes)), "port": (w.port_ids, port_deviations(w.port))}
        if w.rack:
            view = self.racks.setdefault(f"{w.cluster}/{w.rack}", _RackView())
            view.hosts[w.host] = (w.ts, host_summary(w))
            fresh = [v for t, v in view.hosts.values() if w.ts - t <= 600.0]
            if len(fresh) >= 4:
                med = np.median(np.vstack(fresh), axis=0)
                out["rack"] = (["host"], (view.hosts[w.host][1] - med).reshape(1, -1))
        return out

    def score_window(self, w: WindowFeatures) -> list[Finding]:
        found: list[Finding] = []
        seen: set[tuple[str, str]] = set()
        for kind, (ids, dev) in self.deviations(w).items():
            model = self.models.get(kind)
            if model is None or dev.shape[0] == 0:
                continue
            over, top = model.outliers(dev)
            for i in np.flatnonzero(over):
                key = (w.host, f"{kind}:{ids[i]}")
                seen.add(key)
                n = self.streak[key] = self.streak.get(key, 0) + 1
                if n >= self.persist:
                    found.append(self._finding(w, kind, ids[i], dev[i], model, int(top[i]), n))
        for key in [k for k in self.streak if k[0] == w.host and k not in seen]:
            del self.streak[key]
        return found

    def _finding(self, w: WindowFeatures, kind: str, comp: str, dev: np.ndarray, model: PeerModel, j: int,
                 n: int) -> Finding:
        feat = model.names[j]
        excess = float(abs(dev[j]) / model.limit[j])
        conf = round(min(0.9, 0.5 + 0.1 * excess + 0.02 * n), 4)
        peers = {"gpu": "the host's other GPUs", "port": "the host's other ports", "rack": "the rack's hosts"}[kind]
        ev = [Evidence(fact=f"{feat} = {dev[j]:+.3g} vs the median of {peers} (healthy limit ±{model.limit[j]:.3g}), "
                            f"{n} windows in a row", ts=w.ts),
              Evidence(fact="peer-comparison anomaly: investigate; not a drain signal on its own", ts=w.ts)]
        return Finding(host=w.host, component=comp, failure_mode=MODE_OF[feat], severity="minor", confidence=conf,
                       detector=self.name, ts=w.ts, evidence=ev, recommended_action=["ticket"],
                       cluster=w.cluster, rack=w.rack)
