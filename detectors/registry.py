"""Every detector fleethealth can run, by name — the list the shared contract suite walks
(tests/detectors/test_detector_contract.py) and ``fleethealth detect --with-models`` loads.

* one detector per rule file (``rules:<file stem>``), stateful over a stream of samples;
* the whole engine (``engine``: rules + episodes), whose feed returns incidents;
* model detectors, declared in :data:`MODEL_DETECTORS` (module and loader by name). A declared
  detector whose module does not import, or whose model does not load, raises
  :class:`DetectorLoadError`: ``--with-models`` never quietly runs rules only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from detectors.engine.finding import Detector, Finding
from detectors.engine.rulefile import load_rule_files, rules_dir
from detectors.engine.ruleset import RuleSet
from detectors.engine.state import Admission, HostState
from fleethealth.errors import FleetHealthError
from fleethealth.schema import Sample

Factory = Callable[[], Any]

# name -> (module, loader): each loader takes ``model_dir`` (None: the shipped models) and returns
# one detector
MODEL_DETECTORS: dict[str, tuple[str, str]] = {
    "fault_classifier": ("detectors.ml", "load_supervised"),
    "peer_anomaly": ("detectors.ml", "load_peer"),
}
# the declared models built together (one feature stream, one engine entry): module, loader, names;
# the loader takes ``model_dir`` and ``strict`` and returns a list of detectors
MODEL_SUITE: tuple[str, str, frozenset[str]] = ("detectors.ml", "load_ml_suite",
                                                frozenset({"fault_classifier", "peer_anomaly"}))


class DetectorLoadError(FleetHealthError):
    """A declared detector did not import, or its model did not load; the message says which."""


class RuleFileDetector:
    """The rules of one file as a Detector: per-host state, seq order guard, findings out."""

    def __init__(self, path: Path) -> None:
        self.name = f"rules:{path.stem}"
        self.rules = RuleSet.load([path])
        self.hosts: dict[str, HostState] = {}

    def feed(self, sample: Sample) -> list[Finding]:
        st = self.hosts.get(sample.host)
        if st is None:
            st = self.hosts[sample.host] = HostState(sample.host, sample.cluster, sample.rack)
        self.rules.advance_baselines(sample.ts)  # fleet percentiles: as in the engine
        if Admission.admit(st, sample.seq, sample.ts, sample.boot_id, sample.driver_version):
            return []
        out: list[Finding] = []
        self.rules.evaluate(st, sample, out)
        return out

    def reset(self) -> None:
        self.hosts.clear()
        self.rules.reset()


class EngineDetector:
    """The engine under the Detector shape (its feed returns Incidents, not Findings)."""

    name = "engine"

    def __init__(self) -> None:
        from detectors.engine.engine import DetectorEngine

        self.engine = DetectorEngine()

    def feed(self, sample: Sample) -> list[Any]:
        return self.engine.feed(sample)

    def reset(self) -> None:
        self.engine.reset()


def _loader(what: str, module: str, attr: str) -> Callable[..., Any]:
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise DetectorLoadError(f"detector {what}: module {module} does not import: {exc}") from exc
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise DetectorLoadError(f"detector {what}: {module} has no loader {attr}()")
    return fn


def load_model_detector(name: str, model_dir: Path | None = None) -> Detector:
    """The declared model detector ``name`` alone; :class:`DetectorLoadError` when it cannot load."""
    if name not in MODEL_DETECTORS:
        raise DetectorLoadError(f"no model detector named {name!r} (declared: {', '.join(sorted(MODEL_DETECTORS))})")
    module, attr = MODEL_DETECTORS[name]
    fn = _loader(name, module, attr)
    try:
        det: Detector = fn(model_dir)
    except Exception as exc:
        raise DetectorLoadError(f"model detector {name} not loaded: {exc}") from exc
    return det


def model_detectors(model_dir: Path | None = None) -> list[Detector]:
    """Every declared model detector (the suite built together, the rest one by one), or
    :class:`DetectorLoadError`: a missing, mismatched or untrusted model fails start-up."""
    module, attr, names = MODEL_SUITE
    fn = _loader(",".join(sorted(names)), module, attr)
    try:
        out: list[Detector] = list(fn(model_dir, strict=True))
    except Exception as exc:
        raise DetectorLoadError(f"model detectors {', '.join(sorted(names))} not loaded: {exc}") from exc
    out += [load_model_detector(n, model_dir) for n in sorted(set(MODEL_DETECTORS) - names)]
    return out


def all_detectors() -> list[tuple[str, Factory]]:
    """(name, factory) of every detector; the contract suite calls each factory for a fresh one."""
    out: list[tuple[str, Factory]] = []
    for p in sorted(rules_dir().glob("*.yaml")):
        if not any(s.stream for s in load_rule_files([p])):
            continue  # capture-only rules (diagnose's facts): nothing for a stream to run
        out.append((f"rules:{p.stem}", partial(RuleFileDetector, p)))
    out.append(("engine", EngineDetector))
    for name in sorted(MODEL_DETECTORS):
        out.append((f"model:{name}", partial(load_model_detector, name)))
    return out
