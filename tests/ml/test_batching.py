"""Batched scoring, the learned gate, training labels and the engine's flush."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from detectors.engine.engine import DetectorEngine
from detectors.ml import load_ml_detectors, load_supervised
from detectors.ml.features import GI, GPU_FEATURES, FeatureStream
from detectors.ml.gate import FLOORS, Gate, learn_gate
from detectors.ml.labels import Fault, FaultIndex, training_label
from tests.ml.conftest import DURATION
from tests.ml.synth import fleet

MODES = ("gpu_ecc_sbe_storm", "net_link_bad_cable", "gpu_thermal", "gpu_nvlink_error")


def _faulty(seed: int = 41) -> list:
    return fleet(seed, hosts=8, duration_s=DURATION, faults=8, modes=MODES)[0]


def _key(f) -> tuple:  # type: ignore[no-untyped-def]
    return (f.host, f.component, f.failure_mode, f.ts, f.confidence)


def test_batched_findings_equal_window_by_window_scoring(model_dir: Path) -> None:
    samples = _faulty()
    now = load_supervised(model_dir)
    stream = FeatureStream()
    want = [f for s in samples if (w := stream.feed(s)) is not None for f in now.score_window(w)]
    det = load_supervised(model_dir)
    det.batch_windows, det.batch_s = 16, 1e9  # flush on size only
    got = [f for s in samples for f in det.feed(s)] + det.flush()
    assert want and sorted(map(_key, got)) == sorted(map(_key, want))
    assert det.stats["batches"] < det.stats["windows"] / 4  # far fewer predict calls than windows
    assert det.pending == [] and det.flush() == []


def test_time_bound_flush_keeps_the_sample_time(model_dir: Path) -> None:
    det = load_supervised(model_dir)
    det.batch_windows, det.batch_s = 10**9, 10.0
    late = []
    for s in _faulty():
        for f in det.feed(s):
            late.append(s.ts - f.ts)
    assert late and max(late) <= 10.0 + 10.0 + 1e-6  # within batch_s (+ one poll) of sample time
    assert min(late) >= 0.0  # the finding carries its window's time, not the flush's


def test_engine_flush_turns_held_rows_into_incidents(model_dir: Path) -> None:
    det = load_supervised(model_dir)
    det.batch_windows, det.batch_s = 10**9, 1e12  # nothing leaves before flush
    eng = DetectorEngine(extra_detectors=[det])
    samples = _faulty()
    fed = [i for s in samples for i in eng.feed(s) if i.detector.startswith("model:")]
    assert fed == [] and det.pending
    flushed = eng.flush()
    assert any(i.detector.startswith("model:fault_classifier") for i in flushed)
    assert det.pending == [] and eng.flush() == []


def test_detectors_share_one_feature_stream(model_dir: Path) -> None:
    dets = load_ml_detectors(model_dir)
    assert dets[0].stream is dets[1].stream  # type: ignore[attr-defined]
    samples = _faulty()[:400]
    for s in samples:
        for d in dets:
            d.feed(s)
    assert dets[0].stream.skipped == 0  # type: ignore[attr-defined]


def test_gate_learns_the_noise_and_lets_hard_signals_through() -> None:
    rng = np.random.default_rng(0)
    healthy = np.zeros((20_000, len(GPU_FEATURES)))
    healthy[:, GI["temp_z"]] = rng.normal(0, 2.0, 20_000)
    healthy[rng.integers(0, 20_000, 40), GI["dram_ce_x"]] = 1.2  # a few CEs now and then
    gate = learn_gate({"gpu": healthy})
    t = gate.thresholds["gpu"]
    assert t["dram_ce_x"] >= 1.2 and t["temp_z"] > FLOORS["gpu"]["temp_z"]
    assert gate.mask("gpu", healthy).mean() < 0.001
    rows = np.zeros((4, len(GPU_FEATURES)))
    rows[0, GI["dram_ue"]] = 1  # an uncorrectable error: always scored
    rows[1, GI["xid_app_error"]] = rows[1, GI["xid_bucket_restart_app"]] = 1  # a job crash: not scored
    rows[2, GI["dram_ce_x"]] = 10 * t["dram_ce_x"]  # a storm
    assert gate.mask("gpu", rows).tolist() == [True, False, True, False]
    assert Gate(gate.to_json()).mask("gpu", healthy).tolist() == gate.mask("gpu", healthy).tolist()  # sidecar round trip


def test_training_labels_follow_what_a_window_can_show() -> None:
    uce = Fault("h", "GPU-1", "gpu_dram_uce", 1000.0, 5000.0, ("gpu_row_remap_pending",))
    assert training_label(uce, 950.0, 1010.0) == "gpu_dram_uce"  # the window holding the UCE
    assert training_label(uce, 1010.0, 1070.0) == "gpu_row_remap_pending"  # what lingers: Xid 63's pending remap
    assert training_label(uce, 900.0 - 3600, 960.0 - 3600) is None  # precursor CE ramp: ambiguous, not trained on
    assert training_label(uce, 5010.0, 5070.0) is None  # settling after the reset
    assert training_label(uce, 9000.0, 9060.0) is False  # unrelated window
    storm = Fault("h", "GPU-2", "gpu_ecc_sbe_storm", 1000.0, 5000.0)
    assert training_label(storm, 3000.0, 3060.0) == "gpu_ecc_sbe_storm"  # a state mode lasts
    sram = Fault("h", "GPU-3", "gpu_sram_uce", 1000.0, 5000.0)
    assert training_label(sram, 2000.0, 2060.0) is None  # no lingering state named: not trained on
    ev = FaultIndex([uce], grace_s=600.0)
    assert ev.by_host["h"] and not FaultIndex([uce], training=True).grace_s


def test_registry_builds_the_shipped_models_on_one_feature_stream() -> None:
    from detectors.ml import MLSuite
    from detectors.registry import model_detectors

    ds = model_detectors()
    if not ds:
        pytest.skip("no shipped model in detectors/models")
    assert len(ds) == 1 and isinstance(ds[0], MLSuite)  # one engine entry: features once per sample
    members = ds[0].members
    assert len(members) == 2 and all(m.stream is ds[0].stream for m in members)
    assert ds[0].stream.consumers == 1


def test_the_suite_finds_what_its_members_find_fed_one_by_one(model_dir: Path) -> None:
    from detectors.ml import load_ml_suite

    samples = _faulty()
    apart = load_ml_detectors(model_dir)
    want = [f for s in samples for d in apart for f in d.feed(s)] + [f for d in apart for f in d.flush()]
    suite = load_ml_suite(model_dir)[0]
    got = [f for s in samples for f in suite.feed(s)] + suite.flush()
    assert want and sorted(map(_key, got)) == sorted(map(_key, want))
    assert {f.detector.split("@")[0] for f in got} <= {"model:fault_classifier", "model:peer_anomaly"}


def _held_suite(model_dir: Path):  # type: ignore[no-untyped-def]
    from detectors.ml import load_ml_suite

    suite = load_ml_suite(model_dir)[0]
    for m in suite.members:
        m.batch_windows, m.batch_s = 10**9, 1e12  # nothing leaves before flush
    return suite


def test_forget_host_drops_its_state_and_its_waiting_windows(model_dir: Path) -> None:
    """A partition moved away: the host's feature state, streaks and buffered windows go, the rest
    stay (the new owner rebuilds the host and speaks for it)."""
    samples = _faulty()
    suite = _held_suite(model_dir)
    eng = DetectorEngine(extra_detectors=[suite])
    for s in samples:
        eng.feed(s)
    hosts = {w.host for w in suite.members[0].pending}
    gone = sorted({f.host for f in load_supervised(model_dir).score_batch(suite.members[0].pending)})[0]
    assert len(hosts) > 2 and gone in hosts
    eng.forget_host(gone)
    for m in suite.members:
        assert all(w.host != gone for w in m.pending) and gone not in m.streak
        assert {w.host for w in m.pending} == hosts - {gone}
    assert gone not in suite.stream.hosts
    assert all(i.host != gone for i in eng.flush())


def test_after_a_rebuild_held_model_findings_advance_episodes_silently(model_dir: Path) -> None:
    samples = _faulty()
    loud = DetectorEngine(extra_detectors=[_held_suite(model_dir)])
    for s in samples:
        loud.replay(s)
    assert any(i.detector.startswith("model:") or "classifier p(" in str(i.evidence) for i in loud.flush())
    quiet = DetectorEngine(extra_detectors=[_held_suite(model_dir)])
    for s in samples:
        quiet.replay(s)
    assert quiet.flush(silent=True) == []  # replayed windows: nothing is published again ...
    assert quiet.flush() == []  # ... and nothing is left to publish later
    assert set(quiet.episodes.open) == set(loud.episodes.open)  # the episodes advanced all the same
