"""The scorecard of a run, delegated to the detector part's scoring code (``detectors.scoring.scoring``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fleethealth.schema import Incident


def _faults(truth: list[dict[str, Any]]) -> list[Any]:
    from detectors.scoring.scoring import truth_faults

    return truth_faults(truth)


def scorecard(truth: list[dict[str, Any]], incidents: list[Incident], hosts: Iterable[str],
              host_ts: dict[str, list[float]]) -> tuple[dict[str, Any], str, list[Any]]:
    """(scorecard with its matched detections, printable text, the truth faults) for ground-truth
    records as the simulator writes them; ``detectors.scoring.scoring.public`` drops the detections."""
    from detectors.scoring.scoring import format_scorecard, score

    faults = _faults(truth)
    card = score(faults, incidents, hosts, host_ts=host_ts)
    return card, format_scorecard(card), faults
