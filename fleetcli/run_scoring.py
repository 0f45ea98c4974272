"""The scorecard of a run, delegated to the detector part's scoring code (``detectors.scoring.scoring``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fleethealth.schema import Incident


def _faults(truth: list[dict[str, Any]]) -> list[Any]:
    from detectors.scoring.scoring import truth_faults

    return truth_faults(truth)


def plots(truth: list[dict[str, Any]], incidents: list[Incident], host_ts: dict[str, list[float]]) -> list[tuple[str, str]]:
    """(title, base64 PNG) of the scorecard's plots: faults vs detections per host, the confusion
    matrix, precision and recall per mode (the same figures as ``replay --score --report``)."""
    from detectors.scoring.report import bars, confusion, timeline
    from detectors.scoring.scoring import DetectionRun, score

    faults = _faults(truth)
    card = score(faults, incidents, host_ts.keys(), host_ts=host_ts)
    first = min((ts[0] for ts in host_ts.values() if ts), default=0.0)
    res = DetectionRun(incidents=list(incidents), hosts=set(host_ts), first_ts=first)
    return [("Faults vs detections per host", timeline(card, faults, res)),
            ("Confusion matrix", confusion(card, faults)), ("Precision and recall", bars(card))]


def scorecard(truth: list[dict[str, Any]], incidents: list[Incident], hosts: Iterable[str],
              host_ts: dict[str, list[float]]) -> tuple[dict[str, Any], str]:
    """(public scorecard dict, printable text) for ground-truth records as the simulator writes them."""
    from detectors.scoring.scoring import format_scorecard, public, score

    faults = _faults(truth)
    card = score(faults, incidents, hosts, host_ts=host_ts)
    return public(card), format_scorecard(card)
