"""``fleethealth replay``: every sample delivered keyed by host, in order; bad lines skipped, counted,
dead-lettered; pacing follows the samples' ts; real Kafka keeps per-host order."""

from __future__ import annotations

import gzip
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from fleethealth.bus import DEADLETTER, TELEMETRY, InProcessBus, JsonlBus, read_values
from fleethealth.schema import decode_sample
from simulator.engine import simulate
from simulator.plan import RunSpec
from simulator.replay import replay_file


@pytest.fixture(scope="module")
def rec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rep") / "r.jsonl.gz"
    simulate(RunSpec(hosts=10, duration_s=1800, interval_s=60, seed=4, fault_rate=2000), out)
    return out


def _per_host_in_order(values: list[tuple[str | None, bytes]]) -> dict[str, list[int]]:
    seqs: dict[str, list[int]] = defaultdict(list)
    for key, v in values:
        s = decode_sample(v)
        assert key == s.host
        seqs[s.host].append(s.seq)
    for host, q in seqs.items():
        assert q == sorted(q), host
    return seqs


def test_replay_into_memory_delivers_everything(rec: Path) -> None:
    bus = InProcessBus()
    st = replay_file(rec, bus)
    recs = bus.records(TELEMETRY)
    n = len(list(read_values(rec)))
    assert st.published == len(recs) == n and st.invalid == 0 and st.hosts == 10
    _per_host_in_order([(r.key, r.value) for r in recs])


def test_limit_and_jsonl_target(rec: Path, tmp_path: Path) -> None:
    bus = JsonlBus(tmp_path / "out.jsonl", append=False)
    st = replay_file(rec, bus, limit=25)
    bus.close()
    assert st.published == 25
    assert list(read_values(tmp_path / "out.jsonl")) == list(read_values(rec))[:25]


def test_invalid_lines_are_counted_and_dead_lettered(rec: Path, tmp_path: Path) -> None:
    good = list(read_values(rec))[:5]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join([good[0], b"not json", good[1], b'{"v":2,"host":"x"}', good[2][:100],
                                good[3], b'{"host":"h","ts":-1,"seq":1,"collector_version":"x"}', good[4]]) + b"\n")
    bus = InProcessBus()
    st = replay_file(bad, bus)
    assert (st.published, st.invalid) == (4, 4)
    dl = bus.records(DEADLETTER)
    assert len(dl) == 4 and b"unsupported schema version" in dl[1].value


def test_truncated_gzip_keeps_what_was_read(rec: Path, tmp_path: Path) -> None:
    data = rec.read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    bus = InProcessBus()
    st = replay_file(cut, bus)
    assert st.truncated and 0 < st.published < len(list(read_values(rec)))


def test_missing_file_is_a_user_error(tmp_path: Path) -> None:
    from fleethealth.errors import UserError

    with pytest.raises(UserError, match="no such recording"):
        replay_file(tmp_path / "nope.jsonl", InProcessBus())


def test_scaled_real_time_paces_by_sample_ts(rec: Path) -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    st = replay_file(rec, InProcessBus(), speed=60.0, sleep=sleep, clock=lambda: now[0])
    span = (st.last_ts or 0) - (st.first_ts or 0)
    assert abs(sum(slept) - span / 60.0) < 0.01


def test_cli_replay_json(rec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from fleetcli.cli import main

    assert main(["replay", str(rec), "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["published"] == len(list(read_values(rec))) and out["invalid"] == 0


def test_gz_and_plain_replay_the_same(rec: Path, tmp_path: Path) -> None:
    plain = tmp_path / "p.jsonl"
    plain.write_bytes(gzip.decompress(rec.read_bytes()))
    a, b = InProcessBus(), InProcessBus()
    replay_file(rec, a)
    replay_file(plain, b)
    assert [r.value for r in a.records(TELEMETRY)] == [r.value for r in b.records(TELEMETRY)]


@pytest.mark.kafka
@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_replay_shipped_dataset_into_kafka(kafka_bootstrap: str, client: str) -> None:
    """Over either client, opened as `fleethealth replay` opens it (flush raises for anything undelivered)."""
    from fleethealth.config import kafka_bus
    from fleethealth.kafka_bus import delete_topics, ensure_topics
    from simulator.replay import REPLAY_DELIVERY_REPORTS

    root = Path(__file__).resolve().parents[2] / "replay_data"
    ds = root / "smoke-64h.jsonl.gz"
    if not ds.exists():
        pytest.skip(f"{ds} not built")
    topic = f"test.{uuid.uuid4().hex[:12]}.telemetry"
    ensure_topics(kafka_bootstrap, [topic], partitions=4)
    bus = kafka_bus(kafka_bootstrap, client, delivery_reports=REPLAY_DELIVERY_REPORTS)
    limit = 4000
    try:
        st = replay_file(ds, bus, topic=topic, limit=limit)
        bus.close()
        assert st.published == limit
        cons = kafka_bus(kafka_bootstrap, client).consumer([topic], f"g-{uuid.uuid4().hex[:8]}")
        got: list[tuple[str | None, bytes]] = []
        try:
            for _ in range(120):
                got += [(r.key, r.value) for r in cons.poll(timeout=1.0, max_records=2000)]
                if len(got) >= limit:
                    break
        finally:
            cons.close()
    finally:
        delete_topics(kafka_bootstrap, [topic])
    assert len(got) == limit
    seqs = _per_host_in_order(got)
    assert sum(len(v) for v in seqs.values()) == limit


def test_wire_msgpack_transcodes_and_detect_refuses_and_finds_the_same(rec: Path, tmp_path: Path) -> None:
    """``replay --wire msgpack`` sends what collectors send (encode_packed's bytes); what the strict
    decoder refuses, salvages or finds is the same as from the recorded JSON (those samples go as
    recorded), and a refused binary sample's dead letter names its host in its excerpt."""
    import msgspec

    from detectors.engine.engine import DetectorEngine
    from detectors.worker.worker import DetectWorker
    from fleethealth.schema import decode_sample, encode_packed, is_packed

    lines = list(read_values(rec))

    def edit(i: int, fn) -> bytes:
        d = msgspec.json.decode(lines[i])
        fn(d)
        return msgspec.json.encode(d)

    lines[3] = edit(3, lambda d: d.update(bogus=1))  # an unknown field: refused whole
    lines[7] = edit(7, lambda d: d["gpus"][0]["ecc"].update(dram_corrected_volatile=-5))  # salvaged: field removed
    lines[9] = edit(9, lambda d: d["gpus"][1]["ecc"].update(dram_corrected_aggregate=2**70))  # salvaged too
    lines[11:11] = [b"not json", b'{"v":2,"host":"x"}']  # refused by replay itself
    path = tmp_path / "edited.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    seen = {}
    for wire in ("as-recorded", "msgpack"):
        bus = InProcessBus()
        st = replay_file(path, bus, wire=wire)
        w = DetectWorker(bus, DetectorEngine(), idle_tick=False, clock=lambda: 1e10)
        w.run(max_idle_polls=1)
        incs = sorted(msgspec.json.decode(r.value)["failure_mode"] for r in bus.records("fleet.incidents.v1"))
        dead = [msgspec.json.decode(r.value) for r in bus.records(DEADLETTER)]
        seen[wire] = ((st.published, st.invalid), (w.stats.samples, w.stats.dead_letters, w.stats.fields_rejected),
                      incs, sorted(d["reason"] for d in dead))
        packed = [is_packed(r.value) for r in bus.records(TELEMETRY)]
        if wire == "msgpack":
            assert st.as_recorded == 3 and packed.count(False) == 3
            assert {r.value for r in bus.records(TELEMETRY) if not is_packed(r.value)} == {lines[3], lines[7], lines[9]}
            assert all(r.value == encode_packed(decode_sample(r.value)) for r in bus.records(TELEMETRY) if is_packed(r.value))
        else:
            assert st.as_recorded == 0 and not any(packed)
    assert seen["msgpack"] == seen["as-recorded"]
    (pub, invalid), (samples, dead_n, salvaged), incs, _ = seen["msgpack"]
    assert (pub, invalid) == (len(lines) - 2, 2) and dead_n == 3 and salvaged == 2 and samples == pub - 1 and incs
    bus = InProcessBus()  # a refused msgpack sample's dead letter stays readable
    d = msgspec.msgpack.decode(encode_packed(decode_sample(lines[0])))
    bus.publish(TELEMETRY, d["host"], msgspec.msgpack.encode({**d, "bogus": 1}))
    DetectWorker(bus, DetectorEngine(), idle_tick=False).run(max_idle_polls=1)
    (letter,) = [msgspec.json.decode(r.value) for r in bus.records(DEADLETTER)]
    assert "unknown field `bogus`" in letter["reason"] and letter["payload_excerpt"].startswith("b'\\x8")
    assert d["host"] in letter["payload_excerpt"]


def test_replay_wire_choices_are_the_replayers() -> None:
    from fleetcli.commands.simulate import REPLAY_WIRES
    from simulator.replay import WIRES

    assert REPLAY_WIRES == WIRES  # the CLI's literal (no msgspec import for --help) is the replayer's list
