"""Default fault rates, derived from Llama 3's published interruption table (as data).

Source: "The Llama 3 Herd of Models", arXiv 2407.21783, Table 5: 419 unexpected interruptions in a
54-day snapshot of pre-training on 16,384 H100 GPUs (2,048 hosts of 8 GPUs).

Exposure = 2,048 hosts x 54 days x 24 h = 2,654,208 host-hours, so one interruption in the table is
1 / 2,654,208 = 3.77e-7 per host-hour, and the whole table is 419 / 2,654,208 = 1.58e-4 per host-hour
(about one interruption per 6,300 host-hours, or 3.8 per 1,000 host-days; Meta's research clusters
report 6.5 failures per 1,000 node-days, arXiv 2410.21680, the same order).

Each Llama 3 category is split over our failure-mode labels by the fractions in ``LLAMA3_MAPPING``
(the split is ours, written down here so it can be argued with). Categories with no hardware
telemetry signature (NCCL watchdog, silent data corruption, SSD, dependency, CPU) are not simulated.
Modes that do not interrupt a job (predictive storms, degraded links) are missing from an
interruption table by construction; they get the assumed counts in ``ASSUMED_EXTRA`` (per the same
54-day exposure), marked as assumptions.

``--fault-rate X`` multiplies every rate by X.
"""

from __future__ import annotations

from typing import Final

from fleethealth.taxonomy import FAULT_LABELS

LLAMA3_HOSTS: Final = 16_384 // 8
LLAMA3_DAYS: Final = 54
LLAMA3_HOST_HOURS: Final = LLAMA3_HOSTS * LLAMA3_DAYS * 24  # 2,654,208

# (Llama 3 category, interruptions in 54 days, {our label: fraction of that category})
LLAMA3_MAPPING: Final[tuple[tuple[str, int, dict[str, float]], ...]] = (
    ("Faulty GPU", 148, {"gpu_hw_error": 0.55, "gpu_fell_off_bus": 0.25, "gpu_nvlink_error": 0.20}),
    ("GPU HBM3 Memory", 72, {"gpu_dram_uce": 0.55, "gpu_row_remap_pending": 0.25, "gpu_row_remap_failure": 0.10,
                             "gpu_ecc_sbe_storm": 0.10}),
    ("Software Bug", 54, {"app_error": 1.0}),
    ("Network Switch/Cable", 35, {"net_link_bad_cable": 0.6, "net_link_down": 0.4}),
    ("Host Maintenance", 32, {"host_unreachable": 1.0}),  # unplanned: the host stops reporting
    ("GPU SRAM Memory", 19, {"gpu_sram_uce": 1.0}),
    ("GPU System Processor", 17, {"gpu_gsp_error": 1.0}),
    ("NIC", 7, {"net_link_down": 1.0}),
    ("NCCL Watchdog Timeouts", 7, {}),  # no hardware signature: not simulated
    ("Silent Data Corruption", 6, {}),  # invisible to counters by definition: not simulated
    ("GPU Thermal Interface + Sensor", 6, {"gpu_thermal": 1.0}),
    ("SSD", 3, {}),
    ("Power Supply", 3, {"host_unreachable": 1.0}),
    ("Server Chassis", 2, {"host_unreachable": 1.0}),
    ("IO Expansion Board", 2, {"pcie_fatal": 1.0}),
    ("Dependency", 2, {}),
    ("CPU", 2, {}),
    ("System Memory", 2, {"host_dram_uce": 1.0}),
)

# Assumed counts per the same 54-day exposure for modes an interruption table cannot show.
ASSUMED_EXTRA: Final[dict[str, float]] = {
    "gpu_ecc_sbe_storm": 10.0,  # predictive: rarely kills a job
    "host_dram_ce_storm": 12.0,  # predictive
    "pcie_link_degraded": 10.0,  # slows a job, seldom kills it
    "pcie_fatal": 4.0,  # AER uncorrectable not followed by Xid 79
    "gpu_thermal": 6.0,  # slowdowns that did not interrupt
    "app_error": 216.0,  # app-caused Xids that did not stop the whole job (assumed 4x the bug count)
}


def llama3_counts() -> dict[str, float]:
    """Expected faults per label in the Llama 3 exposure (mapped share + assumed extra)."""
    out = dict.fromkeys(FAULT_LABELS, 0.0)
    for _cat, n, split in LLAMA3_MAPPING:
        assert abs(sum(split.values()) - 1.0) < 1e-9 or not split, _cat
        for label, frac in split.items():
            out[label] += n * frac
    for label, extra in ASSUMED_EXTRA.items():
        out[label] += extra
    return out


def rates_per_host_hour(multiplier: float = 1.0) -> dict[str, float]:
    """Default fault rate per host-hour for every label in the vocabulary, times ``multiplier``."""
    return {k: v / LLAMA3_HOST_HOURS * multiplier for k, v in llama3_counts().items()}


DEFAULT_RATES: Final = rates_per_host_hour()
for _label in FAULT_LABELS:  # every mode must be simulated
    assert DEFAULT_RATES[_label] > 0, f"no rate for {_label}"
