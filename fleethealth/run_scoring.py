"""The scorecard of a run, delegated to the detector part's scoring code (``detectors.scoring``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fleethealth.schema import Incident


def scorecard(truth: list[dict[str, Any]], incidents: list[Incident], hosts: Iterable[str],
              host_ts: dict[str, list[float]]) -> tuple[dict[str, Any], str]:
    """(public scorecard dict, printable text) for ground-truth records as the simulator writes them."""
    from detectors.scoring import TruthFault, format_scorecard, public, score

    faults = [TruthFault(str(r["id"]), r["host"], r.get("component") or "host", r["failure_mode"],
                         float(r["onset"]), float(r["end"]), tuple(r.get("secondary") or ())) for r in truth]
    card = score(faults, incidents, hosts, host_ts=host_ts)
    return public(card), format_scorecard(card)
