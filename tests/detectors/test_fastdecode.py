"""IncrementalDecoder keeps decode_sample's contract: equal values, identical errors, no aliasing."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detectors.engine.engine import DetectorEngine
from detectors.engine.fastdecode import GPU_GAUGES, GPU_RAW, GPU_STABLE, IncrementalDecoder
from detectors.registry import model_detectors
from fleethealth.bus import iter_jsonl
from fleethealth.salvage import removed_fields
from fleethealth.schema import (
    ContractError,
    GpuSample,
    RemappedRows,
    RetiredPages,
    decode_sample,
    encode,
    encode_packed,
)

ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = sorted((ROOT / "replay_data").glob("*.jsonl.gz"))
SMOKE = ROOT / "replay_data" / "smoke-64h.jsonl.gz"


def _lines(path: Path, limit: int | None = None) -> list[bytes]:
    if not path.exists():
        pytest.skip(f"{path} is not shipped in this checkout")
    out = []
    for _, raw in iter_jsonl(path):
        out.append(raw)
        if limit and len(out) >= limit:
            break
    return out


_FIRST: dict[int, list[bytes]] = {}


def _smoke(n: int = 400) -> list[bytes]:
    if n not in _FIRST:
        _FIRST[n] = _lines(SMOKE, n)
    return _FIRST[n]


def outcome(decode, data):
    """('ok', canonical bytes) or ('error', message, field): what a consumer can observe."""
    try:
        s = decode(data)
    except ContractError as exc:
        return ("error", str(exc), exc.field)
    return ("ok", encode(s), s)


def same(a, b) -> None:
    assert a[:2] == b[:2]
    if a[0] == "ok":
        assert a[2] == b[2]
        assert type(a[2]) is type(b[2])


# ---------------------------------------------------------------------------- shipped recordings


@pytest.mark.slow
@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_equal_to_decode_sample_on_every_shipped_sample_in_file_order(path):
    dec = IncrementalDecoder()
    n = 0
    for raw in _lines(path):
        want = decode_sample(raw)
        got = dec.decode(raw)
        assert got == want, f"sample {n} of {path.name} differs"
        n += 1
    assert n > 0
    assert dec.stats.fallbacks == 0, "the simulator writes canonical JSON: nothing should take the strict path"
    assert dec.stats.reused > 10 * dec.stats.decoded  # the point of it: most sub-objects are reused


def test_msgpack_wire_format_gives_the_same_samples():
    lines = _smoke(1500)
    dec = IncrementalDecoder()
    for raw in lines:
        want = decode_sample(raw)
        assert dec.decode(encode_packed(want)) == want
    assert dec.stats.fallbacks == 0 and dec.stats.reused > dec.stats.decoded


def test_unchanged_sub_objects_are_shared_and_changed_ones_are_not():
    lines = _smoke(400)
    host = decode_sample(lines[0]).host
    mine = [raw for raw in lines if decode_sample(raw).host == host]
    assert len(mine) >= 3
    dec = IncrementalDecoder()
    a, b = dec.decode(mine[0]), dec.decode(mine[1])
    for ga, gb in zip(a.gpus, b.gpus, strict=True):
        if encode(ga.nvlink) == encode(gb.nvlink):
            assert ga.nvlink is gb.nvlink
    assert a.gpus[0] is not b.gpus[0]  # gauges moved: a new GpuSample around the shared parts
    # the same sub-object bytes in another host's sample are decoded again, not borrowed
    other = next(raw for raw in lines if decode_sample(raw).host != host)
    c = dec.decode(other)
    assert all(x.nvlink is not y.nvlink for x in c.gpus for y in b.gpus)


def test_the_same_bytes_in_a_neighbouring_field_are_a_change():
    # {"pending":false} is a valid RemappedRows and a valid RetiredPages: moving it from one field
    # to the other (the other left out) keeps every sub-object's bytes, only their places differ
    s = decode_sample(_smoke(1)[0])
    gpus = list(s.gpus)
    gpus[1] = msgspec.structs.replace(gpus[1], remapped_rows=RemappedRows(pending=False), retired_pages=None)
    first = msgspec.structs.replace(s, gpus=gpus)
    gpus = list(gpus)
    gpus[1] = msgspec.structs.replace(gpus[1], remapped_rows=None, retired_pages=RetiredPages(pending=False))
    moved = msgspec.structs.replace(s, gpus=gpus, seq=s.seq + 1)
    for enc in (encode, encode_packed):
        dec = IncrementalDecoder()
        assert dec.decode(enc(first)) == first
        got = dec.decode(enc(moved))
        assert got == moved and got.gpus[1].remapped_rows is None
        assert dec.stats.fallbacks == 0 and dec.check_cache() == []


def test_a_bad_message_after_a_good_change_leaves_the_cache_sound():
    # GPU 1 changes validly, GPU 3 invalidly in the same message: GPU 1's entry is already updated
    # when GPU 3 sends the message to the strict path; the host's next samples must not notice
    raw = _smoke(1)[0]
    doc = json.loads(raw)
    doc["gpus"][1]["pcie"]["replay_counter"] += 5
    good = msgspec.json.encode(doc)
    doc["gpus"][3]["ecc"]["dram_corrected_volatile"] = -1
    bad = msgspec.json.encode(doc)
    dec = _primed(raw)
    for data in (bad, raw, good, good, raw, raw):
        assert dec.decode(data) == decode_sample(data)
        assert dec.check_cache() == []
    assert dec.stats.fallbacks == 1


def test_field_partition_covers_the_schema():
    assert sorted(GPU_RAW + GPU_STABLE + GPU_GAUGES) == sorted(GpuSample.__struct_fields__)
    assert {"nvlink", "ecc", "pcie", "xids", "field_errors"} <= set(GPU_RAW)
    assert set(GPU_GAUGES) == {"temperature_c", "power_w", "utilization_pct"}


# ---------------------------------------------------------------------------- errors and fallbacks


def _primed(raw: bytes) -> IncrementalDecoder:
    dec = IncrementalDecoder()
    dec.decode(raw)
    return dec


def test_a_changed_bad_sub_object_costs_that_field_as_in_the_strict_decoder():
    raw = _smoke(1)[0]
    doc = json.loads(raw)
    doc["gpus"][3]["ecc"]["dram_corrected_volatile"] = -1
    bad = msgspec.json.encode(doc)
    dec = _primed(raw)
    got = dec.decode(bad)
    assert got == decode_sample(bad)
    assert got.gpus[3].ecc.dram_corrected_volatile is None
    assert removed_fields(got) == ["$.gpus[3].ecc.dram_corrected_volatile: Expected `int` >= 0; removed"]
    assert dec.decode(raw) == decode_sample(raw)  # a bad message leaves the cache sound
    assert dec.check_cache() == []


@pytest.mark.parametrize("where", ["seq", "clocks", "ecc", "net_port"])
def test_an_integer_past_2_64_is_removed_on_both_paths(where):
    raw = _smoke(1)[0]
    doc = json.loads(raw)
    big = 10 ** 4000 if where != "seq" else 2 ** 64
    if where == "seq":
        doc["seq"] = big
    elif where == "clocks":
        doc["gpus"][2]["clocks_event_reasons"] = big
    elif where == "ecc":
        doc["gpus"][2]["ecc"]["sram_corrected_volatile"] = big
    else:
        doc["net_ports"][0]["counters"]["symbol_error"] = big
    bad = msgspec.json.encode(doc)
    dec = _primed(raw)
    if where == "seq":  # a field the sample cannot do without: rejected whole, on both paths
        same(outcome(dec.decode, bad), outcome(decode_sample, bad))
        with pytest.raises(ContractError, match="past 2..64-1"):
            decode_sample(bad)
        return
    got = dec.decode(bad)
    assert got == decode_sample(bad)
    assert len(removed_fields(got)) == 1 and "past 2**64-1" in removed_fields(got)[0]
    assert dec.check_cache() == []


@pytest.mark.parametrize("key", ["gpus", "nvlink", "ecc", "pcie", "net_ports", "aer", "edac"])
def test_a_duplicate_key_whose_first_value_is_invalid_stays_an_error(key):
    raw = _smoke(1)[0]
    at = raw.index(f'"{key}":'.encode())
    bad = raw[:at] + f'"{key}":{{"bogus":1}},'.encode() + raw[at:]
    with pytest.raises(ContractError) as want:
        decode_sample(bad)
    with pytest.raises(ContractError) as got:
        _primed(raw).decode(bad)
    assert str(got.value) == str(want.value)


def test_non_canonical_json_is_decoded_by_the_strict_path_to_the_same_value():
    raw = _smoke(1)[0]
    spaced = json.dumps(json.loads(raw), indent=1).encode()
    dec = _primed(raw)
    assert dec.decode(spaced) == decode_sample(raw)
    assert dec.stats.fallbacks == 1


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b"null", b"\x80", b"\xc1", b'{"v":2,"host":"h"}',
                                  b"x" * (1 << 20 + 1)], ids=repr)
def test_garbage_gives_the_same_error(data):
    same(outcome(IncrementalDecoder().decode, data), outcome(decode_sample, data))


def test_str_and_buffers_are_decoded_but_never_cached():
    raw = _smoke(1)[0]
    dec = IncrementalDecoder()
    buf = bytearray(raw)
    assert dec.decode(buf) == decode_sample(raw)
    assert dec.decode(raw.decode()) == decode_sample(raw)
    assert len(dec) == 0  # a bytearray can change under a cached view
    buf[:] = b" " * len(buf)
    assert dec.decode(raw) == decode_sample(raw)


def test_a_host_switching_wire_format_gets_the_same_values():
    lines = _smoke(300)
    dec = IncrementalDecoder()
    for i, raw in enumerate(lines):
        want = decode_sample(raw)
        assert dec.decode(encode_packed(want) if i % 3 == 0 else raw) == want


def test_hosts_kept_are_bounded_and_forget_drops_one():
    lines = _smoke(400)
    hosts = {decode_sample(raw).host for raw in lines}
    assert len(hosts) > 8
    dec = IncrementalDecoder(max_hosts=8)
    for raw in lines:
        assert dec.decode(raw) == decode_sample(raw)
        assert len(dec) <= 8
    last = decode_sample(lines[-1]).host
    dec.forget(last)
    assert len(dec) == 7
    assert dec.decode(lines[-1]) == decode_sample(lines[-1])


# ---------------------------------------------------------------------------- aliasing


def test_check_cache_sees_a_mutated_shared_object():
    raw = _smoke(1)[0]
    dec = IncrementalDecoder()
    s = dec.decode(raw)
    assert dec.check_cache() == []
    s.gpus[2].ecc.dram_corrected_volatile = 12345
    s.net_ports[0].counters["symbol_error"] = 99
    bad = dec.check_cache()
    assert any("gpus[2].ecc" in b for b in bad) and any("net_ports" in b for b in bad)
    # the list of a sample's GPUs is the base of the host's next one
    dec = IncrementalDecoder()
    dec.decode(raw)
    dec.decode(raw).gpus.reverse()
    assert dec.check_cache() == [f"{s.host}: gpus"]


@pytest.mark.slow
def test_the_engine_with_every_detector_never_mutates_a_decoded_sample():
    lines = _smoke(3000)
    dec = IncrementalDecoder()
    engine = DetectorEngine(extra_detectors=model_detectors())
    seen = []
    for raw in lines:
        s = dec.decode(raw)
        engine.feed(s)
        seen.append((raw, s))
    assert dec.check_cache() == []
    for raw, s in seen:
        assert s == decode_sample(raw)


# ---------------------------------------------------------------------------- mutated samples

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
values = st.none() | st.booleans() | st.integers(min_value=-(2**65), max_value=2**65) | \
    st.floats(allow_nan=True) | st.text(max_size=8) | st.just([]) | st.just({}) | st.just([1, None])


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


@st.composite
def mutated(draw):
    lines = _smoke(400)
    i = draw(st.integers(min_value=64, max_value=len(lines) - 1))
    doc = json.loads(lines[i])
    paths = [p for p in _paths(doc) if p]
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(paths))
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            op = draw(st.sampled_from(["set", "delete", "unknown"]))
            if op == "set":
                parent[path[-1]] = draw(values)
            elif op == "delete":
                del parent[path[-1]]
            elif isinstance(parent, dict):
                parent["surprise"] = draw(values)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or replaced that place
    packed = draw(st.booleans())
    try:
        data = msgspec.msgpack.encode(doc) if packed else msgspec.json.encode(doc)
    except (OverflowError, msgspec.EncodeError):
        data = msgspec.json.encode(doc)
    return lines, i, data


@FUZZ
@given(case=mutated())
def test_mutated_samples_decode_or_fail_exactly_as_decode_sample(case):
    lines, i, data = case
    dec = IncrementalDecoder()
    for raw in lines[max(0, i - 70): i]:  # the same host's previous samples, interleaved with others
        dec.decode(raw)
        dec.decode(encode_packed(decode_sample(raw)))
    same(outcome(dec.decode, data), outcome(decode_sample, data))
    same(outcome(dec.decode, lines[i]), outcome(decode_sample, lines[i]))
    assert dec.check_cache() == []


@FUZZ
@given(data=st.data())
def test_byte_level_corruption_fails_exactly_as_decode_sample(data):
    lines = _smoke(400)
    i = data.draw(st.integers(min_value=64, max_value=len(lines) - 1))
    raw = bytearray(lines[i])
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        at = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
        raw[at] = data.draw(st.sampled_from(b'{}[],:"0129-.enx\\ '))
    dec = IncrementalDecoder()
    for r in lines[i - 64: i]:
        dec.decode(r)
    same(outcome(dec.decode, bytes(raw)), outcome(decode_sample, bytes(raw)))


# ---------------------------------------------------------------------------- msgpack byte templates

_MOVING_KEYS = [msgspec.msgpack.encode(k) for k in ("ts", "seq", "temperature_c", "power_w", "utilization_pct")]


_PACKED: list[bytes] = []


def _packed_host() -> list[bytes]:
    """One host's consecutive samples of the smoke recording, as msgpack."""
    if not _PACKED:
        samples = [decode_sample(raw) for raw in _smoke(1500)]
        _PACKED.extend(encode_packed(s) for s in samples if s.host == samples[0].host)
    return _PACKED


def _near_values(data: bytes) -> tuple[list[int], list[int]]:
    """Positions at and around the values that move (their keys, type bytes, payloads, next key),
    and those of the payloads alone."""
    out, payloads = [], []
    for k in _MOVING_KEYS:
        at = data.find(k)
        while at >= 0:
            out += range(max(0, at - 1), min(len(data), at + len(k) + 11))
            payloads += range(at + len(k) + 1, min(len(data), at + len(k) + 9))
            at = data.find(k, at + 1)
    return sorted(set(out)), payloads


def test_msgpack_samples_are_built_from_the_host_template():
    lines = _smoke(1500)
    dec, plain = IncrementalDecoder(), IncrementalDecoder(templates=False)
    for raw in lines:
        want = decode_sample(raw)
        data = encode_packed(want)
        for got in (dec.decode(data), plain.decode(data)):
            assert got == want and encode_packed(got) == data and type(got) is type(want)
    assert dec.stats.fallbacks == 0 and plain.stats.templated == 0
    assert dec.stats.templated > 0.9 * (len(lines) - len(dec))  # all but each host's first and a few
    assert dec.check_cache() == [] and plain.check_cache() == []


def test_the_template_is_chosen_by_a_hint_that_cannot_change_a_result(monkeypatch):
    # every host files its template under one key: another host's template never matches
    from detectors.engine import fastdecode
    monkeypatch.setattr(fastdecode, "_host_key", lambda data: b"one")
    dec = IncrementalDecoder()
    samples = sorted((decode_sample(raw) for raw in _smoke(400)), key=lambda s: s.host)  # each host's in order
    for i, want in enumerate(samples):
        assert dec.decode(encode_packed(want)) == want
        assert i % 50 or dec.check_cache() == []
    assert dec.check_cache() == []
    assert len(samples) - len(dec) > dec.stats.templated > 0.8 * (len(samples) - len(dec))


def test_values_the_schema_refuses_cost_the_field_as_in_the_strict_decoder():
    mine = _packed_host()
    dec = IncrementalDecoder()
    dec.decode(mine[0])
    s = decode_sample(mine[1])
    gpus = list(s.gpus)
    gpus[2] = msgspec.structs.replace(gpus[2], power_w=float("nan"), temperature_c=-0.0)
    for bad in (msgspec.structs.replace(s, gpus=gpus), msgspec.structs.replace(s, ts=-1.0)):
        data = encode_packed(bad)
        assert len(data) == len(mine[1])  # a float is 9 bytes whatever its value: the template is tried
        same(outcome(dec.decode, data), outcome(decode_sample, data))
    ok = msgspec.structs.replace(s, gpus=[msgspec.structs.replace(g, utilization_pct=-0.0) for g in s.gpus])
    got = dec.decode(encode_packed(ok))
    assert encode_packed(got) == encode_packed(ok)  # -0.0 kept, not 0.0
    assert dec.stats.templated == 1 and dec.check_cache() == []


def test_an_integer_changing_width_takes_the_envelope_path():
    mine = _packed_host()
    s = decode_sample(mine[0])
    dec = IncrementalDecoder()
    seqs = [127, 128, 129, 255, 256, 257, 65535, 65536, 65537, 2**32, 2**32 + 1]
    for seq in seqs:
        data = encode_packed(msgspec.structs.replace(s, seq=seq))
        assert dec.decode(data) == decode_sample(data)
    assert dec.stats.templated == 6  # 129, 255, 257, 65535, 65537, 2**32 + 1: as wide as the one before
    assert dec.check_cache() == []


FUZZ_BYTES = b"\x00\x01\x7f\x80\x90\xa0\xa3\xc0\xc1\xc2\xca\xcb\xcc\xcd\xce\xcf\xd0\xd3\xd9\xdc\xe0\xf8\xff"


@FUZZ
@given(data=st.data())
def test_msgpack_byte_changes_at_the_values_decode_or_fail_exactly_as_decode_sample(data):
    mine = _packed_host()
    i = data.draw(st.integers(min_value=1, max_value=len(mine) - 1))
    raw = bytearray(mine[i])
    near, payloads = _near_values(mine[i])
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        at = data.draw(st.sampled_from(near) if data.draw(st.integers(0, 3)) else
                       st.integers(min_value=0, max_value=len(raw) - 1))
        how = data.draw(st.sampled_from(["byte", "any", "nan", "width", "shift", "payload"]))
        if how == "payload":  # a value's own bytes: a new value of the same type (or a NaN, an inf)
            raw[data.draw(st.sampled_from(payloads))] = data.draw(st.integers(min_value=0, max_value=255))
        elif how == "shift":  # one byte out here, one in there: the same length, the values moved
            del raw[at]
            raw.insert(data.draw(st.sampled_from(near)), data.draw(st.sampled_from(FUZZ_BYTES)))
        elif how == "byte":
            raw[at] = data.draw(st.sampled_from(FUZZ_BYTES))
        elif how == "any":
            raw[at] = data.draw(st.integers(min_value=0, max_value=255))
        elif how == "nan":  # a float's payload: NaN, inf, -0.0, huge
            raw[at:at + 9] = b"\xcb" + data.draw(st.sampled_from(
                [b"\x7f\xf8" + bytes(6), b"\x7f\xf0" + bytes(6), b"\x80" + bytes(7), b"\x7f\xef" + b"\xff" * 6]))
        else:  # same length, other type: uint64, int64, two fixints, a fixstr
            raw[at:at + 9] = data.draw(st.sampled_from([b"\xcf" + bytes(8), b"\xd3" + b"\xff" * 8,
                                                        b"\x05\xc0" + bytes(7), b"\xa8" + b"abcdefgh"]))
    del raw[len(mine[i]):]
    bad = bytes(raw)
    dec, plain = IncrementalDecoder(), IncrementalDecoder(templates=False)
    for d in (dec, plain):
        d.decode(mine[i - 1])
    want = outcome(decode_sample, bad)
    same(outcome(dec.decode, bad), want)
    same(outcome(plain.decode, bad), want)
    same(outcome(dec.decode, mine[i]), outcome(decode_sample, mine[i]))
    assert dec.check_cache() == []


def test_check_cache_sees_a_mutated_template_sample():
    mine = _packed_host()
    dec = IncrementalDecoder()
    s = dec.decode(mine[0])  # the template's sample
    assert dec.decode(mine[1]) == decode_sample(mine[1]) and dec.stats.templated == 1
    assert dec.check_cache() == []
    s.gpus[0].pcie.replay_counter = 999
    assert f"{s.host}: template" in dec.check_cache()


def test_templates_are_bounded_with_the_hosts_and_forgotten_with_them():
    lines = _smoke(400)
    dec = IncrementalDecoder(max_hosts=8)
    for raw in lines:
        want = decode_sample(raw)
        assert dec.decode(encode_packed(want)) == want
        assert len(dec) <= 8 and len(dec._fast) <= 8
    last = decode_sample(lines[-1])
    dec.forget(last.host)
    assert len(dec._fast) == 7 and dec.check_cache() == []
    assert dec.decode(encode_packed(last)) == last


def test_truncated_msgpack_gives_the_same_error_with_templates_kept():
    mine = _packed_host()
    dec = IncrementalDecoder()
    dec.decode(mine[0])
    cuts = [*range(1, 12), len(mine[1]) // 2, len(mine[1]) - 1]
    for data in [mine[1][:n] for n in cuts] + [b"\x81\xa4host", b"\x81\xa4host\xd9", b"\xde\x00\x01\xa4host"]:
        same(outcome(dec.decode, data), outcome(decode_sample, data))
    assert dec.decode(mine[1]) == decode_sample(mine[1]) and dec.stats.templated == 1


def test_samples_with_one_base_differ_only_in_the_template_values():
    """IncrementalDecoder.base: P (the envelope-decoded sample a template is made of) and every sample
    built on its template share one base; they differ in nothing but ts, seq and the GPUs' gauges,
    every other field holding P's very object (what DetectorEngine.feed relies on to skip compares).
    JSON, a fallback, a host's new template: another base or none."""
    from detectors.engine.codegen import _moving
    from detectors.engine.fastdecode import FAST_GPU, FAST_SAMPLE
    from fleethealth.schema import Sample

    assert set(FAST_GPU) <= _moving("gpu")  # the engine's skip reads none of the values a template fills in
    lines = _smoke(1500)
    dec = IncrementalDecoder()
    first: dict[int, tuple[object, Sample]] = {}
    based = 0
    for raw in lines:
        data = encode_packed(decode_sample(raw))
        s = dec.decode(data)
        if dec.base is None:
            continue
        based += 1
        b, p = first.setdefault(id(dec.base), (dec.base, s))
        assert b is dec.base and p.host == s.host
        assert all(getattr(s, f) is getattr(p, f) for f in Sample.__struct_fields__ if f not in (*FAST_SAMPLE, "gpus"))
        assert len(s.gpus) == len(p.gpus)
        for g, h in zip(s.gpus, p.gpus, strict=True):
            assert all(getattr(g, f) is getattr(h, f) for f in GpuSample.__struct_fields__ if f not in FAST_GPU)
    assert based > 0.9 * len(lines) and len(first) < len(lines) / 4
    dec.decode(lines[-1])
    assert dec.base is None  # JSON
    dec.decode(encode_packed(decode_sample(lines[-1])))
    assert dec.base is not None
    with pytest.raises(ContractError):
        dec.decode(b"\x81\xa4host\x07")
    assert dec.base is None
