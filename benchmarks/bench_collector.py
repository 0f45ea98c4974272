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

from collectors.daemon import Collector, CollectorSettings
from collectors.exporter import SampleMetrics, load_catalog
from collectors.sim_nvml import SimNvml
from collectors.simhost import build_sim_host


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--polls", type=int, default=300)
    ap.add_argument("--fsync", action="store_true", help="fsync the spool on every sample (as in production)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        paths = build_sim_host(Path(d) / "host", n_gpus=8, n_ports=8)
        kmsg = paths["kmsg"]
        metrics = SampleMetrics(load_catalog())
        sim = SimNvml(8, seed=3)
        c = Collector(CollectorSettings(host="bench", expected_gpus=8, sysfs_root=str(paths["sys"]),
                                        proc_root=str(paths["proc"]), kmsg_path=str(kmsg),
                                        state_dir=str(Path(d) / "state"), fsync=args.fsync),
                      sink=NullSink(), nvml=sim, on_sample=metrics.update)
        line = "[  812.117215] NVRM: Xid (PCI:0000:3b:00): 13, pid=2211, name=python3, Graphics Exception\n"
        for _ in range(5):
            c.poll_once()
        cpu_poll = cpu_scrape = 0.0
        wall0 = time.perf_counter()
        for i in range(args.polls):
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
        cpu = cpu_poll / args.polls * 1000  # process time: includes the NVML worker and sender threads
        scrape = cpu_scrape / args.polls * 1000
        wall = (time.perf_counter() - wall0) / args.polls * 1000
        c.flush(10)
        c.close()
        size = len(c.spool.peek(1)[0][1]) if c.spool.depth() else 0
        print("collector, simulated host: 8 GPUs x 18 NVLinks, 8 IB ports, 8 PCIe devices, 2 EDAC MCs, kmsg file")
        print(f"{'polls':<34}{args.polls}")
        print(f"{'CPU per poll ms':<34}{cpu:.2f}   (target < 10)")
        print(f"{'CPU per exporter scrape ms':<34}{scrape:.2f}")
        print(f"{'wall per poll ms':<34}{wall:.2f}")
        print(f"{'RSS MB':<34}{rss_mb():.1f}   (target < 100)")
        print(f"{'CPU share of a core at 1 s poll':<34}{cpu / 10:.2f} %")
        if size:
            print(f"{'sample size bytes':<34}{size}")


if __name__ == "__main__":
    main()
