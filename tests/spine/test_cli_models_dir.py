"""``--models DIR``: what ``fleethealth train --out DIR`` wrote is what detect, run and replay load
(ux.md 8: trained models could not be used without overwriting the shipped ones)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "replay_data" / "sbe-storm-no-uce-16h.jsonl.gz"
pytestmark = pytest.mark.slow


def cli(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHEALTH_")}
    return subprocess.run([sys.executable, "-m", "fleetcli.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models")
    r = cli(["train", "--hosts", "8", "--duration", "30m", "--seed", "1", "--holdout-seed", "9", "--fault-rate",
             "2000", "--min-per-mode", "1", "--out", str(out), "--quiet"], out)
    assert r.returncode == 0, r.stderr
    assert {p.name for p in out.iterdir()} >= {"fault_classifier.skops", "fault_classifier.json",
                                                "peer_anomaly.skops", "peer_anomaly.json"}
    return out


def test_replay_report_loads_trained_models(trained: Path, tmp_path: Path) -> None:
    if not SMALL.exists():
        pytest.skip("dataset not shipped")
    r = cli(["replay", str(SMALL), "--report", str(tmp_path / "rep"), "--models", str(trained), "--json",
             "--quiet"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["samples"] > 0


def test_detect_loads_trained_models(trained: Path, tmp_path: Path) -> None:
    r = cli(["detect", "--bus", "memory", "--exit-when-idle", "--models", str(trained)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "1 extra detectors" in r.stderr


def test_a_folder_without_models_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in (["detect", "--bus", "memory", "--exit-when-idle"], ["replay", str(SMALL), "--report", "rep"]):
        r = cli([*args, "--models", str(empty)], tmp_path)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and str(empty) in r.stderr
        assert not (tmp_path / "rep").exists()


def test_run_loads_trained_models(trained: Path, tmp_path: Path) -> None:
    if not SMALL.exists():
        pytest.skip("dataset not shipped")
    r = cli(["run", "--replay", str(SMALL), "--models", str(trained), "--quiet"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
