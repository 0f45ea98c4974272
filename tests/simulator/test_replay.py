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
