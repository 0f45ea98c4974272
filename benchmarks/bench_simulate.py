"""Simulator and replay throughput in host-samples per second (printed, never asserted).

    .venv/bin/python benchmarks/bench_simulate.py [--hosts 512] [--hours 1] [--day]

Measures generation with the bytes produced and discarded, generation to .jsonl and to .jsonl.gz
(level 1, the default), and replay of the .jsonl.gz into the in-process bus; projects the 512-host
day at 30 s (1.47 M samples) from the measured rates, or with ``--day`` also generates that whole
day (bytes discarded) and reports the measured time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.table import Row, render
from fleethealth.bus import InProcessBus
from simulator.engine import Simulation, simulate
from simulator.plan import RunSpec
from simulator.replay import replay_file

DAY_SAMPLES = 512 * 2880
REPLAY_LIMIT = 30_000  # the in-process bus keeps every message: bound its memory


def _discard(spec: RunSpec) -> tuple[int, int, float, float]:
    """(samples, JSON bytes, setup s, run s): every interval's block joined into bytes, then dropped."""
    t = time.perf_counter()
    sim = Simulation(spec)
    setup = time.perf_counter() - t
    nbytes = 0

    def sink(block: bytes) -> None:
        nonlocal nbytes
        nbytes += len(block)

    t = time.perf_counter()
    res = sim.run(emit_block=sink)
    return res.samples, nbytes, setup, time.perf_counter() - t


def rows(hosts: int = 512, hours: float = 1.0, day: bool = False) -> list[Row]:
    spec = RunSpec(hosts=hosts, duration_s=hours * 3600, interval_s=30, seed=1, fault_rate=100)
    size = f"{hosts} hosts x {hours:g} h at 30 s"
    out: list[Row] = []
    c = time.process_time()
    n, nbytes, setup, sec = _discard(spec)
    stages = [("generate, bytes discarded", n, setup + sec, time.process_time() - c,
               f"{size}: {n:,} samples, {nbytes / n:,.0f} B each")]
    with tempfile.TemporaryDirectory() as d:
        for name in ("b.jsonl", "b.jsonl.gz"):
            p = Path(d) / name
            t, c = time.perf_counter(), time.process_time()
            r = simulate(spec, p)
            dt = time.perf_counter() - t
            stages.append((f"generate -> .{name.split('.', 1)[1]}", r.samples, dt, time.process_time() - c,
                           f"{size}: {p.stat().st_size / r.samples:,.0f} B/sample on disk"
                           + (" (gzip level 1)" if name.endswith(".gz") else "")))
            if name.endswith(".jsonl"):
                p.unlink()  # ~14 KB a sample: don't keep it beside the next one
        gz = Path(d) / "b.jsonl.gz"
        t = time.perf_counter()
        st = replay_file(gz, InProcessBus(), limit=REPLAY_LIMIT)
        replay = (st.published, time.perf_counter() - t)
    for name, k, s, _, covers in stages:
        out.append(Row("simulate", f"{name}", k / s, "host-samples/s", covers))
    for name, k, s, cpu, _ in stages:
        out.append(Row("simulate", f"512-host day at 30 s, projected: {name}", DAY_SAMPLES * s / k, "s",
                       f"1.47 M samples, from {size}; target < 60 s; CPU (all threads) {DAY_SAMPLES * cpu / k:.0f} s"))
    if day:
        day_spec = RunSpec(hosts=512, duration_s=86400, interval_s=30, seed=1, fault_rate=100)
        n, nbytes, setup, sec = _discard(day_spec)
        out.append(Row("simulate", "512-host day at 30 s, measured: generate, bytes discarded", setup + sec, "s",
                       f"{n:,} samples, {nbytes / 1e9:.1f} GB of JSON; target < 60 s"))
    out.append(Row("replay", ".jsonl.gz -> memory bus (decode + publish)", replay[0] / replay[1], "host-samples/s",
                   f"first {replay[0]:,} samples of the {size} file"))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=512)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--day", action="store_true", help="also generate the whole 512-host day (bytes discarded)")
    a = ap.parse_args()
    print(render(rows(a.hosts, a.hours, a.day)))
