"""Operating limits the simulator sizes its faults and its benign noise against, with their sources.

The detectors' rules are deliberately *not* read here: a simulator that sized its faults from the
rules would only ever confirm them. These are the figures the field's own tools and NVIDIA publish;
where no public figure exists the limit is an operator's rule of thumb and says so.

A counter fault is drawn as ``multiple x limit``, the multiple log-uniform over
:data:`FAULT_MULTIPLE` (so about a quarter of faults sit under 3x the limit, the marginal ones a real
fleet is full of), and benign noise on healthy components as ``fraction x limit`` over
:data:`NOISE_FRACTION` (busy but healthy parts, just under the line). A detector whose thresholds are
scaled by 0.3 then flags healthy parts, and one scaled by 3 misses the marginal faults: the
scorecard can tell a right threshold from a wrong one (tests/detectors/test_threshold_mutation.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from fleethealth.limits import LIMITS, Limit

if TYPE_CHECKING:  # numpy only where a fault is drawn: the collector's --inject path reads LIMITS alone
    import numpy as np

__all__ = ["FAULT_MULTIPLE", "LIMITS", "NOISE_FRACTION", "Limit", "fault_rate_per_hour", "noise_rate_per_hour",
           "per_poll"]


# The limits themselves live in the spine (fleethealth/limits.py): the ML features are normalised
# against the same published figures.

# Fault strength as a multiple of the limit (log-uniform), and healthy noise as a fraction of it.
FAULT_MULTIPLE: Final = (1.5, 40.0)
NOISE_FRACTION: Final = (0.35, 0.55)


def fault_rate_per_hour(name: str, rng: np.random.Generator) -> tuple[float, float]:
    """``(rate per hour, multiple of the limit)`` for one fault on counter ``name``."""
    import numpy as np

    lo, hi = FAULT_MULTIPLE
    m = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
    return LIMITS[name].per_hour * m, m


def noise_rate_per_hour(name: str, rng: np.random.Generator) -> float:
    lo, hi = NOISE_FRACTION
    return LIMITS[name].per_hour * float(rng.uniform(lo, hi))


def per_poll(rate_per_hour: float, interval_s: float) -> float:
    return rate_per_hour * interval_s / 3600.0
