"""Capacity through the real Kafka broker, beside the same recording in-process (printed, never asserted).

    .venv/bin/python benchmarks/bench_kafka_capacity.py [--kafka 127.0.0.1:9092] [--hosts 256] [--minutes 70]

One run, one recording: the fleet simulator writes ``--hosts`` hosts x ``--minutes`` at 10 s polls
(256 x 70 min ≈ 107k samples, JSON as the collectors publish it) to a temporary ``.jsonl``; then

1. **replay → Kafka**: ``simulator.replay.replay_file`` (what ``fleethealth replay --to kafka`` runs)
   into a fresh 8-partition topic, per client: samples/s (wall) and process CPU per sample. The
   confluent run publishes the whole recording and is the pre-filled topic of 2.;
2. **detect draining the pre-filled topic**: a ``DetectWorker`` (what ``fleethealth detect`` runs:
   poll, verify, decode, state + rules [+ ML], publish + acknowledge, commit per batch) as a fresh
   consumer group member reads the topic from the start until it has fed every sample: process CPU
   per sample (librdkafka's own threads included) and samples/s; rules, and rules + ML, per client;
3. **the same recording in-process**: the same worker over the JSONL bus (``detect --bus jsonl:``),
   rules and rules + ML, so the Kafka rows' extra cost is the difference;
4. **client rows**: per client, consume (poll → bus Records), consume + strict decode, and produce
   (publish + acknowledged flush), per message, on the recording's samples.

Each of 1.-4. has a msgpack row beside the JSON one, on the same recording in the same run (the
collectors' default wire format, fleethealth.config.DEFAULT_KAFKA_WIRE): ``replay --wire msgpack``
(transcoding: strict decode + ``encode_packed``) on the default client fills a second topic; detect
drains it (rules; rules + ML) and the same msgpack samples in-process (a length-framed file read
as the JSONL bus reads lines); the client rows consume and produce the msgpack messages.

Process CPU excludes start-up (imports, group join): what a long-running worker spends per sample.
The broker shares the machine's cores (its CPU is not counted). Topics are deleted afterwards.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.table import Row  # noqa: E402

CLIENTS = ("kafka-python", "confluent")


def _load() -> str:
    try:
        one, five, fifteen = os.getloadavg()
        return f"load {one:.1f} {five:.1f} {fifteen:.1f}"
    except OSError:
        return "load ?"


def _recording(tmp: Path, hosts: int, minutes: float) -> tuple[Path, int]:
    from simulator.engine import simulate
    from simulator.plan import RunSpec

    out = tmp / "capacity.jsonl"
    res = simulate(RunSpec(hosts=hosts, duration_s=minutes * 60, interval_s=10.0, seed=11, fault_rate=1.0), out)
    return out, res.samples


def _bus(client: str, bootstrap: str, **kw: Any) -> Any:
    from fleethealth.config import kafka_bus

    return kafka_bus(bootstrap, client, client_id=f"bench-{client}", **kw)


def _timed(fn: Callable[[], int]) -> tuple[int, float, float]:
    """(count fn returned, process CPU s, wall s)."""
    c0, w0 = time.process_time(), time.perf_counter()
    n = fn()
    return n, time.process_time() - c0, time.perf_counter() - w0


def _replay(client: str, bootstrap: str, path: Path, topic: str, limit: int | None,
            wire: str = "as-recorded") -> tuple[int, float, float]:
    from simulator.replay import REPLAY_DELIVERY_REPORTS, replay_file

    bus = _bus(client, bootstrap, delivery_reports=REPLAY_DELIVERY_REPORTS)  # as `fleethealth replay` opens it
    bus.producer  # connect before the clock starts  # noqa: B018
    try:
        return _timed(lambda: replay_file(path, bus, topic=topic, limit=limit, wire=wire).published)
    finally:
        bus.close()


_INCIDENTS: list[int] = []  # incidents each _drain raised, in order (the same recording: the same count)


def _drain(bus: Any, topic: str, expect: int, with_models: bool, timeout_s: float) -> tuple[int, float, float]:
    """A DetectWorker over ``bus`` feeds ``expect`` samples of ``topic``; (samples, CPU s, wall s)."""
    from detectors.engine.engine import DetectorEngine
    from detectors.worker.worker import DetectWorker, streaming_gc

    extra = []
    if with_models:
        from detectors.registry import model_detectors

        extra = model_detectors()
    tag = uuid.uuid4().hex[:8]
    w = DetectWorker(bus, DetectorEngine(extra_detectors=extra), group=f"bench-cap-{tag}", topic=topic,
                     incidents_topic=f"{topic}.incidents", deadletter_topic=f"{topic}.deadletter",
                     idle_tick=False, metrics=None)

    streaming_gc()  # what `fleethealth detect` sets once its start-up is done

    def run() -> int:
        end = time.monotonic() + timeout_s
        idle = 0
        while w.stats.samples + w.stats.dead_letters < expect and time.monotonic() < end and idle < 40:
            idle = 0 if w.run_once() else idle + 1
        return w.stats.samples

    try:
        return _timed(run)
    finally:
        _INCIDENTS.append(w.stats.incidents)
        w.close()


_FRAME = struct.Struct("<I")


def _packed_file(path: Path, out: Path) -> int:
    """The recording's samples as msgpack (encode_packed: what collectors send), length-framed."""
    from fleethealth.bus import iter_jsonl
    from fleethealth.schema import decode_sample, encode_packed

    n = 0
    with open(out, "wb", buffering=1 << 20) as fh:
        for _, raw in iter_jsonl(path):
            v = encode_packed(decode_sample(raw))
            fh.write(_FRAME.pack(len(v)) + v)
            n += 1
    return n


class _PackedFileBus:
    """The in-process bus for msgpack samples: telemetry read from a length-framed file as the JSONL
    bus reads its lines (no key, offsets counted); what the worker publishes is kept in memory."""

    def __init__(self, path: Path, topic: str) -> None:
        from fleethealth.bus import InProcessBus

        self.path, self.topic, self.out = path, topic, InProcessBus()

    def publish(self, topic: str, key: str | None, value: bytes, headers: Any = ()) -> None:
        self.out.publish(topic, key, value, headers)

    def flush(self, timeout: float | None = None) -> None:
        pass

    def consumer(self, topics: Any, group: str) -> Any:
        from fleethealth.bus import Record

        fh = open(self.path, "rb", buffering=1 << 20)  # noqa: SIM115 - closed by the consumer
        topic = self.topic

        class _C:
            pos = 0

            def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[Any]:
                out = []
                for _ in range(max_records):
                    head = fh.read(4)
                    if len(head) < 4:
                        break
                    out.append(Record(topic, 0, self.pos, None, fh.read(_FRAME.unpack(head)[0])))
                    self.pos += 1
                return out

            def commit(self) -> None:
                pass

            def close(self) -> None:
                fh.close()

        return _C()

    def close(self) -> None:
        pass


def _client_rows(client: str, bootstrap: str, topic: str, n: int, raw: list[bytes], fmt: str = "JSON") -> list[Row]:
    from fleethealth.schema import decode_sample

    bus = _bus(client, bootstrap)
    out = []
    for stage in ("consume", "consume+decode"):
        c = bus.consumer([topic], f"bench-cl-{uuid.uuid4().hex[:8]}")

        # join the group first (the first poll waits for the assignment): not part of the per-message cost
        first = c.poll(timeout=10.0, max_records=1)

        def run(c: Any = c, decode: bool = stage != "consume", want: int = n - len(first)) -> int:
            got, idle = 0, 0
            while got < want and idle < 20:
                recs = c.poll(timeout=0.5, max_records=2000)
                idle = 0 if recs else idle + 1
                if decode:
                    for r in recs:
                        decode_sample(r.value)
                got += len(recs)
            return got

        got, cpu, wall = _timed(run)
        c.close()
        out.append(Row("kafka/client", f"{client}: {stage} ({fmt})", cpu / max(got, 1) * 1e6, "µs/msg",
                       f"{got:,} msgs of {topic.rsplit('.', 1)[0]} in {wall:.1f} s wall; {_load()}"))
    ptopic = f"{topic}.produce{fmt.lower()}"
    from fleethealth.kafka_bus import ensure_topics

    ensure_topics(bootstrap, [ptopic], partitions=8)
    bus.publish(ptopic, "warm-up", raw[0])
    bus.flush(30)

    def produce() -> int:
        acks = [bus.publish(ptopic, f"h{i % 256}", v) for i, v in enumerate(raw)]
        bus.flush(120)
        return sum(1 for a in acks if a is not None and a.is_done and a.succeeded())

    acked, cpu, wall = _timed(produce)
    out.append(Row("kafka/client", f"{client}: produce (publish + acknowledged flush) ({fmt})", cpu / len(raw) * 1e6,
                   "µs/msg", f"{acked:,}/{len(raw):,} acknowledged of {sum(map(len, raw)) / len(raw) / 1e3:.1f} KB, "
                             f"{len(raw) / wall:,.0f} msgs/s wall; {_load()}"))
    bus.close()
    return out


def rows(kafka: str | None = None, hosts: int = 256, minutes: float = 70.0, quick: bool = False,
         clients: tuple[str, ...] = CLIENTS) -> list[Row]:
    from tests.services import kafka_problem

    bootstrap = kafka if kafka is not None else os.environ.get("FLEETHEALTH_KAFKA", "127.0.0.1:9092")
    if quick:
        hosts, minutes = 64, 20.0
    why = kafka_problem(bootstrap) if bootstrap else "no broker given"
    if why:
        return [Row("kafka/capacity", "detect through Kafka", 0, "-", f"skipped: {why}")]
    from fleethealth.bus import JsonlBus, iter_jsonl
    from fleethealth.kafka_bus import delete_topics, ensure_topics

    tag = uuid.uuid4().hex[:8]
    topics = {c: f"bench.{tag}.{c.replace('-', '')}.telemetry" for c in clients}
    mp_topic = f"bench.{tag}.msgpack.telemetry"
    made = [*topics.values(), mp_topic] + [f"{t}.{s}" for t in [*topics.values(), mp_topic]
                                           for s in ("incidents", "deadletter", "producejson", "producemsgpack")]
    out: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="fh-bench-cap-") as tmp:
        path, n = _recording(Path(tmp), hosts, minutes)
        fleet = f"{hosts} hosts x {minutes:.0f} min at 10 s, {n:,} samples (JSON)"
        try:
            ensure_topics(bootstrap, made, partitions=8)
            # 1. replay -> Kafka; the fastest client's run fills the topic the detect rows drain
            full = {}
            for c in clients:
                limit = None if c == clients[-1] else min(n, 30_000)
                got, cpu, wall = _replay(c, bootstrap, path, topics[c], limit)
                full[c] = got
                out.append(Row("kafka/replay", f"replay -> Kafka, {c} (JSON as recorded)", got / wall, "samples/s",
                               f"{got:,} samples, {cpu / got * 1e6:.0f} µs CPU/sample (one process); {fleet}; {_load()}"))
            filled = topics[clients[-1]]
            got, cpu, wall = _replay(clients[-1], bootstrap, path, mp_topic, None, "msgpack")
            full["msgpack"] = got
            out.append(Row("kafka/replay", f"replay --wire msgpack -> Kafka, {clients[-1]} (transcoding)", got / wall,
                           "samples/s", f"{got:,} samples, {cpu / got * 1e6:.0f} µs CPU/sample (one process); {fleet}; "
                                        f"{_load()}"))
            packed = Path(tmp) / "capacity.msgpack"
            _packed_file(path, packed)
            # 2./3. detect: in-process (JSONL bus; msgpack: the framed file) and through Kafka, rules and rules + ML
            for models in (False, True):
                what = "rules + ML" if models else "rules"
                got, cpu, wall = _drain(JsonlBus(path, append=True), "fleet.telemetry.v1", n, models, 600)
                base = cpu / max(got, 1)
                out.append(Row("kafka/capacity", f"detect in-process (JSONL bus), {what}", 1 / base, "host-samples/s/core",
                               f"{base * 1e6:.1f} µs CPU/sample, {got / wall:,.0f}/s wall, {_INCIDENTS[-1]} incidents; "
                               f"{fleet}; {_load()}"))
                for c in clients:
                    got, cpu, wall = _drain(_bus(c, bootstrap), filled, full[clients[-1]], models, 600)
                    per = cpu / max(got, 1)
                    out.append(Row("kafka/capacity", f"detect draining the topic, {c}, {what}", 1 / per,
                                   "host-samples/s/core",
                                   f"{per * 1e6:.1f} µs CPU/sample (x{per / base:.2f} in-process), {got / wall:,.0f}/s "
                                   f"wall, {got:,} fed, {_INCIDENTS[-1]} incidents; {fleet}; {_load()}"))
                got, cpu, wall = _drain(_PackedFileBus(packed, "fleet.telemetry.v1"), "fleet.telemetry.v1", n, models,
                                        600)
                mbase = cpu / max(got, 1)
                out.append(Row("kafka/capacity", f"detect in-process (msgpack file), {what}", 1 / mbase,
                               "host-samples/s/core", f"{mbase * 1e6:.1f} µs CPU/sample (x{mbase / base:.2f} JSON "
                                                      f"in-process), {got / wall:,.0f}/s wall, {_INCIDENTS[-1]} incidents; {fleet}; "
                                                      f"{_load()}"))
                c = clients[-1]
                got, cpu, wall = _drain(_bus(c, bootstrap), mp_topic, full["msgpack"], models, 600)
                per = cpu / max(got, 1)
                out.append(Row("kafka/capacity", f"detect draining the msgpack topic, {c}, {what}", 1 / per,
                               "host-samples/s/core",
                               f"{per * 1e6:.1f} µs CPU/sample (x{per / mbase:.2f} msgpack in-process), "
                               f"{got / wall:,.0f}/s wall, {got:,} fed, {_INCIDENTS[-1]} incidents; {fleet}; {_load()}"))
            # 4. the clients alone, JSON and msgpack messages
            raw = [v for _, v in zip(range(20_000), (r for _, r in iter_jsonl(path)), strict=False)]
            from fleethealth.schema import decode_sample, encode_packed

            raw_mp = [encode_packed(decode_sample(v)) for v in raw]
            for c in clients:
                out += _client_rows(c, bootstrap, filled, min(n, 50_000), raw)
                out += _client_rows(c, bootstrap, mp_topic, min(n, 50_000), raw_mp, "msgpack")
        finally:
            delete_topics(bootstrap, made)
    return out


def main() -> int:
    from benchmarks.table import machine, render

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kafka", default=None, help="broker (default $FLEETHEALTH_KAFKA or 127.0.0.1:9092)")
    ap.add_argument("--hosts", type=int, default=256)
    ap.add_argument("--minutes", type=float, default=70.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated; the last fills the topic")
    a = ap.parse_args()
    print(machine(), _load())
    print(render(rows(a.kafka, a.hosts, a.minutes, a.quick, tuple(a.clients.split(",")))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
