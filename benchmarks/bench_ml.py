"""ML detectors' cost per host-sample on one core (printed, never asserted).

    .venv/bin/python benchmarks/bench_ml.py [--hosts 32] [--duration 3600] [--fault-rate 1]

Simulates a fleet with the fleet simulator (default fault rates: mostly healthy background noise,
as in production), encodes it to JSON lines, then times on one core (process CPU time):

* features only (after decode): the shared windowed feature stream;
* features + classifier + peer detector, amortised per sample: both detectors on one stream, the
  classifier batching gated rows (256 rows / 10 s of sample time, plus a flush at the end);
* decode + rules engine + ML per sample: the engine with both ML detectors registered, flushed at
  the end of every 2,000-sample poll batch, as the detect worker does;
* the fraction of windows the classifier's gate lets through, and predict_proba calls made.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.table import Row  # noqa: E402


def _fleet(hosts: int, duration_s: float, fault_rate: float) -> list[bytes]:
    from collectors.fleetsim.engine import simulate
    from collectors.fleetsim.plan import RunSpec
    from fleethealth.bus import iter_jsonl

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.jsonl"
        simulate(RunSpec(hosts=hosts, duration_s=duration_s, interval_s=10.0, seed=7, fault_rate=fault_rate), out)
        return [raw for _, raw in iter_jsonl(out)]


def _cpu(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.process_time()
    fn()
    return time.process_time() - t


def rows(hosts: int = 32, duration_s: float = 3600.0, fault_rate: float = 1.0,
         model_dir: Path | None = None) -> list[Row]:
    from detectors.engine import DetectorEngine
    from detectors.ml import load_ml_detectors
    from detectors.ml.features import FeatureStream
    from fleethealth.schema import decode_sample

    lines = _fleet(hosts, duration_s, fault_rate)
    n = len(lines)
    fleet = f"{hosts} hosts x {duration_s / 3600:.1f} h at 10 s, fault rate x{fault_rate:g}"
    samples = [decode_sample(b) for b in lines]
    dets = load_ml_detectors(model_dir)
    if not dets:
        return [Row("ml", "no trained model", 0.0, "", "run `fleethealth train` first")]
    sup = dets[0]

    def features() -> None:
        fs = FeatureStream()
        for s in samples:
            fs.feed(s)

    def ml() -> None:
        for d in dets:
            d.reset()
        for s in samples:
            for d in dets:
                d.feed(s)
        for d in dets:
            d.flush()

    def everything() -> None:
        eng = DetectorEngine(extra_detectors=dets)
        eng.reset()
        for i, b in enumerate(lines, 1):
            eng.feed(decode_sample(b))
            if i % 2000 == 0:
                for d in dets:
                    d.flush()  # where the worker ends a poll batch (see docs/detectors.md, "ML")
        for d in dets:
            d.flush()

    def rules_only() -> None:
        eng = DetectorEngine()
        for b in lines:
            eng.feed(decode_sample(b))

    t_feat = _cpu(features)
    t_ml = _cpu(ml)
    st = dict(sup.stats)  # type: ignore[attr-defined]
    t_all = _cpu(everything)
    t_rules = _cpu(rules_only)
    gated = st["gated"] / max(st["rows"], 1)
    return [
        Row("ml", "features only, per sample", t_feat / n * 1e6, "µs", fleet),
        Row("ml", "features + classifier + peer, amortised per sample", t_ml / n * 1e6, "µs",
            f"{st['windows']} windows, {st['batches']} predict batches"),
        Row("ml", "ML added on top of features, per sample", (t_ml - t_feat) / n * 1e6, "µs", "batched scoring"),
        Row("ml", "rows through the classifier's gate", 100.0 * gated, "%", f"{st['gated']} of {st['rows']} rows"),
        Row("ml", "decode + rules engine, per sample", t_rules / n * 1e6, "µs", fleet),
        Row("ml", "decode + rules engine + ML, per sample", t_all / n * 1e6, "µs", fleet),
        Row("ml", "decode + rules + ML rate, one core", n / t_all, "host-samples/s", "target 20,000"),
    ]


if __name__ == "__main__":
    from benchmarks.table import render

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=32)
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds of fleet time")
    ap.add_argument("--fault-rate", type=float, default=1.0)
    ap.add_argument("--model-dir", type=Path, default=None)
    a = ap.parse_args()
    print(render(rows(a.hosts, a.duration, a.fault_rate, a.model_dir)))
