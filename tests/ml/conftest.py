"""Small trained models shared by the ML tests (trained once per session on the synthetic fleet)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from detectors.ml.labels import FaultIndex
from detectors.ml.train import Fleet, TrainConfig, TrainResult, train, windows_of
from tests.ml.synth import fleet

HOSTS, DURATION = 12, 5400.0


def synth_loader(hosts: int = HOSTS, duration_s: float = DURATION, faults: int = 10) -> Callable[[int], Fleet]:
    def load(seed: int) -> Fleet:
        samples, truth = fleet(seed, hosts=hosts, duration_s=duration_s, faults=faults)
        fl = windows_of(samples, 60.0)
        fl.faults = FaultIndex(truth)
        return fl

    return load


@pytest.fixture(scope="session")
def trained() -> TrainResult:
    cfg = TrainConfig(hosts=HOSTS, duration_s=DURATION, seeds=(11, 12), holdout_seed=13, max_iter=30)
    return train(cfg, synth_loader())


@pytest.fixture(scope="session")
def model_dir(trained: TrainResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from detectors.ml.model_io import save_model
    from detectors.ml.train import PEER_NAME, SUPERVISED_NAME

    d = tmp_path_factory.mktemp("models")
    save_model(d, SUPERVISED_NAME, trained.supervised, trained.supervised_meta)
    save_model(d, PEER_NAME, trained.peer, trained.peer_meta)
    return d
