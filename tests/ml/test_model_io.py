"""Model files: skops round trip, untrusted types refused, tampering and mismatches fail clearly."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import skops.io as sio
from sklearn.linear_model import LogisticRegression

from detectors.ml import load_ml_detectors, load_peer, load_supervised
from detectors.ml.model_io import ModelError, load_model, save_model
from detectors.ml.supervised import FEATURES
from detectors.ml.train import SUPERVISED_NAME, TrainResult
from tests.ml.conftest import synth_loader


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_round_trip_predicts_the_same(trained: TrainResult, model_dir: Path) -> None:
    fl = synth_loader()(21)
    det = load_supervised(model_dir)
    x = np.vstack([w.gpu for w in fl.windows])
    for kind, model in trained.supervised.items():
        xs = {"gpu": x, "port": np.vstack([w.port for w in fl.windows]),
              "host": np.vstack([w.host_row for w in fl.windows])}[kind]
        assert np.array_equal(det.models[kind].predict_proba(xs), model.predict_proba(xs))
    assert det.name == "model:fault_classifier@1"
    assert load_peer(model_dir).name == "model:peer_anomaly@1"


def test_sidecar_carries_training_metadata(model_dir: Path) -> None:
    meta = json.loads((model_dir / f"{SUPERVISED_NAME}.json").read_text())
    assert meta["trained_on"]["seeds"] == [11, 12] and meta["holdout_seed"] == 13
    assert meta["features"]["gpu"] == list(FEATURES["gpu"])
    assert meta["sklearn_version"] and meta["metrics"]["per_mode"]
    assert "date" not in meta  # reproducible: data_end_ts from the samples, not the clock
    assert meta["trained_on"]["data_end_ts"] > 1.7e9


def test_tampered_archive_with_unexpected_type_is_refused(model_dir: Path, tmp_path: Path) -> None:
    d = _copy(model_dir, tmp_path / "m")
    evil = {"gpu": LogisticRegression().fit(np.eye(2), [0, 1]), "smuggled": np.save}  # a function: never trusted
    (d / f"{SUPERVISED_NAME}.skops").write_bytes(sio.dumps(evil))
    side = d / f"{SUPERVISED_NAME}.json"
    meta = json.loads(side.read_text())
    import hashlib

    meta["sha256"] = hashlib.sha256((d / f"{SUPERVISED_NAME}.skops").read_bytes()).hexdigest()  # a careful attacker
    side.write_text(json.dumps(meta))
    with pytest.raises(ModelError, match="untrusted types"):
        load_supervised(d)


def test_changed_archive_fails_the_checksum(model_dir: Path, tmp_path: Path) -> None:
    d = _copy(model_dir, tmp_path / "m")
    p = d / f"{SUPERVISED_NAME}.skops"
    p.write_bytes(p.read_bytes() + b"\0")
    with pytest.raises(ModelError, match="sha256"):
        load_supervised(d)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("format_version", 99, "model format"),
    ("feature_spec", 0, "feature spec"),
    ("features", {"gpu": ["dram_ce_rate"], "port": [], "host": []}, "feature list differs"),
])
def test_mismatch_is_a_clear_error(model_dir: Path, tmp_path: Path, key: str, value: object, message: str) -> None:
    d = _copy(model_dir, tmp_path / "m")
    side = d / f"{SUPERVISED_NAME}.json"
    meta = json.loads(side.read_text())
    meta[key] = value
    side.write_text(json.dumps(meta))
    with pytest.raises(ModelError, match=message) as err:
        load_supervised(d)
    assert "retrain" in str(err.value)


def test_broken_sidecar_names_the_line(model_dir: Path, tmp_path: Path) -> None:
    d = _copy(model_dir, tmp_path / "m")
    (d / f"{SUPERVISED_NAME}.json").write_text('{\n "version": 1,\n oops\n}')
    with pytest.raises(ModelError, match=r"\.json:3"):
        load_model(d, SUPERVISED_NAME, 1, FEATURES)


def test_no_model_gives_no_detectors_and_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert load_ml_detectors(tmp_path) == []
    assert "fleethealth train" in caplog.text


def test_save_refuses_types_outside_the_list(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="TRUSTED_TYPES"):
        save_model(tmp_path, "x", {"gpu": LogisticRegression().fit(np.eye(2), [0, 1]), "f": np.save}, {})
    assert not (tmp_path / "x.skops").exists()


def test_the_shipped_model_loads_and_is_small() -> None:
    from detectors.ml import MODEL_DIR

    if not (MODEL_DIR / f"{SUPERVISED_NAME}.json").exists():
        pytest.skip("no shipped model in detectors/models (run the training command in docs/detectors.md)")
    dets = load_ml_detectors()
    assert [d.name for d in dets] == ["model:fault_classifier@1", "model:peer_anomaly@1"]
    assert sum(p.stat().st_size for p in MODEL_DIR.iterdir()) < 5 * 1024 * 1024


@pytest.mark.parametrize("archive", ["/etc/passwd", "../outside.skops", "sub/x.skops", ".."])
def test_sidecar_archive_outside_the_model_folder_is_refused(model_dir: Path, tmp_path: Path, archive: str) -> None:
    d = _copy(model_dir, tmp_path / "m")
    side = d / f"{SUPERVISED_NAME}.json"
    meta = json.loads(side.read_text())
    meta["archive"] = archive
    side.write_text(json.dumps(meta))
    with pytest.raises(ModelError, match="must be a file name inside"):
        load_supervised(d)


def test_symlink_out_of_the_folder_and_non_zip_archive_are_model_errors(model_dir: Path, tmp_path: Path) -> None:
    d = _copy(model_dir, tmp_path / "m")
    side = d / f"{SUPERVISED_NAME}.json"
    meta = json.loads(side.read_text())
    outside = tmp_path / "elsewhere.skops"
    shutil.copy(d / meta["archive"], outside)
    (d / "link.skops").symlink_to(outside)
    meta["archive"] = "link.skops"
    side.write_text(json.dumps(meta))
    with pytest.raises(ModelError, match="must be a file name inside"):
        load_supervised(d)
    (d / "plain.skops").write_bytes(b"not a zip archive")
    meta["archive"], meta["sha256"] = "plain.skops", hashlib.sha256(b"not a zip archive").hexdigest()
    side.write_text(json.dumps(meta))
    with pytest.raises(ModelError, match="not a readable skops archive"):
        load_supervised(d)
