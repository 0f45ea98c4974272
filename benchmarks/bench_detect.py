"""Detector throughput and latency (printed, never asserted).

1. host-samples per second on one core through decode + per-host state + rules (+ registered ML
   detectors when a trained model is present), in-process, on a shipped recording's raw lines
   (realistic noise) or, without one, on literal samples;
2. sample-to-incident latency through the real Kafka broker at N hosts x 1 Hz (default 1,000):
   a producer publishes every host every second (sample ts = wall clock), a fraction of hosts get
   an uncorrectable-ECC step, a DetectWorker consumes, and a reader times each incident from the
   sample's timestamp to its arrival on the incidents topic. Needs ``scripts/services.sh up``.

    .venv/bin/python benchmarks/bench_detect.py [--kafka 127.0.0.1:9092] [--hosts 1000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from detectors.engine import DetectorEngine  # noqa: E402
from detectors.fixtures import HostSeries  # noqa: E402
from fleethealth.bus import iter_jsonl  # noqa: E402
from fleethealth.schema import decode_incident, decode_sample, encode  # noqa: E402


def _lines(limit: int) -> tuple[list[bytes], str]:
    rec = ROOT / "replay_data" / "smoke-64h.jsonl.gz"
    if rec.exists():
        out = []
        for _, raw in iter_jsonl(rec):
            out.append(raw)
            if len(out) >= limit:
                break
        return out, f"{rec.name} (first {len(out)} samples)"
    fleet = [HostSeries(f"b-{i}") for i in range(64)]
    return [encode(h.advance()) for _ in range(limit // 64) for h in fleet], "literal 8-GPU samples"


def throughput(limit: int, with_models: bool) -> None:
    lines, what = _lines(limit)
    extra = []
    if with_models:
        from detectors.registry import model_detectors

        extra = model_detectors()
    size = statistics.mean(len(x) for x in lines)
    t0 = time.process_time()
    decoded = [decode_sample(x) for x in lines]
    t_dec = time.process_time() - t0
    best = {}
    for label, dets in (("rules", []), ("rules+ML", extra)) if extra else (("rules", []),):
        eng = DetectorEngine(extra_detectors=dets)
        t0 = time.process_time()
        for s in decoded:
            eng.feed(s)
        best[label] = time.process_time() - t0
    n = len(lines)
    print(f"input: {what}, mean {size / 1024:.1f} KiB JSON per sample")
    print(f"  decode only           {n / t_dec:10,.0f} samples/s/core  ({t_dec / n * 1e6:6.1f} us)")
    for label, t in best.items():
        print(f"  state+{label:<16}{n / t:10,.0f} samples/s/core  ({t / n * 1e6:6.1f} us)")
        tot = t + t_dec
        print(f"  decode+state+{label:<9}{n / tot:10,.0f} samples/s/core  ({tot / n * 1e6:6.1f} us)  target >= 20,000")
    if not extra:
        print("  (no trained ML detector registered: rules only)")


def kafka_latency(bootstrap: str, hosts: int, seconds: float, fault_every: int) -> None:
    from detectors.worker import DetectWorker
    from fleethealth.kafka_bus import KafkaBus, ensure_topics

    tag = uuid.uuid4().hex[:8]
    t_tel, t_inc, t_dead = f"bench.{tag}.telemetry", f"bench.{tag}.incidents", f"bench.{tag}.deadletter"
    ensure_topics(bootstrap, [t_tel, t_inc, t_dead], partitions=8)
    bus = KafkaBus(bootstrap, linger_ms=2, compression=None)
    worker = DetectWorker(bus, DetectorEngine(), group=f"bench-{tag}", topic=t_tel, incidents_topic=t_inc,
                          deadletter_topic=t_dead, poll_timeout=0.05, idle_tick=False, max_records=5000)
    reader_bus = KafkaBus(bootstrap)
    reader = reader_bus.consumer([t_inc], f"bench-r-{tag}")
    lat: list[float] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            for r in reader.poll(timeout=0.2):
                inc = decode_incident(r.value)
                if inc.state == "open":
                    lat.append(time.time() - inc.first_seen)

    def work() -> None:
        worker.run()  # retries bus errors; stop() ends it

    threads = [threading.Thread(target=read, daemon=True), threading.Thread(target=work, daemon=True)]
    for t in threads:
        t.start()
    fleet = [HostSeries(f"lat-{tag}-{i:04d}", t0=time.time(), interval=1.0, gpus=8, ports=8) for i in range(hosts)]
    replace = msgspec.structs.replace
    sent = 0
    start = time.time()
    tick = 0
    # one encoded template per host with placeholder ts/seq/UCE digits: the producer's per-message
    # work is a bytes substitution, so the measurement is the pipeline's, not the encoder's
    templates = []
    for i, h in enumerate(fleet):
        s = h.advance()
        s = replace(s, ts=9999999999.5, seq=88888888)
        g = s.gpus[i % 8]
        s.gpus[i % 8] = replace(g, ecc=replace(g.ecc, dram_uncorrected_volatile=777777))
        templates.append((s.host, encode(s)))
    while time.time() - start < seconds:
        t_tick = time.time()
        for i, (host, tpl) in enumerate(templates):
            uce = tick if tick > 2 and (i + tick) % fault_every == 0 else 0
            uce = max(uce, tick - 1 if tick > 3 and (i + tick - 1) % fault_every == 0 else 0)
            msg = (tpl.replace(b"9999999999.5", f"{time.time():.3f}".encode())
                   .replace(b"88888888", str(tick).encode()).replace(b"777777", str(uce).encode()))
            bus.publish(t_tel, host, msg)
            sent += 1
        bus.flush()
        tick += 1
        time.sleep(max(0.0, 1.0 - (time.time() - t_tick)))
    time.sleep(3)
    stop.set()
    worker.stop()
    for t in threads:
        t.join(timeout=5)
    reader.close()
    worker.close()
    bus.close()
    reader_bus.close()
    rate = sent / (time.time() - start - 3)
    print(f"kafka {bootstrap}: {hosts} hosts x 1 Hz for {seconds:.0f}s, {sent} samples published (~{rate:.0f}/s), "
          f"{worker.stats.samples} consumed, {len(lat)} incidents timed")
    if lat:
        lat.sort()
        p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000  # noqa: E731
        print(f"  sample-to-incident latency: p50 {p(0.5):.0f} ms, p99 {p(0.99):.0f} ms, max {lat[-1] * 1000:.0f} ms"
              "  (target p99 < 500 ms)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=10000)
    ap.add_argument("--models", action="store_true", help="include registered ML detectors")
    ap.add_argument("--kafka", default="127.0.0.1:9092", help="broker for the latency run ('' to skip)")
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--fault-every", type=int, default=50, help="one host in N gets a UCE step each second")
    a = ap.parse_args()
    throughput(a.samples, a.models)
    if a.kafka:
        from tests.services import kafka_problem

        why = kafka_problem(a.kafka)
        if why:
            print(f"kafka latency: skipped ({why}; start it with scripts/services.sh up)")
        else:
            kafka_latency(a.kafka, a.hosts, a.seconds, a.fault_every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
