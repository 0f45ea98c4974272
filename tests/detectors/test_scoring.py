"""Scorecard matching on literals, and the quality-bar regression on the shipped datasets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from detectors.scoring.scoring import TruthFault, meets_quality_bar, run_recording, score
from fleethealth.recordings import truth_path
from fleethealth.schema import Incident

DATA = Path(__file__).resolve().parents[2] / "replay_data"


def inc(id_, host, comp, mode, t):
    return Incident(id=id_, host=host, component=comp, failure_mode=mode, severity="critical", confidence=0.9,
                    detector="r", first_seen=t, last_seen=t, state="open")


def test_matching_rules():
    truth = [TruthFault("F1", "a", "GPU-1", "gpu_dram_uce", 1000, 2000, ("gpu_row_remap_pending",)),
             TruthFault("F2", "b", "0000:18:00.0", "pcie_fatal", 1000, 1100)]
    incs = [inc("1", "a", "GPU-1", "gpu_dram_uce", 1010), inc("1", "a", "GPU-1", "gpu_dram_uce", 1010),
            inc("2", "a", "GPU-1", "gpu_row_remap_pending", 1011),   # secondary: explained
            inc("3", "a", "GPU-2", "gpu_dram_uce", 1012),            # wrong GPU: false positive
            inc("4", "b", "00000000:18:00.0", "pcie_fatal", 990),    # same device, NVML spelling, within slack
            inc("5", "c", "host", "net_link_down", 5)]               # healthy host
    card = score(truth, incs, hosts=["a", "b", "c"])
    m = card["modes"]
    assert (m["gpu_dram_uce"]["precision"], m["gpu_dram_uce"]["recall"]) == (0.5, 1.0)
    assert m["gpu_dram_uce"]["median_delay_s"] == 10.0
    assert m["gpu_row_remap_pending"]["false_positives"] == 0
    assert m["pcie_fatal"]["recall"] == 1.0 and m["pcie_fatal"]["median_delay_s"] == 0.0
    assert card["healthy_hosts_with_incidents"] == 1 and card["healthy_hosts_with_drain_incidents"] == 1
    assert meets_quality_bar(card)


def test_a_storm_in_the_ramp_before_a_uce_is_its_precursor():
    """fleethealth.taxonomy.PRECURSORS: 6 h before a DRAM UCE, 3 h before a row-remap failure, on
    the same part; a storm before a pending row remap (no ramp in the table) is a false one."""
    h = 3600.0
    t0 = 100 * h
    truth = [TruthFault("U", "a", "GPU-1", "gpu_dram_uce", t0, t0 + h),
             TruthFault("R", "b", "GPU-1", "gpu_row_remap_failure", t0, t0 + h),
             TruthFault("P", "c", "GPU-1", "gpu_row_remap_pending", t0, t0 + h),
             TruthFault("D", "d", "DIMM_A1", "host_dram_uce", t0, t0 + h)]
    incs = [inc("1", "a", "GPU-1", "gpu_ecc_sbe_storm", t0 - 5 * h),   # inside the 6 h ramp
            inc("2", "a", "GPU-2", "gpu_ecc_sbe_storm", t0 - 1 * h),   # another GPU
            inc("3", "b", "GPU-1", "gpu_ecc_sbe_storm", t0 - 2 * h),   # inside the 3 h ramp
            inc("4", "b", "GPU-1", "gpu_ecc_sbe_storm", t0 - 4 * h),   # before it
            inc("5", "c", "GPU-1", "gpu_ecc_sbe_storm", t0 - 1 * h),
            inc("6", "d", "DIMM_A1", "host_dram_ce_storm", t0 - 6 * h)]
    card = score(truth, incs, hosts=["a", "b", "c", "d"])
    storm = card["modes"]["gpu_ecc_sbe_storm"]
    assert (storm["detections"], storm["false_positives"]) == (5, 3)
    assert card["modes"]["host_dram_ce_storm"]["false_positives"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smoke-64h", "driver-update-32h", "flapping-cable-16h", "sbe-storm-no-uce-16h",
                                  "hard-cases-24h", "fleet-128h-1d"])
def test_quality_bar_on_shipped_datasets(name):
    path = DATA / f"{name}.jsonl.gz"
    if not path.exists():
        pytest.skip(f"{path} not shipped in this checkout")
    from detectors.scoring.scoring import load_truth

    res = run_recording(path)
    card = score(load_truth(truth_path(path)), res.incidents, res.hosts, host_ts=res.host_ts)
    assert meets_quality_bar(card) == [], card["false_positive_examples"]
    if name.startswith("driver-update"):
        assert res.incidents == []
    if name == "smoke-64h":
        drain = [m for m, r in card["modes"].items() if r["drain_worthy"]]
        assert len(drain) >= 12  # every drain-worthy mode is present and scored


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fleet-128h-1d", "driver-update-32h"])
def test_quality_bar_holds_with_the_shipped_models(name):
    """Rules + both ML detectors through the whole pipeline. fleet-128h-1d has a one-poll link
    bounce on a healthy host (a switch reboot): one window of it once made the classifier open a
    false net_link_down; a state mode must now persist two windows. It also has healthy NVLinks,
    HBM stacks, cables, risers and DIMMs counting errors steadily under their limits: models
    trained without such parts opened false NVLink tickets on them (NVLink precision 0.02)."""
    from detectors.ml import MODEL_DIR
    from fleetcli.pipeline import RunOptions, run

    path = DATA / f"{name}.jsonl.gz"
    if not path.exists() or not (MODEL_DIR / "fault_classifier.json").exists():
        pytest.skip("dataset or shipped models missing")
    res = run(RunOptions(replay=path, score=True, with_models=True, quiet=True))
    card = res.summary.scorecard
    assert card is not None and meets_quality_bar(card) == [], card["false_positive_examples"]
    assert card["healthy_hosts_with_incidents"] == 0


@pytest.mark.slow
def test_replay_score_cli_json_and_report(tmp_path):
    path = DATA / "sbe-storm-no-uce-16h.jsonl.gz"
    if not path.exists():
        pytest.skip("dataset not shipped")
    r = subprocess.run([sys.executable, "-m", "fleetcli.cli", "replay", str(path), "--score", "--json",
                        "--report", str(tmp_path / "rep")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    card = json.loads(r.stdout)
    row = card["modes"]["gpu_ecc_sbe_storm"]
    assert {"precision", "recall", "f1", "support", "median_delay_s"} <= set(row)
    assert card["healthy_hosts_with_incidents"] == 0
    html = (tmp_path / "rep" / "index.html").read_text()
    assert "id='scorecard'" in html and "id='confusion'" in html and "gpu_ecc_sbe_storm" in html
