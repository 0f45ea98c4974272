"""Fault counts per mode against the configured rates (Poisson tolerance)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import poisson

from fleethealth.taxonomy import FAULT_LABELS
from simulator.plan import RunSpec, expected_faults, plan_faults
from simulator.rates import DEFAULT_RATES, LLAMA3_HOST_HOURS, llama3_counts
from simulator.timeline import Timeline


def test_rates_reproduce_llama3_table() -> None:
    counts = llama3_counts()
    assert LLAMA3_HOST_HOURS == 2048 * 54 * 24
    # the mapped part of Table 5 (before assumed extras) is the 419 interruptions less the unmapped ones
    assert counts["gpu_sram_uce"] == 19 and counts["gpu_gsp_error"] == 17
    assert abs(DEFAULT_RATES["gpu_hw_error"] * LLAMA3_HOST_HOURS - 148 * 0.55) < 1e-9
    assert set(DEFAULT_RATES) == set(FAULT_LABELS)


@pytest.mark.parametrize("seed", [1, 2])
def test_counts_per_mode_match_rates(seed: int) -> None:
    """A Llama-3-sized exposure x5: each mode's count lies inside the two-sided Poisson 1e-4 interval
    (Bonferroni over 18 modes keeps the whole test's false-alarm rate under 0.2 %)."""
    spec = RunSpec(hosts=2048, duration_s=54 * 86400, interval_s=3600, seed=seed, fault_rate=5)
    exp = expected_faults(spec)
    faults, dropped = plan_faults(spec, Timeline(spec.ticks), np.random.default_rng(seed))
    assert dropped == 0
    got = dict.fromkeys(FAULT_LABELS, 0)
    for f, _pre in faults:
        got[f.mode] += 1
    for mode in FAULT_LABELS:
        lo, hi = poisson.ppf(0.5e-4, exp[mode]), poisson.isf(0.5e-4, exp[mode])
        assert lo <= got[mode] <= hi, (mode, got[mode], exp[mode])
    assert abs(sum(got.values()) - sum(exp.values())) < 5 * np.sqrt(sum(exp.values()))


def test_zero_rate_means_no_faults() -> None:
    spec = RunSpec(hosts=64, duration_s=86400, interval_s=60, seed=3, fault_rate=0)
    faults, _ = plan_faults(spec, Timeline(spec.ticks), np.random.default_rng(3))
    assert faults == []


def test_overlapping_faults_share_a_host_only_on_other_gpus(every_mode_run) -> None:  # type: ignore[no-untyped-def]
    """Faults on one host overlap only when both are GPU-reset-or-nothing modes on different
    components (plan.OVERLAP_OK); a mode that reboots the host never overlaps another fault."""
    from simulator.plan import OVERLAP_OK

    by_host: dict[str, list] = {}
    for t in every_mode_run.truth:
        by_host.setdefault(t["host"], []).append(t)
    overlaps = 0
    for faults in by_host.values():
        faults.sort(key=lambda t: t["onset"])
        for i, a in enumerate(faults):
            for b in faults[i + 1:]:
                if b["onset"] < a["end"]:
                    overlaps += 1
                    assert a["failure_mode"] in OVERLAP_OK and b["failure_mode"] in OVERLAP_OK, (a, b)
                    assert a["component"] != b["component"], (a, b)
    assert overlaps >= 1, "no overlapping faults in a fault-dense run"


def test_truth_file_fields_and_meta(every_mode_run) -> None:  # type: ignore[no-untyped-def]
    keys = {"id", "host", "cluster", "rack", "component", "component_kind", "failure_mode", "onset", "end",
            "secondary", "notes"}
    for t in every_mode_run.truth:
        assert set(t) == keys
        assert t["failure_mode"] in FAULT_LABELS and t["end"] >= t["onset"]
    meta = json.loads(every_mode_run.out.with_name("every.meta.json").read_text())
    assert sum(meta["faults"].values()) == len(every_mode_run.truth)
    assert meta["spec"]["seed"] == 11
