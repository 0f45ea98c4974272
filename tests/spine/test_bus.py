import gzip
import threading

import pytest

from fleethealth.bus import (
    DEADLETTER,
    TELEMETRY,
    BusError,
    InProcessBus,
    JsonlBus,
    iter_jsonl,
    partition_for,
    topic_path,
)
from fleethealth.schema import DEADLETTER as DL_CODEC
from fleethealth.schema import decode_sample, encode
from tests.spine.sample_factory import sample


def _publish(bus, hosts=5, per_host=20):
    for seq in range(per_host):
        for h in range(hosts):
            bus.publish(TELEMETRY, f"h{h}", encode(sample(host=f"h{h}", seq=seq, gpus=1)))


def _drain(consumer, commit=True):
    out = []
    while batch := consumer.poll(timeout=0, max_records=37):
        out.extend(batch)
        if commit:
            consumer.commit()
    return out


def test_partition_is_stable_and_in_range():
    assert partition_for("gpu-node-001", 8) == partition_for("gpu-node-001", 8)
    assert {partition_for(f"h{i}", 8) for i in range(200)} == set(range(8))
    assert partition_for(None, 8) == 0


def test_inprocess_keeps_per_host_order_and_delivers_everything():
    bus = InProcessBus()
    _publish(bus)
    recs = _drain(bus.consumer([TELEMETRY], "g"))
    assert len(recs) == 100
    seqs: dict[str, list[int]] = {}
    for r in recs:
        s = decode_sample(r.value)
        seqs.setdefault(s.host, []).append(s.seq)
    assert all(v == list(range(20)) for v in seqs.values())


def test_uncommitted_records_are_redelivered_to_the_next_group_member():
    bus = InProcessBus()
    _publish(bus, hosts=2, per_host=5)
    c1 = bus.consumer([TELEMETRY], "g")
    first = c1.poll(timeout=0, max_records=4)
    c1.commit()
    c1.poll(timeout=0, max_records=3)  # read but never committed: the worker "dies"
    c1.close()
    with pytest.raises(BusError):
        c1.poll(timeout=0)
    rest = _drain(bus.consumer([TELEMETRY], "g"))
    assert len(first) + len(rest) == 10
    assert {(r.partition, r.offset) for r in first}.isdisjoint({(r.partition, r.offset) for r in rest})


def test_groups_are_independent():
    bus = InProcessBus()
    _publish(bus, hosts=1, per_host=3)
    assert len(_drain(bus.consumer([TELEMETRY], "a"))) == 3
    assert len(_drain(bus.consumer([TELEMETRY], "b"))) == 3
    assert _drain(bus.consumer([TELEMETRY], "a")) == []


def test_retain_consumed_drops_what_every_group_committed_and_loses_nothing(monkeypatch):
    monkeypatch.setattr(InProcessBus, "TRIM_MIN", 8)
    bus = InProcessBus(partitions=2, retain_consumed=True)
    slow, fast = bus.consumer([TELEMETRY], "slow"), bus.consumer([TELEMETRY], "fast")
    _publish(bus, hosts=4, per_host=50)  # 200 records
    got_fast = _drain(fast)
    assert len(got_fast) == 200 and bus.held() == 200  # "slow" has committed nothing: all held
    assert bus.lag("slow", TELEMETRY) == 200 and bus.lag("fast", TELEMETRY) == 0
    first = slow.poll(timeout=0, max_records=120)
    slow.commit()
    assert 0 < bus.held() <= 200 - 120 + 2 * 8  # dropped up to what both committed (chunked)
    _publish(bus, hosts=4, per_host=10)  # offsets keep counting after a trim
    rest = _drain(slow)
    assert len(first) + len(rest) == 240
    offsets = {(r.partition, r.offset) for r in first + rest}
    assert len(offsets) == 240  # every record once, offsets absolute and unique
    assert len(_drain(fast)) == 40
    assert bus.held() == 0 and bus.lag("slow", TELEMETRY) == 0


def test_retain_consumed_redelivers_uncommitted_records_and_a_late_group_starts_at_the_oldest_held():
    bus = InProcessBus(partitions=1, retain_consumed=True)
    c = bus.consumer([TELEMETRY], "g")
    _publish(bus, hosts=1, per_host=10)
    c.poll(timeout=0, max_records=4)
    c.commit()  # 4 done, dropped (nothing else subscribed)
    c.poll(timeout=0, max_records=3)  # read, never committed: the worker dies
    again = _drain(bus.consumer([TELEMETRY], "g"))
    assert [r.offset for r in again] == list(range(4, 10))
    late = _drain(bus.consumer([TELEMETRY], "late"))
    assert late == []  # g committed everything and was the only subscriber: nothing held
    _publish(bus, hosts=1, per_host=2)
    assert [r.offset for r in _drain(bus.consumer([TELEMETRY], "late"))] == [10, 11]


def test_poll_wakes_up_on_publish():
    bus = InProcessBus()
    c = bus.consumer([TELEMETRY], "g")
    threading.Timer(0.05, lambda: bus.publish(TELEMETRY, "h", b"x")).start()
    assert [r.value for r in c.poll(timeout=5)] == [b"x"]


@pytest.mark.parametrize("name", ["rec.jsonl", "rec.jsonl.gz"])
def test_jsonl_write_then_read_back(tmp_path, name):
    path = tmp_path / name
    bus = JsonlBus(path, append=False)
    _publish(bus, hosts=3, per_host=4)
    bus.publish(DEADLETTER, None, b'{"x":1}')
    bus.close()
    assert topic_path(path, DEADLETTER).exists()
    reader = JsonlBus(path)
    c = reader.consumer([TELEMETRY], "g")
    recs = _drain(c)
    assert [decode_sample(r.value).seq for r in recs] == [s for s in range(4) for _ in range(3)]
    # committed position is kept per group: a new consumer of the group sees nothing more
    assert _drain(reader.consumer([TELEMETRY], "g")) == []


def test_truncated_gzip_recording_is_a_clear_error(tmp_path):
    path = tmp_path / "rec.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        for i in range(2000):
            fh.write(f'{{"n":{i},"pad":"{"x" * 50}"}}\n')
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BusError, match="unreadable after line"):
        list(iter_jsonl(path))


@pytest.mark.parametrize("name", ["odd.jsonl", "odd.jsonl.gz"])
def test_iter_jsonl_skips_blank_lines_only_and_strips_only_the_newline(tmp_path, name):
    long = b'{"pad":"' + b"y" * (3 << 20) + b'"}'  # longer than the 1 MiB read buffer
    data = b"".join([b'{"a":1}\n', b"\n", b"  \t\r\n", b'\x0c{"b":2}\r\n', long + b"\n", b"\x0b\n",
                     b'  {"c":3}  \n', b'{"d":4}'])  # the last line has no newline
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    assert list(iter_jsonl(path)) == [(1, b'{"a":1}'), (4, b'\x0c{"b":2}\r'), (5, long), (7, b'  {"c":3}  '),
                                      (8, b'{"d":4}')]


def test_truncated_gzip_delivers_every_line_decompressed_before_the_cut(tmp_path):
    import random
    import zlib

    rnd = random.Random(5)
    lines = [b'{"n":%d,"pad":"%s"}' % (i, rnd.randbytes(60).hex().encode()) for i in range(30_000)]  # ~4 MB
    gz = gzip.compress(b"\n".join(lines) + b"\n")
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(gz[: len(gz) * 2 // 3])
    whole = zlib.decompressobj(31).decompress(gz[: len(gz) * 2 // 3]).count(b"\n")  # complete lines before the cut
    got = []
    with pytest.raises(BusError, match=f"unreadable after line {whole}:"):
        for _, raw in iter_jsonl(path):
            got.append(raw)
    assert whole > 15_000 and got == lines[:whole]  # nothing of the last 1 MiB read lost


def test_one_dead_letter_builder_keeps_every_letter_inside_its_contract():
    from fleethealth.bus import Record
    from fleethealth.deadletter import KEY_CHARS, REASON_CHARS, dead_letter_for

    rec = Record(TELEMETRY, 3, 42, "k" * 20_000, b"\xff" * 100_000)
    dl = dead_letter_for(rec, "r" * 50_000, "c" * 1000, now=5.0)
    back = DL_CODEC.decode(encode(dl))  # strict decode: every bound of the contract holds
    assert back.key == "k" * KEY_CHARS and back.reason == "r" * REASON_CHARS
    assert back.payload_size == 100_000 and back.payload_excerpt.startswith("b'\\xff")
    assert (back.source_topic, back.partition, back.offset, back.ts) == (TELEMETRY, 3, 42, 5.0)
