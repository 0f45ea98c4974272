"""Host-samples per second per core through decode + ML features + both ML detectors (printed, not asserted).

    .venv/bin/python benchmarks/bench_ml.py [--hosts 64] [--duration 2h] [--model-dir detectors/models]

Simulates a fleet with the fleet simulator (fault rate x 200), encodes it to JSON lines, then times
on one core: decode only; decode + feature windows; decode + features + classifier + peer detector
(one shared feature stream, as the engine would run them). Where the rules engine is importable it
also times decode + rules + ML together.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds of fleet time")
    ap.add_argument("--model-dir", type=Path, default=ROOT / "detectors" / "models")
    args = ap.parse_args()

    from collectors.fleetsim.engine import simulate
    from collectors.fleetsim.plan import RunSpec
    from detectors.ml import load_peer, load_supervised
    from detectors.ml.features import FeatureStream
    from fleethealth.bus import iter_jsonl
    from fleethealth.schema import decode_sample

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.jsonl"
        simulate(RunSpec(hosts=args.hosts, duration_s=args.duration, interval_s=10.0, seed=7, fault_rate=200.0), out)
        lines = [raw for _, raw in iter_jsonl(out)]
    n = len(lines)
    print(f"fleet: {args.hosts} hosts x {args.duration:.0f} s at 10 s = {n} samples "
          f"({sum(map(len, lines)) / n / 1024:.1f} KiB each)")

    def timed(label: str, fn) -> float:  # type: ignore[no-untyped-def]
        t = time.process_time()
        extra = fn()
        dt = time.process_time() - t
        print(f"  {label:<44} {n / dt:>10,.0f} host-samples/s/core   {dt / n * 1e6:7.1f} µs/sample  {extra or ''}")
        return dt

    def models():  # type: ignore[no-untyped-def]
        sup, peer = loaded
        sup.reset()
        peer.reset()
        return sup, peer

    t = time.perf_counter()
    loaded = (load_supervised(args.model_dir), load_peer(args.model_dir))
    print(f"  models loaded in {time.perf_counter() - t:.2f} s (not counted below)")
    samples = []
    timed("decode", lambda: samples.extend(decode_sample(b) for b in lines))

    def features() -> str:
        fs = FeatureStream()
        k = sum(1 for s in samples if fs.feed(s) is not None)
        return f"({k} windows)"

    timed("features (after decode)", features)

    def ml() -> str:
        stream = FeatureStream(window_s=60.0)
        sup, peer = models()
        found = 0
        for s in samples:
            w = stream.feed(s)
            if w is not None:
                found += len(sup.score_window(w)) + len(peer.score_window(w))
        return f"({found} findings)"

    timed("features + classifier + peer (after decode)", ml)

    def all_ml() -> str:
        stream = FeatureStream(window_s=60.0)
        sup, peer = models()
        for b in lines:
            w = stream.feed(decode_sample(b))
            if w is not None:
                sup.score_window(w)
                peer.score_window(w)
        return ""

    timed("decode + features + classifier + peer", all_ml)
    try:
        from detectors.engine import DetectorEngine
    except ImportError:
        print("  (rules engine not importable: decode + rules + ML not timed)")
        return 0

    def everything() -> str:
        eng = DetectorEngine()
        stream = FeatureStream(window_s=60.0)
        sup, peer = models()
        for b in lines:
            s = decode_sample(b)
            eng.feed(s)
            w = stream.feed(s)
            if w is not None:
                sup.score_window(w)
                peer.score_window(w)
        return ""

    timed("decode + rules engine + features + ML", everything)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
