"""Shared simulator runs (built once per session; each a few seconds at most)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from fleethealth.bus import read_values
from fleethealth.recordings import truth_path
from fleethealth.schema import decode_sample
from simulator.engine import simulate
from simulator.plan import RunSpec


class Run:
    def __init__(self, out: Path, spec: RunSpec) -> None:
        self.spec = spec
        self.out = out
        self.result = simulate(spec, out)
        self.raw = list(read_values(out))
        self.samples = [decode_sample(b) for b in self.raw]
        self.by_host: dict[str, list] = defaultdict(list)
        for s in self.samples:
            self.by_host[s.host].append(s)
        import json

        self.truth = [json.loads(x) for x in truth_path(out).read_text().splitlines()]


@pytest.fixture(scope="session")
def every_mode_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """24 hosts x 8 h at 60 s with at least two faults of every mode."""
    d = tmp_path_factory.mktemp("sim")
    return Run(d / "every.jsonl.gz", RunSpec(hosts=24, duration_s=8 * 3600, interval_s=60, seed=11,
                                             fault_rate=20, min_per_mode=2))


@pytest.fixture(scope="session")
def driver_update_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    d = tmp_path_factory.mktemp("sim")
    return Run(d / "du.jsonl", RunSpec(hosts=12, duration_s=2 * 3600, interval_s=60, seed=5, fault_rate=0,
                                       scenario="driver-update"))
