"""Drill (in-process): Kafka keeps each host's samples in order, never the fleet's. A detect worker
reading 8 partitions gets them in per-partition chunks, so one partition's hosts can run minutes of
sample time ahead of another's. The episodes must not depend on that interleaving: the same
recording fed in file order and fed partition-skewed (per-host order kept) must open the same
episodes under the same ids.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from detectors.engine.engine import DetectorEngine
from fleethealth.bus import iter_jsonl, partition_for
from fleethealth.schema import Incident, decode_sample
from tests.drills import harness as h

pytestmark = pytest.mark.drill
# Was xfail: tick() expired every host's episodes at fleet time (the max sample ts on any partition).
# Fixed: quiet periods run on each host's own sample time (detectors/engine/engine.py).


def _skewed(samples, chunk: int, seed: int) -> list[Incident]:
    parts = [[s for s in samples if partition_for(s.host, 8) == p] for p in range(8)]
    pos, rng, engine, out = [0] * 8, random.Random(seed), DetectorEngine(), []
    while any(pos[p] < len(parts[p]) for p in range(8)):
        p = rng.randrange(8)
        for s in parts[p][pos[p]:pos[p] + chunk]:
            out.extend(engine.feed(s))
        pos[p] += chunk
    return out


def test_partition_skewed_input_opens_the_same_episodes(tmp_path: Path) -> None:
    rec = h.recording(tmp_path, hosts=16, duration_s=2400, fault_rate=400, min_per_mode=1, seed=5)
    samples = [decode_sample(raw) for _, raw in iter_jsonl(rec)]
    ref = h.opened(h.reference_incidents(rec))
    for chunk, seed in [(5, 0), (5, 1), (5, 2), (20, 0)]:
        got = h.opened(_skewed(samples, chunk, seed))
        assert set(got) == set(ref), (chunk, seed, sorted({(got[i].host, got[i].failure_mode) for i in set(got) - set(ref)}))
