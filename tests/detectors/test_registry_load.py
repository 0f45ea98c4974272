"""A declared detector that does not import, or whose model does not load, fails start-up loudly
(``DetectorLoadError``) instead of ``--with-models`` quietly running rules only."""

from __future__ import annotations

import shutil

import pytest

from detectors import registry
from detectors.ml import MODEL_DIR, MLSuite
from detectors.registry import DetectorLoadError, load_model_detector, model_detectors


def test_shipped_models_load():
    dets = model_detectors()
    assert len(dets) == 1 and isinstance(dets[0], MLSuite)
    assert len(dets[0].members) == len(registry.MODEL_DETECTORS)


def test_missing_model_fails_start_up(tmp_path):
    with pytest.raises(DetectorLoadError, match="no model in"):
        model_detectors(tmp_path)
    with pytest.raises(DetectorLoadError, match="peer_anomaly"):
        load_model_detector("peer_anomaly", tmp_path)


def test_one_of_two_models_missing_fails(tmp_path):
    for f in MODEL_DIR.glob("fault_classifier.*"):
        shutil.copy(f, tmp_path / f.name)
    with pytest.raises(DetectorLoadError, match="peer_anomaly"):
        model_detectors(tmp_path)


def test_corrupt_model_fails(tmp_path):
    for f in MODEL_DIR.iterdir():
        if f.is_file():
            shutil.copy(f, tmp_path / f.name)
    (tmp_path / "peer_anomaly.json").write_text("{not json")
    with pytest.raises(DetectorLoadError, match="not loaded"):
        model_detectors(tmp_path)


def test_declared_module_that_does_not_import_fails(monkeypatch):
    monkeypatch.setattr(registry, "MODEL_SUITE", ("detectors.no_such_module", "load", frozenset({"x"})))
    with pytest.raises(DetectorLoadError, match="does not import"):
        model_detectors()
    monkeypatch.setitem(registry.MODEL_DETECTORS, "ghost", ("detectors.no_such_module", "load"))
    with pytest.raises(DetectorLoadError, match="does not import"):
        load_model_detector("ghost")


def test_declared_loader_missing_fails(monkeypatch):
    monkeypatch.setitem(registry.MODEL_DETECTORS, "ghost", ("detectors.ml", "load_ghost"))
    with pytest.raises(DetectorLoadError, match="no loader load_ghost"):
        load_model_detector("ghost")
    with pytest.raises(DetectorLoadError, match="no model detector named"):
        load_model_detector("never-declared")


def test_detect_cli_reports_a_load_error(monkeypatch, capsys):
    from fleetcli.cli import main

    monkeypatch.setattr(registry, "MODEL_SUITE", ("detectors.no_such_module", "load", frozenset({"x"})))
    rc = main(["detect", "--bus", "memory", "--with-models", "--exit-when-idle", "--metrics-port", "0"])
    assert rc == 2
    assert "does not import" in capsys.readouterr().err
