"""Planning a run: which faults happen where and when (the ground truth), before any telemetry.

Counts per mode are Poisson draws with mean ``rate x hosts x hours`` (rates from :mod:`.rates`);
each fault gets a host, an onset uniform over the run, and a log-uniform duration. A host carries one
fault at a time (a second fault would blur the first one's evidence): a fault that collides is moved
to another host, so the per-mode counts stay exactly the Poisson draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleethealth.errors import UserError
from fleethealth.taxonomy import FAULT_LABELS, PRECURSORS

from .faults import DURATION, KIND, Fault, draw_duration
from .rates import rates_per_host_hour
from .timeline import Timeline
from .topology import GPUS_PER_HOST, PORTS_PER_HOST, HostSpec

SCENARIOS = ("default", "flapping-cable", "sbe-storm-no-uce", "driver-update", "hard-cases", "slow-drift",
             "training")
# slow-drift: faults a threshold sees late by design: cables whose error rate creeps up from a tenth
# of the limit, and HBM UCEs after hours of growing corrected errors (what the models must beat).
# training: the default fault mix beside many healthy near-limit parts (engine.NEAR_LIMIT_BOOST), so
# that the ML detectors learn what a busy but healthy HBM stack, cable, riser, DIMM or NVLink looks like.
SLOW_DRIFT_MODES = ("net_link_bad_cable", "gpu_dram_uce")
# hard-cases: the counter faults whose strength decides whether a threshold is right (limits.py),
# in numbers a scorecard can measure recall on, beside the benign near-limit noise (engine.py).
HARD_CASE_MODES = ("net_link_bad_cable", "pcie_link_degraded", "gpu_nvlink_error", "gpu_ecc_sbe_storm",
                   "host_dram_ce_storm")


@dataclass
class RunSpec:
    hosts: int
    duration_s: float
    interval_s: float
    seed: int
    fault_rate: float = 1.0
    scenario: str = "default"
    min_per_mode: int = 0
    start_ts: float = 1_735_689_600.0  # 2025-01-01T00:00:00Z: fixed, never the wall clock

    @property
    def ticks(self) -> int:
        return int(self.duration_s // self.interval_s)

    def check(self) -> None:
        if self.hosts < 1:
            raise UserError("--hosts must be at least 1")
        if self.interval_s <= 0 or self.duration_s < self.interval_s:
            raise UserError("--duration must be at least one --interval, and the interval positive")
        if self.fault_rate < 0:
            raise UserError("--fault-rate must be >= 0")
        if self.scenario not in SCENARIOS:
            raise UserError(f"unknown scenario {self.scenario!r}; choose from {', '.join(SCENARIOS)}")


def parse_duration(text: str) -> float:
    """``1d``, ``6h``, ``30m``, ``45s`` or plain seconds."""
    t = text.strip().lower()
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    try:
        if t and t[-1] in units:
            return float(t[:-1]) * units[t[-1]]
        return float(t)
    except ValueError:
        raise UserError(f"cannot read duration {text!r}: use e.g. 1d, 6h, 30m, 90s") from None


def expected_faults(spec: RunSpec) -> dict[str, float]:
    hours = spec.ticks * spec.interval_s / 3600.0
    return {m: r * spec.hosts * hours for m, r in rates_per_host_hour(spec.fault_rate).items()}


def component_of(f: Fault, spec: HostSpec, uuids: list[str]) -> str:
    k = KIND[f.mode]
    if k == "gpu":
        return uuids[f.gpu or 0]
    if k == "pci":
        return spec.gpus[f.gpu or 0].pci_addr
    if k == "port":
        return spec.port_component(f.port or 0)
    if k == "dimm":
        return spec.dimms[f.dimm or 0][1]
    return "host"


OVERLAP_P = 0.15
OVERLAP_OK = frozenset({"gpu_ecc_sbe_storm", "app_error", "gpu_dram_uce", "gpu_sram_uce", "gpu_hw_error",
                        "gpu_nvlink_error", "gpu_row_remap_pending", "gpu_thermal", "host_dram_ce_storm"})


def _place(tl: Timeline, rng: np.random.Generator, spec: RunSpec, mode: str, fid: str,
           host: int | None = None, dur_s: float | None = None,
           active: dict[int, list[Fault]] | None = None) -> tuple[Fault, int] | None:
    ticks = spec.ticks
    dur = spec_ticks(dur_s if dur_s is not None else draw_duration(mode, rng), spec.interval_s)
    # a fault with a precursor may leave a CE ramp (fleethealth.taxonomy.PRECURSORS) inside its reservation
    pre_max = spec_ticks(PRECURSORS[mode].ramp_s, spec.interval_s) if mode in PRECURSORS else 0
    ramp = bool(pre_max) and (spec.scenario == "slow-drift" or rng.random() < 0.5)
    pre = int(rng.integers(pre_max // 6, pre_max + 1)) if ramp else 0
    # A few faults share a host with another one on a different GPU (an application crash beside an
    # HBM storm, two sick GPUs in one box). Only modes that end in a GPU reset or nothing may
    # overlap: a host reboot would erase the other fault's evidence.
    overlap = mode in OVERLAP_OK and rng.random() < OVERLAP_P
    hosts_ok = sorted(h for h, fs in (active or {}).items() if all(o.mode in OVERLAP_OK for o in fs))
    for _attempt in range(60):
        h = int(rng.integers(0, spec.hosts)) if host is None else host
        onset = int(rng.integers(2, max(ticks - 1, 3)))
        if overlap and hosts_ok and host is None:  # on a host that already has a fault, during it
            h = hosts_ok[int(rng.integers(0, len(hosts_ok)))]
            o = active[h][-1]  # type: ignore[index]
            onset = int(rng.integers(max(o.onset_tick, 2 + pre), max(o.end_tick, o.onset_tick + 1, 3 + pre)))
        end = min(onset + dur, ticks)
        margin = spec_ticks(1800, spec.interval_s)
        taken: set[int] | None = None
        if tl.free(h, onset - pre, end, margin=margin):
            taken = set()
        elif overlap:
            others = [o for o in (active or {}).get(h, ()) if not (end + margin <= o.onset_tick or onset - pre - margin >= o.end_tick)]
            if others and all(o.mode in OVERLAP_OK for o in others):  # faults are planned before the background
                taken = {o.gpu for o in others if o.gpu is not None}
        if taken is not None:
            tl.reserve(h, onset - pre, end)
            f = Fault(id=fid, host=h, mode=mode, onset_tick=onset, end_tick=end)
            if active is not None:
                active.setdefault(h, []).append(f)
            kind = KIND[mode]
            if kind in ("gpu", "pci"):
                free_gpus = [g for g in range(GPUS_PER_HOST) if g not in taken]
                f.gpu = int(free_gpus[int(rng.integers(0, len(free_gpus)))]) if taken else int(rng.integers(0, GPUS_PER_HOST))
                if taken:
                    f.notes.append("overlaps another fault on this host")
            elif kind == "port":
                f.port = int(rng.integers(0, PORTS_PER_HOST))
            elif kind == "dimm":
                f.dimm = int(rng.integers(0, 16))
            return f, min(pre, onset)
        if host is not None:
            return None
    return None


def spec_ticks(seconds: float, interval: float) -> int:
    return max(1, int(round(seconds / interval)))


def plan_faults(spec: RunSpec, tl: Timeline, rng: np.random.Generator) -> tuple[list[tuple[Fault, int]], int]:
    """Draw every fault of the run. Returns ((fault, precursor ticks) list, faults that found no room)."""
    exp = expected_faults(spec)
    out: list[tuple[Fault, int]] = []
    dropped = 0
    n = 0
    wanted: list[str] = []
    for mode in FAULT_LABELS:
        k = int(rng.poisson(exp[mode])) if exp[mode] > 0 else 0
        wanted += [mode] * max(k, spec.min_per_mode if spec.fault_rate > 0 else 0)
    # scenario extras
    if spec.scenario == "flapping-cable":
        wanted += ["net_link_bad_cable"] * max(2, spec.hosts // 16)
    elif spec.scenario == "sbe-storm-no-uce":
        wanted += ["gpu_ecc_sbe_storm"] * max(2, spec.hosts // 16)
    elif spec.scenario == "slow-drift":
        for mode in SLOW_DRIFT_MODES:
            wanted += [mode] * max(4, spec.hosts // 6)
    elif spec.scenario == "hard-cases":
        for mode in HARD_CASE_MODES:
            wanted += [mode] * max(6, spec.hosts // 3)
    placed_by_host: dict[int, list[Fault]] = {}
    # long faults first so they find room; stable order keeps runs reproducible
    wanted.sort(key=lambda m: (-DURATION[m][1], m))
    for mode in wanted:
        long = spec.scenario in ("flapping-cable", "sbe-storm-no-uce") and mode in ("net_link_bad_cable", "gpu_ecc_sbe_storm")
        dur = spec.duration_s * float(rng.uniform(0.5, 0.8)) if long else None
        placed = _place(tl, rng, spec, mode, f"F{n:05d}", dur_s=dur, active=placed_by_host)
        if placed is None:
            dropped += 1
            continue
        out.append(placed)
        n += 1
    return out, dropped
