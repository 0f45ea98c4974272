"""Fit the ML detectors on labelled simulated fleets and measure them on a held-out seed (no I/O
beyond what the fleet source does; saving is :mod:`detectors.ml.model_io`)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sklearn
from sklearn.ensemble import HistGradientBoostingClassifier, IsolationForest

from detectors.ml.features import FEATURE_SPEC, FeatureStream, WindowFeatures
from detectors.ml.gate import Gate, learn_gate
from detectors.ml.labels import HEALTHY, Fault, FaultIndex
from detectors.ml.peers import FLOORS, PEER_FEATURES, PeerDetector, PeerModel
from detectors.ml.supervised import FEATURES, KINDS, SupervisedDetector, single_threaded, window_rows

MODEL_VERSION = "1"
# The forest confirms an envelope breach: the row must also score below this quantile of healthy rows.
# Not stricter: an isolation forest's score saturates outside the training range, so a single
# feature far out (a GPU 15 °C hot) scores only moderately low.
PEER_SCORE_QUANTILE = 0.05
EVAL_GRACE_S = 600.0  # findings this long after a fault's recorded end still count as that fault
SUPERVISED_NAME = "fault_classifier"
PEER_NAME = "peer_anomaly"

# (seed, hosts, duration_s, interval_s, fault_rate) -> (samples in time order, ground truth)
FleetSource = Callable[[int, int, float, float, float], tuple[Iterable[Any], list[Fault]]]


@dataclass(slots=True)
class TrainConfig:
    hosts: int = 32
    duration_s: float = 6 * 3600.0
    interval_s: float = 10.0
    seeds: tuple[int, ...] = (1, 2)
    holdout_seed: int = 99
    fault_rate: float = 200.0
    scenario: str = "training"  # the simulator scenario of the fleets (recorded; the loader simulates them)
    window_s: float = 60.0
    threshold: float = 0.9
    drain_threshold: float = 0.97
    envelope_k: float = 2.0
    persist: int = 3
    max_iter: int = 60  # boosting rounds per class
    command: str = ""  # how these models were made, recorded in the sidecars


@dataclass(slots=True)
class Fleet:
    windows: list[WindowFeatures]
    faults: FaultIndex
    samples: int
    first_ts: float = 0.0
    last_ts: float = 0.0


@dataclass(slots=True)
class TrainResult:
    supervised: dict[str, Any]
    supervised_meta: dict[str, Any]
    peer: dict[str, Any]
    peer_meta: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)


def windows_of(samples: Iterable[Any], window_s: float, tick: Callable[[], None] | None = None) -> Fleet:
    stream = FeatureStream(window_s=window_s)
    out: list[WindowFeatures] = []
    n = 0
    first = last = 0.0
    for s in samples:
        n += 1
        first = first or s.ts
        last = max(last, s.ts)
        w = stream.feed(s)
        if w is not None:
            out.append(w)
        if tick is not None:
            tick()
    return Fleet(out, FaultIndex([]), n, first, last)


def _all_faults(fl: Fleet) -> list[Fault]:
    return [f for fs in fl.faults.by_host.values() for f in fs]


def healthy_rows(fleets: list[Fleet]) -> dict[str, np.ndarray]:
    """Every row whose training label is healthy, per kind (what the gate learns the noise from)."""
    xs: dict[str, list[np.ndarray]] = defaultdict(list)
    for fl in fleets:
        idx = FaultIndex(_all_faults(fl), training=True)
        for w in fl.windows:
            labels = idx.labels(w)
            quiet_host = all(lab == HEALTHY for v in labels.values() for lab in v)
            for kind, (_, m) in window_rows(w).items():
                ok = np.array([lab == HEALTHY for lab in labels[kind]], dtype=bool)
                if kind == "host":  # the host row sums its GPUs' AER lines: healthy only if all are
                    ok &= quiet_host
                if ok.any():
                    xs[kind].append(m[ok])
    return {k: np.vstack(v) for k, v in xs.items()}


def supervised_rows(fleets: list[Fleet], gate: Gate) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Gated rows with a training label, per kind (quiet rows are healthy by construction; rows
    whose label is ambiguous — see :mod:`detectors.ml.labels` — are left out)."""
    xs: dict[str, list[np.ndarray]] = defaultdict(list)
    ys: dict[str, list[str]] = defaultdict(list)
    for fl in fleets:
        idx = FaultIndex(_all_faults(fl), training=True)
        for w in fl.windows:
            labels = idx.labels(w)
            for kind, (_, m) in window_rows(w).items():
                g = gate.mask(kind, m)
                keep = [i for i in np.flatnonzero(g) if labels[kind][i] is not None]
                if keep:
                    xs[kind].append(m[keep])
                    ys[kind].extend(str(labels[kind][i]) for i in keep)
    return {k: (np.vstack(xs[k]), np.array(ys[k])) for k in KINDS if xs[k]}


def _class_weights(y: np.ndarray) -> dict[str, float]:
    """Rare faults (a UCE leaves one window) weigh up to 10x, by the square root of their rarity;
    healthy rows keep weight 1, so precision is not traded away."""
    counts = Counter(y.tolist())
    top = max(counts.values())
    return {c: 1.0 if c == HEALTHY else float(min(10.0, np.sqrt(top / n))) for c, n in counts.items()}


def fit_supervised(rows: dict[str, tuple[np.ndarray, np.ndarray]], seed: int, max_iter: int = 60,
                   min_leaf: int = 5) -> dict[str, Any]:
    models: dict[str, Any] = {}
    for kind, (x, y) in rows.items():
        if len(set(y.tolist())) < 2:
            continue  # nothing to tell apart: every gated row is one class
        clf = HistGradientBoostingClassifier(max_iter=max_iter, learning_rate=0.15, max_leaf_nodes=8,
                                             min_samples_leaf=min_leaf, l2_regularization=1.0,
                                             early_stopping=False, random_state=seed)
        cw = _class_weights(y)
        models[kind] = clf.fit(x, y, sample_weight=np.array([cw[c] for c in y.tolist()]))
    return models


def _healthy_deviations(fleets: list[Fleet], slopes: dict[str, float]) -> dict[str, np.ndarray]:
    """Deviation vectors of components labelled healthy in their window (rack rows: whole host healthy)."""
    dev: dict[str, list[np.ndarray]] = defaultdict(list)
    racks = PeerDetector({}, {"slopes": slopes})
    for fl in fleets:
        idx = FaultIndex(_all_faults(fl), training=True)
        for w in fl.windows:
            d = racks.deviations(w)
            labels = idx.labels(w)
            ok = {k: np.array([lab == HEALTHY for lab in v], dtype=bool) for k, v in labels.items()}
            for kind in ("gpu", "port"):
                if d[kind][1].shape[0] and ok[kind].any():
                    dev[kind].append(d[kind][1][ok[kind]])
            if "rack" in d and all(v.all() for v in ok.values()):
                dev["rack"].append(d["rack"][1])
    return {k: np.vstack(v) for k, v in dev.items()}


def _util_slopes(fleets: list[Fleet]) -> dict[str, float]:
    """Least-squares °C and W per % utilisation difference between GPUs of one host (healthy hosts)."""
    from detectors.ml.features import GI

    rows = [w.gpu for fl in fleets for w in fl.windows if w.host not in fl.faults.faulty_hosts() and w.gpu.shape[0]]
    if not rows:
        return {"temp_per_util": 0.0, "power_per_util": 0.0}
    m = np.vstack(rows)
    u = m[:, GI["util_dev"]]
    den = float((u * u).sum())
    if den == 0.0:
        return {"temp_per_util": 0.0, "power_per_util": 0.0}
    return {"temp_per_util": round(float((u * m[:, GI["temp_dev"]]).sum()) / den, 6),
            "power_per_util": round(float((u * m[:, GI["power_dev"]]).sum()) / den, 6)}


def fit_peer(fleets: list[Fleet], cfg: TrainConfig, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    slopes = _util_slopes(fleets)
    healthy = _healthy_deviations(fleets, slopes)
    forests: dict[str, Any] = {}
    kinds: dict[str, Any] = {}
    for kind, names in PEER_FEATURES.items():
        x = healthy.get(kind)
        if x is None or x.shape[0] < 50:
            continue
        q = np.quantile(np.abs(x), 0.999, axis=0)
        limit = np.maximum(cfg.envelope_k * q, np.array(FLOORS[kind]))
        forest = IsolationForest(n_estimators=50, max_samples=min(256, x.shape[0]), random_state=seed).fit(x)
        thr = float(np.quantile(forest.score_samples(x), PEER_SCORE_QUANTILE))
        forests[kind] = forest
        kinds[kind] = {"names": list(names), "limit": [round(float(v), 6) for v in limit], "score_thr": thr,
                       "healthy_rows": int(x.shape[0])}
    return forests, {"slopes": slopes, "kinds": kinds, "persist": cfg.persist}


def peer_models(forests: dict[str, Any], meta: dict[str, Any]) -> dict[str, PeerModel]:
    out = {}
    for kind, k in meta.get("kinds", {}).items():
        out[kind] = PeerModel(tuple(k["names"]), np.array(k["limit"], dtype=float), forests.get(kind),
                              float(k["score_thr"]))
    return out


def evaluate(sup: SupervisedDetector | None, peer: PeerDetector | None, fleet: Fleet) -> dict[str, Any]:
    """Per mode: window precision, episode recall (a fault counts as found when any window of its
    component during the fault carries a finding of its mode), and findings on healthy hosts."""
    faulty = fleet.faults.faulty_hosts()
    lenient = FaultIndex(_all_faults(fleet), grace_s=EVAL_GRACE_S)
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    explained: Counter[str] = Counter()
    found: set[tuple[str, str, str]] = set()
    healthy_hosts_flagged: dict[str, set[str]] = {"supervised": set(), "peer": set()}
    peer_fp = peer_tp = 0
    for w in fleet.windows:
        labels, also = lenient.labels(w), lenient.explained(w)
        by_comp: dict[str, tuple[str | None, set[str]]] = {}
        for kind, (ids, _) in window_rows(w).items():
            for cid, lab, ex in zip(ids, labels[kind], also[kind], strict=True):
                by_comp[cid] = (lab, ex)
        for cid, pci in zip(w.gpu_ids, w.gpu_pci, strict=False):  # PCIe findings name the PCI address
            if pci and cid in by_comp:
                by_comp[pci] = by_comp[cid]
        host_lab = (labels["host"][0], also["host"][0])
        for name, det in (("supervised", sup), ("peer", peer)):
            if det is None:
                continue
            for f in det.score_window(w):
                truth, ex = by_comp.get(f.component, host_lab)
                if w.host not in faulty:
                    healthy_hosts_flagged[name].add(w.host)
                if name == "peer":  # on a faulty part, or in the corrected-error ramp before its UCE
                    on = truth != HEALTHY or bool(ex)
                    peer_tp += on
                    peer_fp += not on
                    continue
                if truth == f.failure_mode:
                    tp[f.failure_mode] += 1
                    found.add((w.host, f.component, f.failure_mode))
                elif f.failure_mode in ex:  # a secondary mode, or the storm before a UCE
                    explained[f.failure_mode] += 1
                else:
                    fp[f.failure_mode] += 1
    support: Counter[str] = Counter()
    hit: Counter[str] = Counter()
    for host, faults in fleet.faults.by_host.items():
        for fault in faults:
            support[fault.failure_mode] += 1
            if any(h == host and m == fault.failure_mode for h, _, m in found):
                hit[fault.failure_mode] += 1
    modes = sorted(set(support) | set(tp) | set(fp))
    per_mode = {m: {"precision": round(tp[m] / (tp[m] + fp[m]), 4) if tp[m] + fp[m] else None,
                    "recall": round(hit[m] / support[m], 4) if support[m] else None,
                    "support": support[m], "true_windows": tp[m], "false_windows": fp[m],
                    "explained_windows": explained[m]} for m in modes}
    all_tp, all_fp = sum(tp.values()), sum(fp.values())
    return {"per_mode": per_mode,
            "precision": round(all_tp / (all_tp + all_fp), 4) if all_tp + all_fp else None,
            "recall": round(sum(hit.values()) / sum(support.values()), 4) if support else None,
            "healthy_hosts_with_findings": {k: len(v) for k, v in healthy_hosts_flagged.items()},
            "peer_findings": {"on_faulty_components": peer_tp, "on_healthy_components": peer_fp},
            "windows": len(fleet.windows), "samples": fleet.samples}


def train(cfg: TrainConfig, load: Callable[[int], Fleet]) -> TrainResult:
    """Fit both detectors on ``cfg.seeds`` and measure them on ``cfg.holdout_seed``."""
    single_threaded()
    fleets = [load(seed) for seed in cfg.seeds]
    seed = cfg.seeds[0] if cfg.seeds else 0
    gate = learn_gate(healthy_rows(fleets))
    rows = supervised_rows(fleets, gate)
    sup = fit_supervised(rows, seed, cfg.max_iter)
    forests, peer_extra = fit_peer(fleets, cfg, seed)
    data_end = max((fl.last_ts for fl in fleets), default=0.0)
    common = {"version": MODEL_VERSION, "feature_spec": FEATURE_SPEC, "window_s": cfg.window_s,
              "sklearn_version": sklearn.__version__, "numpy_version": np.__version__,
              "trained_on": {"seeds": list(cfg.seeds), "hosts": cfg.hosts, "duration_s": cfg.duration_s,
                             "interval_s": cfg.interval_s, "fault_rate": cfg.fault_rate, "scenario": cfg.scenario,
                             "samples": sum(fl.samples for fl in fleets),
                             "windows": sum(len(fl.windows) for fl in fleets),
                             "data_end_ts": data_end, "command": cfg.command},
              "holdout_seed": cfg.holdout_seed}
    sup_meta = {**common, "name": SUPERVISED_NAME, "threshold": cfg.threshold,
                "drain_threshold": cfg.drain_threshold, "features": {k: list(FEATURES[k]) for k in KINDS},
                "gate": gate.to_json(), "max_iter": cfg.max_iter,
                "classes": {k: [str(c) for c in m.classes_] for k, m in sup.items()},
                "rows": {k: {"n": int(x.shape[0]), "labels": dict(Counter(y.tolist()))} for k, (x, y) in rows.items()}}
    peer_meta = {**common, **peer_extra, "name": PEER_NAME, "features": {k: list(v) for k, v in PEER_FEATURES.items()}}
    result = TrainResult(sup, sup_meta, forests, peer_meta)
    holdout = load(cfg.holdout_seed)
    result.metrics = evaluate(SupervisedDetector(sup, sup_meta), PeerDetector(peer_models(forests, peer_meta),
                                                                               peer_meta), holdout)
    sup_meta["metrics"] = peer_meta["metrics"] = result.metrics
    return result
