"""Every detector fleethealth can run, by name — the list the shared contract suite walks
(tests/detectors/test_detector_contract.py) and ``fleethealth detect --with-models`` loads.

* one detector per rule file (``rules:<file stem>``), stateful over a stream of samples;
* the whole engine (``engine``: rules + episodes), whose feed returns incidents;
* model detectors: the ML part registers factories with :func:`register_model` (at import of
  ``detectors.ml``); a factory that cannot load its model (not trained yet) raises and is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from detectors.engine.finding import Detector, Finding
from detectors.engine.rulefile import load_rule_files, rules_dir
from detectors.engine.ruleset import RuleSet
from detectors.engine.state import Admission, HostState
from fleethealth.schema import Sample

log = logging.getLogger(__name__)
Factory = Callable[[], Any]
_MODELS: dict[str, Factory] = {}
# factories that build several registered models at once, sharing work (e.g. one feature stream)
_SUITES: list[tuple[frozenset[str], Callable[[], list[Detector]]]] = []


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


def register_model(name: str, factory: Factory) -> None:
    """Called by the ML part: ``register_model("peer_anomaly", lambda: PeerDetector.load(...))``."""
    _MODELS[name] = factory


def register_model_suite(names: Iterable[str], factory: Callable[[], list[Detector]]) -> None:
    """Called by the ML part: ``model_detectors()`` builds these models together through ``factory``
    instead of one by one (the contract suite still builds each alone)."""
    _SUITES.append((frozenset(names), factory))


def _import_models() -> None:
    try:
        __import__("detectors.ml")
    except ImportError as exc:
        log.debug("no ML detectors: %s", exc)


def model_detectors() -> list[Detector]:
    """Instantiate every registered model detector that can load its model."""
    _import_models()
    out: list[Detector] = []
    built: set[str] = set()
    for names, suite in _SUITES:
        try:
            out.extend(suite())
            built |= names
        except Exception as exc:  # fall back to building them one by one below
            log.warning("model suite %s not loaded: %s", ",".join(sorted(names)), exc)
    for name, factory in sorted(_MODELS.items()):
        if name in built:
            continue
        try:
            out.append(factory())
        except Exception as exc:  # untrained / missing model: run without it, say so
            log.warning("model detector %s not loaded: %s", name, exc)
    return out


def all_detectors() -> list[tuple[str, Factory]]:
    """(name, factory) of every detector; the contract suite calls each factory for a fresh one."""
    _import_models()
    out: list[tuple[str, Factory]] = []
    for p in sorted(rules_dir().glob("*.yaml")):
        if not any(s.stream for s in load_rule_files([p])):
            continue  # capture-only rules (diagnose's facts): nothing for a stream to run
        out.append((f"rules:{p.stem}", lambda p=p: RuleFileDetector(p)))
    out.append(("engine", EngineDetector))
    for name, factory in sorted(_MODELS.items()):
        out.append((f"model:{name}", factory))
    return out
