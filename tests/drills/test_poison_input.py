"""Drill: poison input through Kafka into a running ``fleethealth detect``.

Interleaved with a labelled recording's good samples (each invalid message is keyed with the host of
the good sample it precedes, so it sits in that host's partition; a contract-valid one is keyed with
its own host, as any producer would), the worker gets random bytes, a ~900 KB junk
message, a 1.2 MiB message (over the contract's 1 MiB limit; gzip lets it past the broker's own
limit), a ~900 KB *valid* sample (4,096 kernel events), deeply nested JSON, wrong types, the JSON
token NaN, a msgpack sample with a NaN temperature (msgpack can carry NaN; the contract's gauge
range rejects the field: the sample is processed without it, and one dead letter names the field),
a host claiming 10,000 GPUs, a sample with counters of 2^64-1, and a forged sample naming another
host's GPUs.

Asserted: the worker lives, memory and time stay bounded (RSS from /proc before and after), every
invalid message is dead-lettered once with a reason naming the fault, and the good hosts' incidents
are exactly those of an in-process run of the good samples alone: nothing else disturbed. The
forged sample must not open an incident for the host whose GPU it names.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest

from fleethealth.bus import DEADLETTER, TELEMETRY, TOPICS, iter_jsonl
from fleethealth.kafka_bus import ensure_topics
from fleethealth.schema import DEADLETTER as DL_CODEC
from fleethealth.schema import MAX_MESSAGE_BYTES, decode_sample
from tests.drills import harness as h
from tests.drills.private_kafka import PrivateKafka

pytestmark = [pytest.mark.drill, pytest.mark.kafka, pytest.mark.slow]
MAX_RSS_GROWTH_KIB = 150 * 1024
OWN_KEY = {"msgpack NaN temperature"}  # decodes without the bad field: keyed by its own host
U64_MAX = 2**64 - 1


def _poison(template: dict, victim: dict) -> list[tuple[str, bytes, str | None]]:
    """(name, payload, expected dead-letter reason fragment or None when the contract accepts it)."""
    enc = msgspec.json.encode

    def variant(host: str, **changes: object) -> dict:
        d = msgspec.json.decode(enc(template))
        d.update(host=host, **changes)
        return d

    huge_valid = variant("poison-huge-valid", kernel_events=[
        {"ts": template["ts"], "kind": "other", "line": "x" * 180} for _ in range(4096)])
    u64 = variant("poison-u64", seq=U64_MAX)
    for g in u64["gpus"]:
        g["ecc"] = {k: U64_MAX for k in ("dram_corrected_volatile", "dram_uncorrected_volatile",
                                          "sram_corrected_volatile", "sram_uncorrected_volatile")}
        g["pcie"] = {"replay_counter": U64_MAX}
    for p in u64["net_ports"]:
        p["counters"] = {k: U64_MAX for k in p.get("counters", {})}
    nan_mp = variant("poison-nan")
    nan_mp["gpus"][0]["temperature_c"] = float("nan")
    many = variant("poison-10k-gpus", expected_gpus=10_000)
    many["gpus"] = [{"index": i, "uuid": f"GPU-{i:08d}"} for i in range(10_000)]
    forged = variant("poison-forger")  # claims the victim host's GPUs (UUIDs, bus ids), with a fell-off error
    forged["gpus"] = [dict(g, present=False, nvml_error="GPU_IS_LOST") for g in victim["gpus"]]
    out: list[tuple[str, bytes, str | None]] = [
        ("random bytes", bytes(range(256)) * 3 + b"\xff\x00\xc1", "not valid"),
        ("900 KB junk", enc({"v": 1, "host": "poison-junk", "pad": "A" * 900_000}), "unknown field"),
        ("1.2 MiB", enc({"v": 1, "host": "poison-big", "pad": "B" * (MAX_MESSAGE_BYTES + 200_000)}), "limit"),
        ("nested", b"[" * 200_000 + b"]" * 200_000, "Expected `object`"),
        ("nested in field", b'{"v":1,"host":"poison-nest","gpus":' + b"[" * 50_000 + b"]" * 50_000 + b"}",
         "gpus"),
        ("wrong types", enc({"v": 1, "host": 123, "ts": "yesterday", "seq": -1, "collector_version": None}),
         "Expected `str`"),
        ("NaN token", enc(variant("poison-nan-json")).replace(b'"ts":', b'"ts":NaN,"x":', 1), "not valid JSON"),
        ("msgpack NaN temperature", msgspec.msgpack.encode(nan_mp), "temperature_c"),
        ("10,000 GPUs", enc(many), "expected_gpus"),
        ("u64 max counters", enc(u64), None),
        ("900 KB valid", enc(huge_valid), None),
        ("forged GPU identity", enc(forged), None),
    ]
    return out


def test_poison_is_dead_lettered_bounded_and_disturbs_nothing(tmp_path: Path, private_kafka: PrivateKafka) -> None:
    from kafka import KafkaProducer

    broker = private_kafka
    rec = h.recording(tmp_path, hosts=16, duration_s=2400, fault_rate=400, min_per_mode=1, seed=5)
    good = [raw for _, raw in iter_jsonl(rec)]
    samples = [decode_sample(r) for r in good]
    hosts = sorted({s.host for s in samples})
    ref = h.opened(h.reference_incidents(rec))
    assert len(ref) >= 10
    template = msgspec.json.decode(good[0])
    victim_host = next(i.host for i in ref.values() if i.failure_mode == "gpu_fell_off_bus") \
        if any(i.failure_mode == "gpu_fell_off_bus" for i in ref.values()) else hosts[1]
    victim = msgspec.json.decode(next(r for r, s in zip(good, samples, strict=True) if s.host == victim_host))
    poison = _poison(template, victim)
    sizes = {name: len(p) for name, p, _ in poison}
    assert all(n < MAX_MESSAGE_BYTES for name, n in sizes.items() if name != "1.2 MiB"), sizes
    assert sizes["900 KB valid"] > 800_000 and sizes["900 KB junk"] > 800_000, sizes

    ensure_topics(broker.bootstrap, TOPICS, 8)
    det = h.detect("detect", tmp_path, broker.bootstrap, "drill-poison")
    prod = KafkaProducer(bootstrap_servers=[broker.bootstrap], acks="all", compression_type="gzip", linger_ms=10,
                         batch_size=256 << 10, max_request_size=4 << 20, max_in_flight_requests_per_connection=1)
    try:
        h.wait_until(lambda: h.group_members(broker.bootstrap, "drill-poison") == 1, 30, 0.3, "detect to join")
        half = len(good) // 2
        for s, raw in zip(samples[:half], good[:half], strict=True):
            prod.send(TELEMETRY, key=s.host.encode(), value=raw)
        prod.flush()
        h.wait_until(lambda: h.group_lag(broker.bootstrap, "drill-poison", TELEMETRY) == 0, 60, 0.5, "first half")
        rss_before = det.rss_kib()
        t0 = time.monotonic()
        step = max(1, (len(good) - half) // (len(poison) + 1))
        rest = list(zip(samples[half:], good[half:], strict=True))
        for i, (s, raw) in enumerate(rest):
            if i % step == 0 and i // step < len(poison):
                name, payload, frag = poison[i // step]
                # invalid ones ride in a good host's partition; contract-valid ones (and one that only
                # loses a field) carry their own host as key
                key = s.host if frag is not None and name not in OWN_KEY else decode_sample(payload).host
                prod.send(TELEMETRY, key=key.encode(), value=payload).get(30)
            prod.send(TELEMETRY, key=s.host.encode(), value=raw)
        prod.flush()
        h.wait_until(lambda: h.group_lag(broker.bootstrap, "drill-poison", TELEMETRY) == 0, 60, 0.5, "the rest")
        seconds = time.monotonic() - t0
        rss_after = det.rss_kib()
        assert det.alive(), det.text()[-3000:]
    finally:
        prod.close()
        det.stop()

    summary = det.text().strip().splitlines()[-1]
    letters = [DL_CODEC.decode(v) for v in h.read_topic(broker.bootstrap, DEADLETTER, idle_s=2.0)]
    rejected = [(name, frag) for name, _, frag in poison if frag is not None]
    assert len(letters) == len(rejected), (summary, [(d.payload_size, d.reason[:80]) for d in letters])
    by_size = sorted(letters, key=lambda d: d.offset or 0)
    for name, frag in rejected:
        size = len(next(p for n, p, _ in poison if n == name))
        match = [d for d in by_size if d.payload_size == size]
        assert match, f"{name}: no dead letter"
        assert frag in match[0].reason, f"{name}: reason {match[0].reason[:200]!r} does not say {frag!r}"
        assert match[0].consumer and match[0].source_topic == TELEMETRY

    incidents = h.read_incidents(broker.bootstrap, idle_s=2.0)
    got_good = {k: v for k, v in h.opened(incidents).items() if v.host in hosts}
    # Compared by (host, component, mode), not by id: the worker consumes partition-skewed batches and
    # its fleet-time tick can resolve a lagging partition's episodes early, re-opening them under a new
    # id -- a worker bug of its own (see test_detector_rebalance / the report), not the poison's doing.
    got_keys, ref_keys = set(h.episode_keys(got_good.values())), set(h.episode_keys(ref.values()))
    assert got_keys == ref_keys, {"extra": sorted(got_keys - ref_keys), "missing": sorted(ref_keys - got_keys)}
    reopened = [(i.host, i.failure_mode, i.evidence[-1].fact[:80]) for i in incidents
                if i.state == "resolved" and i.host in hosts and i.id in set(got_good) - set(ref)
                or (i.state == "resolved" and i.host in hosts and i.id in ref
                    and any(o.host == i.host and o.component == i.component and o.failure_mode == i.failure_mode
                            for k, o in got_good.items() if k not in ref))]
    forged_on_victim = [i for i in incidents if i.host == victim_host and i.id not in ref]
    assert forged_on_victim == [], "the forged sample opened an incident on the host whose GPU it named"
    poison_incidents = sorted({(i.host, i.failure_mode) for i in incidents if i.host.startswith("poison-")})
    assert (rss_after - rss_before) < MAX_RSS_GROWTH_KIB, (rss_before, rss_after)
    print(f"poison drill: {len(poison)} poison messages in {len(good)} good samples; {len(letters)} dead letters; "
          f"RSS {rss_before // 1024} -> {rss_after // 1024} MiB; second half in {seconds:.1f}s; "
          f"incidents on poison hosts: {poison_incidents}; worker: {summary}; re-opened: {reopened}")
