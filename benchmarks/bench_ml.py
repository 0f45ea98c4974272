"""The ML detectors' cost per host-sample, and the issue's figure: host-samples per second per
core through decode + state + rules + ML (printed, never asserted).

    .venv/bin/python benchmarks/bench_ml.py [--hosts 256] [--duration 1800] [--fault-rate 1] [--repeat 3]

Simulates a fleet with the fleet simulator (default fault rates: mostly healthy background noise,
as in production; 10 s polls), encodes it as the collectors publish it (msgpack), then times on one
core (process CPU time, best of ``--repeat`` runs, each with fresh state) what a detect worker runs
per record, hosts interleaved as on a partition:

* the IncrementalDecoder alone, and decode + state + rules (DetectorEngine);
* decode + state + rules + both ML detectors (one shared feature stream; windows scored in
  batches as the worker does, with the engine flushed every 2,000 records, a poll batch);
* the ML parts apart: the windowed feature stream, and the two models' batched scoring;
* the fraction of window rows the classifier's gate lets through.

The host count matters: a worker owns thousands of hosts, so each host's state is cold in the CPU
caches when its next sample arrives. 256 hosts (≈ 14 MB of detector state) is past this machine's
L2; 32 hosts fit in it and run ≈ 30 % faster — quote the larger figure.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.table import Row  # noqa: E402
from benchmarks.timing import best_cpu, worker_path  # noqa: E402


def _fleet(hosts: int, duration_s: float, fault_rate: float) -> list[bytes]:
    from fleethealth.bus import iter_jsonl
    from simulator.engine import simulate
    from simulator.plan import RunSpec

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.jsonl"
        simulate(RunSpec(hosts=hosts, duration_s=duration_s, interval_s=10.0, seed=7, fault_rate=fault_rate), out)
        return [raw for _, raw in iter_jsonl(out)]


def rows(hosts: int = 256, duration_s: float = 1800.0, fault_rate: float = 1.0, model_dir: Path | None = None,
         repeat: int = 3, quick: bool = False) -> list[Row]:
    from detectors.engine.fastdecode import IncrementalDecoder
    from detectors.ml import MLSuite, load_ml_detectors
    from detectors.ml.features import FeatureStream
    from fleethealth.schema import decode_sample, encode_packed

    if quick:
        hosts, duration_s, repeat = 64, 900.0, 1
    packed = [encode_packed(decode_sample(b)) for b in _fleet(hosts, duration_s, fault_rate)]
    n = len(packed)
    fleet = f"{hosts} hosts x {duration_s / 60:.0f} min at 10 s (msgpack), fault rate x{fault_rate:g}"
    dets = load_ml_detectors(model_dir)
    if not dets:
        return [Row("ml", "no trained model", 0.0, "", "run `fleethealth train` first")]
    sup = dets[0]
    dec = IncrementalDecoder()
    decoded = [dec.decode(b) for b in packed]
    window_s = sup.stream.window_s  # the shipped models' window
    fs = FeatureStream(window_s=window_s)
    windows = [w for s in decoded if (w := fs.feed(s)) is not None]

    def decode_only() -> None:
        d = IncrementalDecoder().decode
        for b in packed:
            d(b)

    def features() -> None:
        f = FeatureStream(window_s=window_s)
        for s in decoded:
            f.feed(s)

    per_batch = max(1, round(len(windows) / max(1, duration_s / 60.0)))  # windows closing per 60 s (batch_s)
    per_window = round(window_s / 10.0)

    def scoring() -> None:
        for d in dets:
            d.reset()
        for i in range(0, len(windows), per_batch):
            for d in dets:
                d.score_batch(windows[i:i + per_batch])

    t_dec = best_cpu(decode_only, repeat)
    t_rules = best_cpu(worker_path(packed, []), repeat)
    t_all = best_cpu(worker_path(packed, [MLSuite(dets)]), repeat)  # as detect --with-models runs them
    t_feat = best_cpu(features, repeat)
    t_score = best_cpu(scoring, repeat)
    st = dict(sup.stats)  # type: ignore[attr-defined]
    gated = st["gated"] / max(st["rows"], 1)
    us = 1e6 / n
    return [
        Row("ml", "decode (incremental, msgpack), per sample", t_dec * us, "µs", fleet),
        Row("ml", "decode + state + rules, per sample", t_rules * us, "µs", fleet),
        Row("ml", "decode + state + rules + ML, per sample", t_all * us, "µs",
            f"ML adds {(t_all - t_rules) * us:.1f} µs in the engine"),
        Row("ml", "decode + state + rules + ML, one core", n / t_all, "host-samples/s",
            f"target 20,000; = {n / t_all * 10:,.0f} hosts at a 10 s poll"),
        Row("ml", "ML feature stream alone, per sample", t_feat * us, "µs",
            f"{len(windows)} windows of {window_s:g} s (one per {per_window} samples)"),
        Row("ml", "ML scoring alone (classifier + peer), per sample", t_score * us, "µs",
            f"batches of {per_batch} windows (60 s of this fleet)"),
        Row("ml", "window rows through the classifier's gate", 100.0 * gated, "%",
            f"{st['gated']} of {st['rows']} rows"),
    ]


if __name__ == "__main__":
    from benchmarks.table import render

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=256)
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds of fleet time")
    ap.add_argument("--fault-rate", type=float, default=1.0)
    ap.add_argument("--model-dir", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs per figure")
    a = ap.parse_args()
    print(render(rows(a.hosts, a.duration, a.fault_rate, a.model_dir, a.repeat)))
