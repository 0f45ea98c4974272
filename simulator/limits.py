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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # numpy only where a fault is drawn: the collector's --inject path reads LIMITS alone
    import numpy as np


@dataclass(frozen=True)
class Limit:
    per_hour: float
    source: str


LIMITS: Final[dict[str, Limit]] = {
    # InfiniBand: ibqueryerrors' and ibdiagnet's default SymbolErrorCounter threshold is 10; IBTA's
    # 1e-12 bit-error-rate target at NDR puts a healthy link well under one symbol error an hour.
    "ib_symbol_errors": Limit(10.0, "infiniband-diags ibqueryerrors default threshold (SymbolErrorCounter 10)"),
    # PCIe: DCGM's PCIe health watch fails a GPU past 8 replays a minute.
    "pcie_replays": Limit(480.0, "DCGM health watch DCGM_HEALTH_WATCH_PCIE: 8 replays per minute"),
    # NVLink: DCGM flags NVLink CRC/replay errors by rate; 10 a minute per link is the operator's
    # rule of thumb for a link to retrain or replace (no public NVIDIA figure).
    "nvlink_crc": Limit(600.0, "operator rule of thumb: 10 NVLink CRC errors a minute per link"),
    # HBM corrected ECC: a healthy stack corrects a handful a day (NVIDIA's row-remapping docs treat
    # corrected errors as routine); 100 an hour is the common page threshold for a storm.
    "hbm_ce": Limit(100.0, "operator page threshold: 100 corrected HBM errors an hour"),
    # DIMM corrected errors: mcelog pages a DIMM off at 10 per 24 h; fleets page a human far later.
    "dimm_ce": Limit(60.0, "operator page threshold: 60 corrected errors an hour on one DIMM (mcelog offlines "
                           "pages at 10 per 24 h)"),
}

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
