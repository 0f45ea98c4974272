"""The scorecard of a run, delegated to the detector part's scoring code (``detectors.scoring``)."""

from __future__ import annotations

import inspect
import json
from typing import Any

from fleethealth.schema import Incident


def scorecard(source: Any, incidents: list[Incident]) -> tuple[dict[str, Any] | None, str]:
    """(scorecard as a dict, printable text). Without ``detectors.scoring``: (None, why)."""
    try:
        from detectors import scoring
    except ImportError:
        return None, "scorecard: detectors.scoring is not installed in this build"
    fn = scoring.score_replay
    params = inspect.signature(fn).parameters
    kw: dict[str, Any] = {}
    for name in params:
        if name in ("truth", "ground_truth", "labels"):
            kw[name] = source.truth
        elif name in ("incidents", "predictions"):
            kw[name] = incidents
        elif name in ("path", "recording", "replay") and source.path is not None:
            kw[name] = source.path
    card = fn(**kw)
    as_dict = card if isinstance(card, dict) else getattr(card, "as_dict", lambda: None)()
    if as_dict is None and hasattr(card, "__struct_fields__"):
        import msgspec

        as_dict = msgspec.to_builtins(card)
    text_fn = getattr(scoring, "format_scorecard", None) or getattr(card, "format", None)
    if callable(text_fn):
        text = text_fn(card) if text_fn is getattr(scoring, "format_scorecard", None) else text_fn()
    else:
        text = json.dumps(as_dict, indent=2, sort_keys=True, default=str)
    return as_dict, str(text)
