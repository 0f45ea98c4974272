"""ML detectors: a supervised per-component classifier and an unsupervised peer-comparison detector.

    from detectors.ml import load_ml_detectors
    dets = load_ml_detectors()            # [] (with a warning) when no trained model is shipped
    for s in samples:
        for d in dets:
            findings = d.feed(s)              # the classifier scores in batches ...
    for d in dets:
        findings = d.flush()                  # ... so flush at the end of each poll batch

Both read windowed per-component features (:mod:`detectors.ml.features`); models come from
``detectors/models/`` (``fleethealth train`` writes them) as skops archives plus a JSON sidecar.
:mod:`detectors.registry` declares both (``MODEL_DETECTORS``) and loads them through the loaders here.
"""

from __future__ import annotations

import logging
from pathlib import Path

from detectors.engine.finding import Detector, Finding
from detectors.ml.batching import WindowBatcher
from detectors.ml.features import FEATURE_SPEC, FeatureStream
from detectors.ml.model_io import ModelError, load_model, read_sidecar
from detectors.ml.peers import PEER_FEATURES, PeerDetector
from detectors.ml.supervised import FEATURES, SupervisedDetector
from detectors.ml.train import PEER_NAME, SUPERVISED_NAME, peer_models
from fleethealth.schema import Sample

log = logging.getLogger(__name__)
MODEL_DIR = Path(__file__).resolve().parent.parent / "models"


def load_supervised(model_dir: Path | None = None, stream: FeatureStream | None = None) -> SupervisedDetector:
    est, meta = load_model(model_dir or MODEL_DIR, SUPERVISED_NAME, FEATURE_SPEC, FEATURES)
    return SupervisedDetector(est, meta, stream)


def load_peer(model_dir: Path | None = None, stream: FeatureStream | None = None) -> PeerDetector:
    est, meta = load_model(model_dir or MODEL_DIR, PEER_NAME, FEATURE_SPEC, PEER_FEATURES)
    return PeerDetector(peer_models(est, meta), meta, stream)


def load_ml_detectors(model_dir: Path | None = None, strict: bool = False) -> list[WindowBatcher]:
    """Both ML detectors, or those whose model files exist; [] with a logged warning when none do
    (``strict``: a missing model raises :class:`ModelError`). A model file that exists but is
    mismatched or untrusted raises :class:`ModelError`."""
    d = model_dir or MODEL_DIR
    present = [(name, loader) for name, loader in ((SUPERVISED_NAME, load_supervised), (PEER_NAME, load_peer))
               if (d / f"{name}.json").exists()]
    for name in sorted({SUPERVISED_NAME, PEER_NAME} - {n for n, _ in present}):
        if strict:
            raise ModelError(f"ML detector {name}: no model in {d} (run `fleethealth train`)")
        log.warning("ML detector %s not loaded: no model in %s (run `fleethealth train`)", name, d)
    # one feature stream for both: features are computed once per sample
    stream = FeatureStream(window_s=float(read_sidecar(d, present[0][0]).get("window_s", 60.0)),
                           consumers=len(present)) if present else None
    return [loader(d, stream) for _, loader in present]


class MLSuite:
    """The ML detectors as one detector for the engine: each sample goes through the shared feature
    stream once, and every member buffers the window it closes. Findings keep their member's name
    (``model:<name>@<v>``).

    Fed through the engine, the suite only buffers: ``feed`` returns nothing, and the engine scores
    the buffer (:meth:`flush`) when fleet time enters a new ``flush_every_s`` epoch
    (:meth:`DetectorEngine.advance_epoch`) and at the end of each poll batch. A scoring batch is
    then the windows closed between two such points whatever order the hosts were fed in between
    (the detect worker feeds a batch grouped by host), and :meth:`WindowBatcher.flush` scores it
    in a canonical order, so the findings and their order depend on each host's own samples and
    those points only."""

    def __init__(self, members: list[WindowBatcher]) -> None:
        self.members = members
        self.stream = members[0].stream
        self.stream.consumers = 1  # fed once per sample, here
        self.name = ",".join(str(getattr(m, "name", m)) for m in members)

    @property
    def flush_every_s(self) -> float:
        """The fleet-time period the engine scores the held windows at: the members' ``batch_s``."""
        return min(m.batch_s for m in self.members)

    takes_base = True  # DetectorEngine feeds it the decoder's base (FeatureStream.feed)

    def feed(self, sample: Sample, base: object = None) -> list[Finding]:
        w = self.stream.feed(sample, base)
        if w is not None:
            for m in self.members:
                m.pending.append(w)
        return []

    def flush(self) -> list[Finding]:
        return [f for m in self.members for f in m.flush()]

    def reset(self) -> None:
        for m in self.members:
            m.reset()

    def forget_host(self, host: str) -> None:
        for m in self.members:
            m.forget_host(host)


def load_ml_suite(model_dir: Path | None = None, strict: bool = False) -> list[Detector]:
    """[MLSuite] of the detectors whose models are present ([] when none is; ``strict``: all must be)."""
    dets = load_ml_detectors(model_dir, strict)
    return [MLSuite(dets)] if dets else []


__all__ = ["MODEL_DIR", "MLSuite", "ModelError", "PeerDetector", "SupervisedDetector", "load_ml_detectors",
           "load_ml_suite", "load_peer", "load_supervised"]
