"""Simulator and replay throughput in host-samples per second (printed, never asserted).

    .venv/bin/python benchmarks/bench_simulate.py [--hosts 512] [--hours 1]

Measures: generation only (bytes discarded), generation to .jsonl, generation to .jsonl.gz, and
replay of the gz file into the in-process bus; then extrapolates the 512-host day at 30 s (1.47 M
samples) from the measured rates.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from collectors.fleetsim.engine import Simulation, simulate
from collectors.fleetsim.plan import RunSpec
from collectors.fleetsim.replay import replay_file
from fleethealth.bus import InProcessBus

DAY_SAMPLES = 512 * 2880


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=512)
    ap.add_argument("--hours", type=float, default=0.5)
    a = ap.parse_args()
    spec = RunSpec(hosts=a.hosts, duration_s=a.hours * 3600, interval_s=30, seed=1, fault_rate=100)
    rows = []
    t = time.perf_counter()
    sim = Simulation(spec)
    setup = time.perf_counter() - t
    nbytes = [0]

    def sink(b: bytes) -> None:
        nbytes[0] += len(b)

    t = time.perf_counter()
    res = sim.run(sink)
    dt = time.perf_counter() - t
    rows.append(("generate (discard bytes)", res.samples, dt))
    with tempfile.TemporaryDirectory() as d:
        for name in ("b.jsonl", "b.jsonl.gz"):
            t = time.perf_counter()
            r = simulate(spec, Path(d) / name)
            rows.append((f"generate -> {name}", r.samples, time.perf_counter() - t))
        gz = Path(d) / "b.jsonl.gz"
        size = gz.stat().st_size
        t = time.perf_counter()
        st = replay_file(gz, InProcessBus())
        rows.append(("replay .jsonl.gz -> memory bus", st.published, time.perf_counter() - t))
    print(f"fleet: {a.hosts} hosts x {a.hours} h at 30 s; setup {setup:.2f} s; "
          f"{nbytes[0] / max(res.samples, 1):.0f} B/sample JSON, {size / max(res.samples, 1):.0f} B/sample gzipped")
    print(f"{'stage':34} {'samples':>9} {'seconds':>8} {'samples/s':>10} {'512-host day (s)':>17}")
    for name, n, sec in rows:
        rate = n / sec
        print(f"{name:34} {n:9d} {sec:8.2f} {rate:10.0f} {DAY_SAMPLES / rate:17.0f}")


if __name__ == "__main__":
    main()
