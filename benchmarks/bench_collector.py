"""CPU time per poll and RSS of the collector on a simulated 8-GPU, 8-port host, all sources on.

Target: < 10 ms CPU per poll and < 100 MB RSS (a 1 s poll then costs < 1 % of a core).
Prints figures; asserts nothing. Run: .venv/bin/python benchmarks/bench_collector.py [--polls N]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from benchmarks.table import Row
from collectors.daemon import Collector, CollectorSettings
from collectors.exporter import SampleMetrics, load_catalog
from simulator.host import build_sim_host
from simulator.nvml import SimNvml


class NullSink:
    def send_batch(self, records):
        return len(records)

    def close(self):
        pass


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(polls: int = 300, fsync: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        paths = build_sim_host(Path(d) / "host", n_gpus=8, n_ports=8)
        kmsg = paths["kmsg"]
        metrics = SampleMetrics(load_catalog())
        sim = SimNvml(8, seed=3)
        c = Collector(CollectorSettings(host="bench", expected_gpus=8, sysfs_root=str(paths["sys"]),
                                        proc_root=str(paths["proc"]), kmsg_path=str(kmsg),
                                        state_dir=str(Path(d) / "state"), fsync=fsync),
                      sink=NullSink(), nvml=sim, on_sample=metrics.update)
        line = "[  812.117215] NVRM: Xid (PCI:0000:3b:00): 13, pid=2211, name=python3, Graphics Exception\n"
        for _ in range(5):
            c.poll_once()
        cpu_poll = cpu_scrape = 0.0
        wall0 = time.perf_counter()
        for i in range(polls):
            if i % 10 == 0:
                with open(kmsg, "a") as f:
                    f.write(line * 5)
            sim.tick()
            t = time.process_time()
            c.poll_once()
            cpu_poll += time.process_time() - t
            t = time.process_time()
            list(metrics.collect())  # a Prometheus scrape (usually every 15-30 s, not every poll)
            cpu_scrape += time.process_time() - t
        cpu = cpu_poll / polls * 1000  # process time: includes the NVML worker and sender threads
        scrape = cpu_scrape / polls * 1000
        wall = (time.perf_counter() - wall0) / polls * 1000
        c.flush(10)
        c.close()
        size = len(c.spool.peek(1)[0][1]) if c.spool.depth() else 0
    return {"cpu_ms": cpu, "scrape_ms": scrape, "wall_ms": wall, "rss_mb": rss_mb(), "size": size}


def rows(polls: int = 200, fsync: bool = False) -> list[Row]:
    m = measure(polls, fsync)
    host = "one 8-GPU, 8-port host, all sources on"
    return [
        Row("collector", "CPU per poll (target < 10)", m["cpu_ms"], "ms", host),
        Row("collector", "CPU share of a core at a 1 s poll", m["cpu_ms"] / 10, "%", host),
        Row("collector", "CPU per exporter scrape", m["scrape_ms"], "ms", host),
        Row("collector", "RSS (target < 100)", m["rss_mb"], "MB", host),
    ]


def main() -> None:
    from benchmarks.table import render

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--polls", type=int, default=300)
    args = ap.parse_args()
    print(render(rows(args.polls)))


if __name__ == "__main__":
    main()
