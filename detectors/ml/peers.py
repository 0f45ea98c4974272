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

Only rows outside the envelope reach the forest, so sklearn stays off the hot path; windows are
scored in batches across hosts (see :class:`PeerDetector`), so numpy's per-call cost is paid per
batch, not per window. A finding names
the closest failure mode of its most deviant feature but always recommends a ticket — never a
drain — and carries confidence <= 0.9: see docs/detectors.md, "ML".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detectors.engine.finding import Finding
from detectors.ml.batching import WindowBatcher
from detectors.ml.features import (
    GI,
    HI,
    PI,
    PORT_COUNTERS,
    PORT_RATES,
    FeatureStream,
    WindowFeatures,
    pci_of_gpu,
)
from fleethealth.schema import Evidence

# NVLink by its worst link against the limit, not the sum of flit and data CRC errors: a busy healthy
# NVLink retries tens of flits a minute, far out of line with its idle peers and still healthy.
GPU_RATES = ("dram_ce_x", "sram_ce_rate", "pcie_replay_x", "aer_cor_rate", "nvlink_worst_link_x",
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
    "temp_adj": "gpu_thermal", "power_adj": "gpu_hw_error", "dram_ce_x_dev": "gpu_ecc_sbe_storm",
    "sram_ce_rate_dev": "gpu_ecc_sbe_storm", "pcie_replay_x_dev": "pcie_link_degraded",
    "aer_cor_rate_dev": "pcie_link_degraded", "nvlink_worst_link_x_dev": "gpu_nvlink_error",
    "nvlink_replay_rate_dev": "gpu_nvlink_error", "nvlink_recovery_rate_dev": "gpu_nvlink_error",
    "rate_deficit": "net_link_bad_cable", "gpu_temp_mean_dev": "gpu_thermal", "edac_ce_dev": "host_dram_ce_storm",
    "port_err_dev": "net_link_bad_cable",
    **{f"{c}_dev": "net_link_bad_cable" for c in PORT_COUNTERS},
}
_GPU_RATE_COLS = [GI[r] for r in GPU_RATES]
_PORT_RATE_COLS = [PI[n] for n in PORT_RATES]


def _med_dev(x: np.ndarray) -> np.ndarray:
    """Deviation from the peers' median along the component axis (-2): (..., n, f) -> same shape;
    zeros with fewer than 3 peers (no majority to compare with)."""
    if x.shape[-2] < 3:
        return np.zeros_like(x)
    return x - np.median(x, axis=-2, keepdims=True)


def gpu_deviations(m: np.ndarray, slopes: dict[str, float]) -> np.ndarray:
    """GPU rows -> deviation vectors: ``m`` is one host's (n_gpus, features) or a stack of hosts
    with the same GPU count, (hosts, n_gpus, features)."""
    if m.shape[-2] < 3:
        return np.zeros((*m.shape[:-1], len(PEER_FEATURES["gpu"])))
    util = m[..., GI["util_dev"]]
    out = np.empty((*m.shape[:-1], len(PEER_FEATURES["gpu"])))
    out[..., 0] = m[..., GI["temp_dev"]] - slopes.get("temp_per_util", 0.0) * util
    out[..., 1] = m[..., GI["power_dev"]] - slopes.get("power_per_util", 0.0) * util
    out[..., 2:] = _med_dev(np.log1p(m[..., _GPU_RATE_COLS]))
    return out


def port_deviations(m: np.ndarray) -> np.ndarray:
    """Port rows -> deviation vectors; (n_ports, features) or (hosts, n_ports, features)."""
    out = np.empty((*m.shape[:-1], len(PEER_FEATURES["port"])))
    out[..., :-1] = _med_dev(np.log1p(m[..., _PORT_RATE_COLS]))
    out[..., -1] = 1.0 - m[..., PI["rate_ratio"]] if m.shape[-2] >= 3 else 0.0
    return out


_KIND_ORDER = {"gpu": 0, "port": 1, "rack": 2}


def _stack(mats: list[np.ndarray]) -> np.ndarray:
    """``np.stack`` of same-shape 2-D arrays, by one concatenation (np.stack costs Python work per
    array: a batch holds hundreds)."""
    return np.concatenate(mats).reshape(len(mats), *mats[0].shape)


def _groups(mats: list[np.ndarray]) -> dict[int, list[int]]:
    """Window positions by component count, so each group stacks into one (hosts, n, f) array."""
    out: dict[int, list[int]] = {}
    for i, m in enumerate(mats):
        out.setdefault(m.shape[0], []).append(i)
    return out


@dataclass(slots=True)
class PeerModel:
    """What training learned for one kind: envelope, forest, score threshold."""

    names: tuple[str, ...]
    limit: np.ndarray  # per feature: max(k * healthy 99.9th pct of |dev|, floor)
    forest: Any = None
    score_thr: float = -np.inf


@dataclass(slots=True)
class _RackView:
    hosts: dict[str, tuple[float, np.ndarray]] = field(default_factory=dict)


@dataclass(slots=True)
class _Flag:
    """One component outside its peers' envelope and confirmed by the forest."""

    kind: str
    comp: str
    dev: np.ndarray
    top: int


class PeerDetector(WindowBatcher):
    """``feed(sample) -> list[Finding]``: components out of line with their peers, persistently.

    Windows are scored in batches across hosts (:mod:`detectors.ml.batching`): one stacked array
    per component count and kind (numpy over a whole batch costs about what it costs over one
    window). Rack rows compare a host with the median
    of its rack's fresh hosts as the batch leaves them; a batch of one window is the sequential
    definition that training uses."""

    def __init__(self, models: dict[str, PeerModel], meta: dict[str, Any], stream: FeatureStream | None = None,
                 persist: int | None = None, *, batch_windows: int = 1024, batch_s: float = 60.0) -> None:
        self.models = models
        self.meta = meta
        self.version = str(meta.get("version", "0"))
        self.name = f"model:{meta.get('name', 'peer_anomaly')}@{self.version}"
        self.slopes: dict[str, float] = dict(meta.get("slopes", {}))
        self.persist = int(persist if persist is not None else meta.get("persist", 3))
        super().__init__(stream or FeatureStream(window_s=float(meta.get("window_s", 60.0))), batch_windows, batch_s)
        self.racks: dict[str, _RackView] = {}
        self.stats = {"windows": 0, "batches": 0, "envelope": 0, "confirmed": 0}

    def reset(self) -> None:
        super().reset()
        self.racks.clear()
        self.stats = dict.fromkeys(self.stats, 0)

    def forget_host(self, host: str) -> None:
        super().forget_host(host)
        for view in self.racks.values():
            view.hosts.pop(host, None)

    def deviations(self, w: WindowFeatures) -> dict[str, tuple[list[str], np.ndarray]]:
        """One window's deviation vectors per kind (rack: against the rack's fresh hosts, this one
        included): the definition training learns the envelope from."""
        out = {"gpu": (w.gpu_ids, np.zeros((0, len(PEER_FEATURES["gpu"])))),
               "port": (w.port_ids, np.zeros((0, len(PEER_FEATURES["port"]))))}
        for kind, _, dev in self._deviation_groups([w]):
            out[kind] = (["host"] if kind == "rack" else w.gpu_ids if kind == "gpu" else w.port_ids, dev[0])
        return out

    def _deviation_groups(self, ws: list[WindowFeatures]) -> Iterator[tuple[str, list[int], np.ndarray]]:
        """(kind, window positions, deviations of shape (len(positions), n, features)): one stacked
        array per kind and component count; rack rows last (they need the GPU and port groups)."""
        summary = np.zeros((len(ws), 3))  # per window: mean GPU temperature, log EDAC CE rate, log port errors
        for n, idx in _groups([w.gpu for w in ws]).items():
            if n:
                m = _stack([ws[i].gpu for i in idx])
                summary[idx, 0] = m[:, :, GI["temp_c"]].mean(axis=1)
                yield "gpu", idx, gpu_deviations(m, self.slopes)
        for n, idx in _groups([w.port for w in ws]).items():
            if n:
                m = _stack([ws[i].port for i in idx])
                summary[idx, 2] = np.log1p(m[:, :, _PORT_RATE_COLS].sum(axis=2)).max(axis=1)
                yield "port", idx, port_deviations(m)
        summary[:, 1] = np.log1p([w.host_row[HI["edac_ce_rate"]] for w in ws])
        touched: dict[str, list[int]] = {}
        racks = self.racks
        for i, w in enumerate(ws):
            if w.rack:
                key = f"{w.cluster}/{w.rack}"
                view = racks.get(key)
                if view is None:
                    view = racks[key] = _RackView()
                view.hosts[w.host] = (w.ts, summary[i])
                if key in touched:
                    touched[key].append(i)
                else:
                    touched[key] = [i]
        for key, idx in touched.items():
            now = max(ws[i].ts for i in idx)
            fresh = [v for t, v in racks[key].hosts.values() if now - t <= 600.0]
            if len(fresh) >= 4:
                yield "rack", idx, (summary[idx] - np.median(np.array(fresh), axis=0))[:, None, :]

    def score_batch(self, ws: list[WindowFeatures]) -> list[Finding]:
        self.stats["windows"] += len(ws)
        self.stats["batches"] += 1
        flags: dict[int, list[_Flag]] = {}
        for kind, idx, dev in self._deviation_groups(ws):
            model = self.models.get(kind)
            if model is None:
                continue
            ratio = np.abs(dev) / model.limit
            over = (ratio > 1.0).any(axis=2)
            if not over.any():
                continue
            self.stats["envelope"] += int(over.sum())
            bi, ri = np.nonzero(over)
            if model.forest is not None:
                keep = model.forest.score_samples(dev[bi, ri]) < model.score_thr
                bi, ri = bi[keep], ri[keep]
            self.stats["confirmed"] += len(bi)
            tops = ratio[bi, ri].argmax(axis=1)
            for b, r, top in zip(bi.tolist(), ri.tolist(), tops.tolist(), strict=True):
                i = idx[b]
                w = ws[i]
                comp = w.gpu_ids[r] if kind == "gpu" else w.port_ids[r] if kind == "port" else "host"
                flags.setdefault(i, []).append(_Flag(kind, comp, dev[b, r], top))
        found: list[Finding] = []
        for i, w in enumerate(ws):  # streaks advance window by window, in order
            if i not in flags:
                self.advance(w.host, ())
                continue
            fl = sorted(flags[i], key=lambda f: _KIND_ORDER[f.kind])
            seen = self.advance(w.host, [(f.kind, f.comp) for f in fl])
            for f in fl:
                n = seen[(f.kind, f.comp)]
                if n >= self.persist:
                    found.append(self._finding(w, f.kind, f.comp, f.dev, self.models[f.kind], f.top, n))
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
        mode = MODE_OF[feat]
        if kind == "gpu" and mode.startswith("pcie_"):
            comp = pci_of_gpu(w, comp)  # PCIe modes name the device's PCI address, as the rules do
        return Finding(host=w.host, component=comp, failure_mode=mode, severity="minor", confidence=conf,
                       detector=self.name, ts=w.ts, evidence=ev, recommended_action=["ticket"],
                       cluster=w.cluster, rack=w.rack)
