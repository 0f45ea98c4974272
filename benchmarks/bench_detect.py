"""Detector throughput and latency (printed, never asserted).

1. host-samples per second on one core (process CPU time) through decode, per-host state + rules,
   and both together, for the JSON and the msgpack wire encodings, plus registered ML detectors
   when a trained model loads; input: a shipped recording's raw lines (realistic noise and faults);
2. sample-to-incident latency through the real Kafka broker at N hosts x 1 Hz (default 1,000):
   a paced producer (each host once a second, hosts spread over the second like independent
   pollers; sample ts = wall clock at send, msgpack on the wire) publishes to a fresh topic; a
   DetectWorker in its own process consumes it as a consumer group member (publish+ack, commit per
   batch, as in production); a reader process times each opened incident from its first sample's
   ts to its arrival on the incidents topic. Every fifth host gets a DRAM UCE at a tick of its own.
   This is latency (p50/p99) at a paced load, not capacity: the worker's CPU per sample at 1 kHz is
   mostly per-poll overhead; capacity through the broker is benchmarks/bench_kafka_capacity.py.
   Over the default Kafka client (fleethealth.config.DEFAULT_KAFKA_CLIENT). Needs scripts/services.sh up.

    .venv/bin/python benchmarks/bench_detect.py [--kafka 127.0.0.1:9092] [--hosts 1000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.table import Row  # noqa: E402
from benchmarks.timing import best_cpu, worker_path  # noqa: E402
from fleethealth.bus import iter_jsonl  # noqa: E402
from fleethealth.schema import decode_sample, encode, encode_packed  # noqa: E402

CORES = os.cpu_count() or 1


def _lines(limit: int) -> tuple[list[bytes], str]:
    rec = ROOT / "replay_data" / "smoke-64h.jsonl.gz"
    if rec.exists():
        out = []
        for _, raw in iter_jsonl(rec):
            out.append(raw)
            if len(out) >= limit:
                break
        return out, f"{rec.name}, {len(out)} samples"
    from simulator.fixtures import HostSeries

    fleet = [HostSeries(f"b-{i}") for i in range(64)]
    return [encode(h.advance()) for _ in range(limit // 64) for h in fleet], "literal 8-GPU samples"


def throughput(limit: int = 5000, repeat: int = 3) -> list[Row]:
    from detectors.engine.engine import DetectorEngine
    from detectors.registry import model_detectors

    lines, what = _lines(limit)
    n = len(lines)
    decoded = [decode_sample(x) for x in lines]
    packed = [encode_packed(s) for s in decoded]
    kib = statistics.mean(map(len, lines)) / 1024
    pkib = statistics.mean(map(len, packed)) / 1024

    def feed_all(samples: list[Any], extra: list[Any] | None = None) -> None:
        eng = DetectorEngine(extra_detectors=extra or [])
        for s in samples:
            eng.feed(s)

    def decode_feed(raw: list[bytes]) -> None:
        eng = DetectorEngine()
        for x in raw:
            eng.feed(decode_sample(x))

    def decode_all(raw: list[bytes]) -> None:
        for x in raw:  # decoded and dropped, as the worker does (a kept list would time the GC)
            decode_sample(x)

    timed = [
        ("decode JSON", best_cpu(lambda: decode_all(lines), repeat), f"{kib:.1f} KiB JSON"),
        ("decode msgpack", best_cpu(lambda: decode_all(packed), repeat), f"{pkib:.1f} KiB msgpack"),
        ("state+rules", best_cpu(lambda: feed_all(decoded), repeat), "decoded samples"),
        ("decode+state+rules JSON", best_cpu(lambda: decode_feed(lines), repeat), f"{kib:.1f} KiB JSON"),
        ("decode+state+rules msgpack", best_cpu(lambda: decode_feed(packed), repeat), f"{pkib:.1f} KiB msgpack"),
    ]
    models = model_detectors()
    if models:
        names = ",".join(getattr(m, "name", type(m).__name__) for m in models)
        timed.append((f"decode msgpack (incremental)+state+rules+ML ({names})", best_cpu(worker_path(packed, models), repeat),
                      f"{pkib:.1f} KiB msgpack"))
    rows = []
    for name, t, unit_note in timed:
        rate = n / t
        rows.append(Row("detect", f"{name}, one core", rate, "host-samples/s",
                        f"{t / n * 1e6:.1f} µs/sample; {what} ({unit_note}); "
                        f"= {rate * 10:,.0f} hosts at a 10 s poll"))
    if not models:
        rows.append(Row("detect", "ML detectors", 0, "-", "no trained model loads (fleethealth train): rules only"))
    return rows


def incremental(limit: int = 5000, repeat: int = 3) -> list[Row]:
    """The same input through detectors.engine.fastdecode.IncrementalDecoder (per-host reuse of unchanged
    sub-objects), beside the strict decode_sample: in file order, hosts interleaved as a worker sees
    them; a fresh decoder (cold cache) per timed run."""
    from detectors.engine.engine import DetectorEngine
    from detectors.engine.fastdecode import IncrementalDecoder

    lines, what = _lines(limit)
    n = len(lines)
    packed = [encode_packed(decode_sample(x)) for x in lines]

    def dec_all(raw: list[bytes], inc: bool) -> None:
        decode = IncrementalDecoder().decode if inc else decode_sample
        for x in raw:
            decode(x)

    def dec_feed(raw: list[bytes], inc: bool) -> None:
        eng = DetectorEngine()
        if not inc:
            for x in raw:
                eng.feed(decode_sample(x))
            return
        dec = IncrementalDecoder()
        decode = dec.decode
        for x in raw:
            eng.feed(decode(x), dec.base)  # the decoder's base, as the detect worker passes it

    rows = []
    for fmt, raw in (("JSON", lines), ("msgpack", packed)):
        for stage, fn in (("decode", dec_all), ("decode+state+rules", dec_feed)):
            full = best_cpu(lambda fn=fn, raw=raw: fn(raw, False), repeat)
            inc = best_cpu(lambda fn=fn, raw=raw: fn(raw, True), repeat)
            rows.append(Row("detect", f"{stage} {fmt}, incremental decoder, one core", n / inc, "host-samples/s",
                            f"{inc / n * 1e6:.1f} µs/sample vs {full / n * 1e6:.1f} µs strict "
                            f"(x{full / inc:.2f}); {what}"))
    return rows


# ---------------------------------------------------------------------------- Kafka latency


def _worker_proc(bootstrap: str, topics: dict[str, str], group: str, ready: Any, stop: Any, out: Any) -> None:
    from detectors.engine.engine import DetectorEngine
    from detectors.worker.worker import DetectWorker
    from fleethealth.config import kafka_bus

    bus = kafka_bus(bootstrap)
    bus.producer  # made before the clock starts, as in a worker that has been running: an idempotent  # noqa: B018
    # producer's first delivery waits for its producer id (≈ 0.5 s, once)
    w = DetectWorker(bus, DetectorEngine(), group=group, topic=topics["t"], incidents_topic=topics["i"],
                     deadletter_topic=topics["d"], poll_timeout=0.05, idle_tick=False, max_records=5000)
    while not w.consumer.assigned() and not stop.is_set():
        w.run_once()
    ready.set()
    cpu0, t0 = time.process_time(), time.monotonic()
    s0 = w.stats.samples
    batches0 = w.stats.batches
    while not stop.is_set():
        w.run_once()
    out.put({"samples": w.stats.samples - s0, "cpu": time.process_time() - cpu0, "wall": time.monotonic() - t0,
             "batches": w.stats.batches - batches0, "incidents": w.stats.incidents})
    w.close()
    bus.close()


def _reader_proc(bootstrap: str, topic: str, group: str, ready: Any, stop: Any, out: Any) -> None:
    from fleethealth.config import kafka_bus
    from fleethealth.schema import decode_incident

    bus = kafka_bus(bootstrap)
    c = bus.consumer([topic], group)
    while not c.assigned() and not stop.is_set():
        c.poll(timeout=0.1)
    ready.set()
    lat = []
    while not stop.is_set():
        for r in c.poll(timeout=0.1, max_records=1000):
            now = time.time()
            inc = decode_incident(r.value)
            if inc.state == "open":
                lat.append(now - inc.first_seen)
    out.put(lat)
    c.close()
    bus.close()


def kafka_latency(bootstrap: str, hosts: int = 1000, seconds: float = 20.0) -> list[Row]:
    from fleethealth.kafka_bus import ensure_topics

    tag = uuid.uuid4().hex[:8]
    topics = {"t": f"bench.{tag}.telemetry", "i": f"bench.{tag}.incidents", "d": f"bench.{tag}.deadletter"}
    ensure_topics(bootstrap, list(topics.values()), partitions=8)
    try:
        return _paced(bootstrap, hosts, seconds, tag, topics)
    finally:
        from fleethealth.kafka_bus import delete_topics

        delete_topics(bootstrap, list(topics.values()))


def _paced(bootstrap: str, hosts: int, seconds: float, tag: str, topics: dict[str, str]) -> list[Row]:
    import msgspec

    from fleethealth.config import DEFAULT_KAFKA_CLIENT, kafka_bus
    from simulator.fixtures import HostSeries

    ctx = mp.get_context("spawn")
    stop, q = ctx.Event(), ctx.Queue()
    w_ready, r_ready = ctx.Event(), ctx.Event()
    worker = ctx.Process(target=_worker_proc, args=(bootstrap, topics, f"bench-{tag}", w_ready, stop, q))
    reader = ctx.Process(target=_reader_proc, args=(bootstrap, topics["i"], f"bench-r-{tag}", r_ready, stop, q))
    worker.start()
    reader.start()
    if not (w_ready.wait(60) and r_ready.wait(60)):
        stop.set()
        raise RuntimeError("the worker or reader did not join its group within 60 s")

    replace = msgspec.structs.replace
    base = [HostSeries(f"lat-{tag}-{i:04d}", interval=1.0, gpus=8, ports=8).advance() for i in range(hosts)]
    faulty = {}
    for i in range(0, hosts, 5):  # every fifth host: a DRAM UCE from a tick of its own on
        g = base[i].gpus[i % 8]
        gpus = list(base[i].gpus)
        gpus[i % 8] = replace(g, ecc=replace(g.ecc, dram_uncorrected_volatile=1))
        faulty[i] = (3 + (i // 5) % max(1, int(seconds) - 5), gpus)
    bus = kafka_bus(bootstrap)
    sent, cpu0, start = 0, time.process_time(), time.time()
    tick = 0
    slots = 50  # hosts spread over the second in 20 ms slots, like independent pollers
    while time.time() - start < seconds:
        t_tick = start + tick
        for slot in range(slots):
            at = t_tick + slot / slots
            time.sleep(max(0.0, at - time.time()))
            for i in range(slot, hosts, slots):
                s = base[i]
                f = faulty.get(i)
                s = replace(s, ts=round(time.time(), 3), seq=tick + 1,
                            **({"gpus": f[1]} if f and tick >= f[0] else {}))
                bus.publish(topics["t"], s.host, encode_packed(s))
                sent += 1
        tick += 1
    bus.flush()
    produced_s = time.time() - start
    prod_cpu = time.process_time() - cpu0
    time.sleep(3)
    stop.set()
    got: dict[str, Any] = {}
    lat: list[float] = []
    for _ in range(2):
        item = q.get(timeout=60)
        if isinstance(item, dict):
            got = item
        else:
            lat = item
    worker.join(30)
    reader.join(30)
    bus.close()
    rate = sent / produced_s
    cover = (f"{hosts} hosts x 1 Hz for {seconds:.0f} s via {bootstrap} ({DEFAULT_KAFKA_CLIENT}; broker on the same "
             f"{CORES} cores), msgpack")
    rows = [Row("detect/kafka", "telemetry offered", rate, "samples/s", f"{cover}; producer CPU {prod_cpu:.1f} s"),
            Row("detect/kafka", "telemetry consumed by the worker", got.get("samples", 0) / max(got.get("wall", 1), 1e-9),
                "samples/s", f"{got.get('samples', 0)} samples in {got.get('batches', 0)} batches (all: {sent})")]
    if lat:
        lat.sort()
        def p(q: float) -> float:
            return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000
        rows += [Row("detect/kafka", "sample-to-incident latency p50", p(0.5), "ms", f"{len(lat)} incidents; {cover}"),
                 Row("detect/kafka", "sample-to-incident latency p99", p(0.99), "ms", "target < 500 ms"),
                 Row("detect/kafka", "sample-to-incident latency max", lat[-1] * 1000, "ms", "")]
    else:
        rows.append(Row("detect/kafka", "sample-to-incident latency", 0, "-", "no incident arrived"))
    return rows


def rows(quick: bool = False, kafka: str | None = "127.0.0.1:9092", hosts: int = 1000,
         seconds: float | None = None) -> list[Row]:
    out = throughput(2000 if quick else 5000, 1 if quick else 3)
    out += incremental(2000 if quick else 5000, 1 if quick else 3)
    if kafka:
        from tests.services import kafka_problem

        why = kafka_problem(kafka)
        if why:
            out.append(Row("detect/kafka", "sample-to-incident latency", 0, "-", f"skipped: {why}"))
        else:
            out += kafka_latency(kafka, hosts, seconds or (10.0 if quick else 20.0))
    return out


def main() -> int:
    from benchmarks.table import machine, render

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kafka", default="127.0.0.1:9092", help="broker for the latency run ('' to skip)")
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    print(machine())
    print(render(rows(a.quick, a.kafka or None, a.hosts, a.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
