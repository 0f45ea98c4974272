"""The scoring gate: which window rows are worth the classifier's time.

A row is scored only when it shows something beyond the healthy noise the model was trained on:

* any *hard* signal — an uncorrectable-error delta, a remap / retirement / SRAM-threshold flag, a
  throttle bit, a loaded PCIe link downshift, a lost GPU, an inactive NVLink, a non-application Xid,
  a port down or downed, a missing GPU, a kernel MCE / fell-off-bus line, a temperature >= 85 °C;
* a *learned* signal above its threshold — correctable-error and link-error rates, and the GPU's
  temperature z-score against the host's other GPUs. Each threshold is ``margin`` times the
  99.99th percentile of that feature on healthy training rows, and never below a floor.

The floor of a rate measured against its published limit (the ``*_x`` features) is
:data:`X_FLOOR` of that limit: the limit is where the field's tools draw the line, and busy
healthy parts run steadily under it (an HBM stack correcting a few dozen errors an hour, a long
cable, an NVLink retrying). Below ``X_FLOOR`` x the limit the model abstains — that is noise by the
same yardstick the rules use, and a model that scored it named healthy near-limit NVLinks faults.

Application Xids (13, 31, 43, 45: a job crashed) open nothing on their own: the rules name them
(``app_error``, annotate only). The thresholds live in the model's sidecar (``gate``), so training
and scoring use the same gate; quiet rows are healthy by construction.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from detectors.ml.features import GPU_FEATURES, HOST_FEATURES, PORT_FEATURES, PORT_RATES

_APP_XID = ("xid_bucket_restart_app", "xid_bucket_other", "xid_app_error")
HARD: dict[str, tuple[str, ...]] = {
    "gpu": ("dram_ue", "sram_ue", "sram_threshold", "remap_corr", "remap_uncorr", "remap_pending", "remap_failure",
            "retired_sbe", "retired_dbe", "retired_pending", "pcie_degraded_under_load", "aer_uncor",
            "nvlink_links_inactive", "thr_hw_slowdown", "thr_sw_thermal", "thr_hw_thermal", "thr_power_brake", "lost",
            *(n for n in GPU_FEATURES if n.startswith("xid_") and n not in _APP_XID)),
    "port": ("link_downed_rate", "state_down", "phys_not_linkup"),
    "host": ("edac_ue", "gpus_missing", "kern_mce", "kern_fell_off_bus", "aer_other_uncor"),
}
X_FLOOR = 0.6  # of the published limit (features *_x); healthy busy parts run at up to ~0.55x
# learned feature -> floor of its threshold (rates per minute, *_x in multiples of the limit; temp_z
# in robust standard deviations)
FLOORS: dict[str, dict[str, float]] = {
    "gpu": {"dram_ce_x": X_FLOOR, "sram_ce_rate": 3.0, "pcie_replay_x": X_FLOOR, "aer_cor_rate": 3.0,
            "nvlink_crc_rate": 3.0, "nvlink_replay_rate": 3.0, "nvlink_recovery_rate": 1.0,
            "nvlink_worst_link_x": X_FLOOR, "temp_z": 4.0},
    "port": {n: X_FLOOR if n.endswith("_x") else 3.0 for n in PORT_RATES if n != "link_downed_rate"},
    "host": {"edac_ce_rate": 3.0, "edac_max_dimm_ce_x": X_FLOOR, "aer_other_cor_rate": 3.0, "kern_aer": 1.0},
}
NAMES = {"gpu": GPU_FEATURES, "port": PORT_FEATURES, "host": HOST_FEATURES}
QUANTILE = 0.9999
MARGIN = 1.5
HOT_C = 85.0


class Gate:
    """``mask(kind, rows) -> bool array``; thresholds by kind and feature name (sidecar ``gate``)."""

    def __init__(self, thresholds: Mapping[str, Mapping[str, float]] | None = None) -> None:
        self.thresholds = {k: {n: float(thresholds.get(k, {}).get(n, f)) if thresholds else f for n, f in fl.items()}
                           for k, fl in FLOORS.items()}
        self._hard = {k: np.array([NAMES[k].index(n) for n in names]) for k, names in HARD.items()}
        self._cols = {k: np.array([NAMES[k].index(n) for n in t]) for k, t in self.thresholds.items()}
        self._thr = {k: np.array([abs(v) for v in t.values()]) for k, t in self.thresholds.items()}
        self._temp = (NAMES["gpu"].index("temp_c"), NAMES["port"].index("rate_ratio"))

    def mask(self, kind: str, m: np.ndarray) -> np.ndarray:
        if m.shape[0] == 0:
            return np.zeros(0, dtype=bool)
        g = (m[:, self._hard[kind]] != 0).any(axis=1) | (np.abs(m[:, self._cols[kind]]) > self._thr[kind]).any(axis=1)
        if kind == "gpu":
            g |= m[:, self._temp[0]] >= HOT_C
        elif kind == "port":
            g |= m[:, self._temp[1]] < 0.99
        return g

    def to_json(self) -> dict[str, dict[str, float]]:
        return {k: {n: round(v, 6) for n, v in t.items()} for k, t in self.thresholds.items()}


def learn_gate(healthy: Mapping[str, np.ndarray]) -> Gate:
    """Thresholds from rows labelled healthy (per kind, full feature rows)."""
    out: dict[str, dict[str, float]] = {}
    for kind, floors in FLOORS.items():
        m = healthy.get(kind)
        out[kind] = {}
        for n, floor in floors.items():
            if m is None or m.shape[0] == 0:
                out[kind][n] = floor
                continue
            q = float(np.quantile(np.abs(m[:, NAMES[kind].index(n)]), QUANTILE))
            out[kind][n] = max(floor, MARGIN * q)
    return Gate(out)
