"""Field-level rejection: an out-of-range value costs its field (recorded), the rest of the sample
counts: a real Xid 79 beside a 4,000-digit counter still reaches the rules (fleethealth.salvage)."""

from __future__ import annotations

import msgspec
import pytest

from detectors.engine.engine import DetectorEngine
from fleethealth.salvage import MAX_REMOVED, has_long_digits, removed_fields
from fleethealth.schema import PID_MAX, ContractError, XidEvent, decode_sample, encode, encode_packed
from tests.spine.sample_factory import sample

XID79 = {"xid": 79, "ts": 1_764_000_000.0, "message": "GPU has fallen off the bus."}


def _doc(**kw):
    return msgspec.to_builtins(sample(**kw))


def _json(doc) -> bytes:
    return msgspec.json.encode(doc)


@pytest.mark.parametrize(
    "mutate, path, value",
    [
        (lambda d: d["gpus"][1]["ecc"].update(dram_uncorrected_volatile=10**4000),
         "$.gpus[1].ecc.dram_uncorrected_volatile", None),
        (lambda d: d["gpus"][1]["ecc"].update(dram_uncorrected_volatile=2**64), "$.gpus[1].ecc.dram_uncorrected_volatile",
         None),
        (lambda d: d["gpus"][1]["ecc"].update(dram_uncorrected_volatile=1.5), "$.gpus[1].ecc.dram_uncorrected_volatile",
         None),
        (lambda d: d["gpus"][0].update(temperature_c="hot"), "$.gpus[0].temperature_c", None),
        (lambda d: d["gpus"][0].update(clocks_event_reasons=10**30), "$.gpus[0].clocks_event_reasons", None),
        (lambda d: d.update(expected_gpus=10_000), "$.expected_gpus", 0),
        (lambda d: d["net_ports"][2]["counters"].update(symbol_error=-3), "$.net_ports[2].counters[...]", None),
        (lambda d: d["gpus"][0]["nvlink"]["crc_flit"].__setitem__(4, 10**25), "$.gpus[0].nvlink.crc_flit[4]", None),
    ],
)
def test_a_bad_value_costs_its_field_and_the_xid_beside_it_counts(mutate, path, value):
    doc = _doc(gpus=2)
    doc["gpus"][1]["xids"] = [XID79]
    mutate(doc)
    s = decode_sample(_json(doc))
    notes = removed_fields(s)
    assert len(notes) == 1 and notes[0].startswith(path + ":"), notes
    assert s.gpus[1].xids == [XidEvent(**XID79)]
    if path.endswith("crc_flit[4]"):
        assert s.gpus[0].nvlink.crc_flit[4] is None and len(s.gpus[0].nvlink.crc_flit) == 18  # links keep places
    elif path == "$.expected_gpus":
        assert s.expected_gpus == value
    elif "counters" in path:
        assert "symbol_error" not in s.net_ports[2].counters and "link_downed" in s.net_ports[2].counters
    engine = DetectorEngine()
    modes = {i.failure_mode for i in engine.feed(s)}
    assert "gpu_fell_off_bus" in modes, modes


def test_msgpack_nan_gauge_and_huge_pid_are_removed_not_the_sample():
    doc = _doc(gpus=2)
    doc["gpus"][0]["temperature_c"] = float("nan")
    doc["gpus"][1]["xids"] = [dict(XID79, pid=PID_MAX + 1), dict(XID79, xid=-4), XID79]
    s = decode_sample(msgspec.msgpack.encode(doc))
    assert s.gpus[0].temperature_c is None
    assert [x.xid for x in s.gpus[1].xids] == [79, 79]  # the event with a bad xid went; the pid only cost itself
    assert s.gpus[1].xids[0].pid is None
    assert any("temperature_c" in n for n in removed_fields(s)) and any("xids[1]" in n for n in removed_fields(s))


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda d: d.update(seq=2**64), "past 2**64-1 (a field the sample requires)"),
        (lambda d: d.update(ts=float("nan")), "Expected `float`"),
        (lambda d: d["gpus"][0].update(index=10**40), "<= 1000000"),  # a GPU is not dropped
        (lambda d: d.update(gpus=d["gpus"] * 40), "length <= 64"),
    ],
)
def test_what_the_sample_cannot_lose_rejects_it_whole(mutate, words):
    doc = _doc(gpus=2)
    mutate(doc)
    raw = msgspec.msgpack.encode(doc) if doc["ts"] != doc["ts"] else _json(doc)
    with pytest.raises(ContractError) as err:
        decode_sample(raw)
    assert words in str(err.value)


def test_too_many_bad_fields_reject_the_sample():
    doc = _doc(gpus=8)
    for g in doc["gpus"]:
        g["temperature_c"] = g["power_w"] = g["utilization_pct"] = "x"
        g["ecc"]["dram_corrected_aggregate"] = g["pcie"]["replay_counter"] = -1
    assert MAX_REMOVED < 8 * 5
    with pytest.raises(ContractError):
        decode_sample(_json(doc))


def test_a_long_digit_run_in_a_string_changes_nothing():
    s = sample(gpus=1)
    s.gpus[0].name = "board 123456789012345678901234567890"
    raw = encode(s)
    assert has_long_digits(raw)
    assert decode_sample(raw) == s and removed_fields(decode_sample(raw)) == []


def test_a_valid_sample_decodes_unchanged_in_both_formats():
    s = sample()
    assert decode_sample(encode(s)) == s == decode_sample(encode_packed(s))
    assert removed_fields(s) == []
