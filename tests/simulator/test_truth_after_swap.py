"""Ground truth names the part that is actually there: after a repair swaps a GPU board (new UUID),
a later fault on that slot is on the new board."""

from __future__ import annotations

import json
from pathlib import Path

from fleethealth.bus import iter_jsonl
from fleethealth.schema import decode_sample
from simulator.engine import simulate
from simulator.faults import KIND
from simulator.plan import RunSpec


def test_every_gpu_fault_names_a_gpu_the_host_reports_during_the_fault(tmp_path: Path) -> None:
    out = tmp_path / "swaps.jsonl"
    # a fault-dense day on 16 hosts at 5 min: boards get swapped, and some slots fail again after
    res = simulate(RunSpec(hosts=16, duration_s=86400.0, interval_s=300.0, seed=1, fault_rate=3000.0), out)
    truth = [json.loads(line) for line in Path(res.truth_path).read_text().splitlines()]
    gpu_faults = [t for t in truth if KIND[t["failure_mode"]] == "gpu"]
    seen: dict[str, list[tuple[float, set[str]]]] = {}
    for _, raw in iter_jsonl(out):
        s = decode_sample(raw)
        seen.setdefault(s.host, []).append((s.ts, {g.uuid for g in s.gpus}))
    wrong = []
    for t in gpu_faults:
        during = [u for ts, u in seen[t["host"]] if t["onset"] <= ts <= t["end"]]
        if during and not any(t["component"] in u for u in during):
            wrong.append((t["id"], t["host"], t["failure_mode"], t["component"]))
    assert len(gpu_faults) > 20
    assert wrong == []
