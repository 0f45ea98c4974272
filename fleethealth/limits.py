"""Operating limits of the counters a fleet watches, with their sources (reference data, like the Xid table).

These are the figures the field's own tools and NVIDIA publish (where no public figure exists the
limit is an operator's rule of thumb and says so). Two parts read them and neither reads the
detector rules: the simulator sizes its faults and its healthy near-limit noise against them
(``simulator/limits.py``), and the ML features express these counters' rates as multiples of them
(``detectors/ml/features.py``), so a model compares a rate with the line the field draws, whatever
the poll interval or window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


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
