import json

import msgspec
import pytest

from fleethealth.schema import (
    ActionRecord,
    ContractError,
    Incident,
    decode_action,
    decode_incident,
    decode_sample,
    encode,
)
from tests.spine.sample_factory import sample


def _doc() -> dict:
    return json.loads(encode(sample()))


def _dec(doc: dict) -> None:
    decode_sample(json.dumps(doc).encode())


def test_round_trip_is_lossless():
    s = sample()
    assert decode_sample(encode(s)) == s
    assert encode(decode_sample(encode(s))) == encode(s)


def test_none_and_zero_are_different():
    doc = _doc()
    doc["gpus"][0]["ecc"] = {"dram_uncorrected_volatile": 0}
    s = decode_sample(json.dumps(doc).encode())
    assert s.gpus[0].ecc.dram_uncorrected_volatile == 0
    assert s.gpus[0].ecc.sram_uncorrected_volatile is None


@pytest.mark.parametrize(
    "mutate, field, words",
    [
        (lambda d: d.update(v=2), "$.v", "unsupported schema version 2"),
        (lambda d: d.update(v="1"), "$.v", "unsupported schema version"),
        (lambda d: d.pop("host"), "$", "missing required field `host`"),
        (lambda d: d.update(seq=-1), "$.seq", ">= 0"),
        (lambda d: d.update(seq="12"), "$.seq", "Expected `int`, got `str`"),
        (lambda d: d["gpus"][3].update(index="three"), "$.gpus[3].index", "Expected `int`"),
        (lambda d: d.update(gpus=d["gpus"] * 9), "$.gpus", "length <= 64"),
        (lambda d: d.update(surprise=1), "$", "unknown field `surprise`"),
        (lambda d: d.update(host=""), "$.host", "length >= 1"),
        (lambda d: d.update(ts=1e12), "$.ts", "<= 100000000000.0"),
        (lambda d: d["net_ports"][1].pop("device"), "$.net_ports[1]", "missing required field `device`"),
        (lambda d: d["gpus"][2].update(ecc=[1, 2]), "$.gpus[2].ecc", "Expected `object"),
    ],
)
def test_malformed_samples_name_the_field(mutate, field, words):
    """What cannot be removed without changing what the sample says rejects it whole (the values a
    sample can lose field by field: tests/spine/test_salvage.py)."""
    doc = _doc()
    mutate(doc)
    with pytest.raises(ContractError) as err:
        _dec(doc)
    assert err.value.field == field
    assert words in str(err.value)
    assert err.value.kind == "telemetry sample"


@pytest.mark.parametrize("raw", [b"", b"{", b"\x00\xff garbage", b"[1,2,3]", b"null", b'{"v":1,"host":"h"'])
def test_truncated_or_garbage_input_is_a_contract_error(raw):
    with pytest.raises(ContractError):
        decode_sample(raw)


def test_truncation_at_every_byte_never_escapes_as_another_exception():
    raw = encode(sample(gpus=2))
    for cut in range(0, len(raw), 7):
        with pytest.raises(ContractError):
            decode_sample(raw[:cut])


def test_nan_is_not_json_and_is_rejected():
    raw = encode(sample(gpus=1)).replace(b'"temperature_c":41.0', b'"temperature_c":NaN')
    assert b"NaN" in raw
    with pytest.raises(ContractError, match="not valid JSON"):
        decode_sample(raw)


def test_oversized_message_rejected_before_parsing():
    with pytest.raises(ContractError, match="exceeds"):
        decode_sample(b" " * (2 << 20))


def test_u64_max_counter_is_accepted_as_read():
    doc = _doc()
    doc["gpus"][0]["pcie"]["replay_counter"] = 2**64 - 1
    assert decode_sample(json.dumps(doc).encode()).gpus[0].pcie.replay_counter == 2**64 - 1


def _incident(**kw) -> Incident:
    base = dict(id="inc-1", host="h1", component="GPU-1", failure_mode="gpu_dram_uce", severity="critical",
                confidence=0.99, detector="rule:xid48", first_seen=10.0, last_seen=12.0, state="open")
    base.update(kw)
    return Incident(**base)


def test_incident_round_trip_and_vocabulary_check():
    inc = _incident()
    assert decode_incident(encode(inc)) == inc
    with pytest.raises(ContractError, match="unknown failure mode 'gpu_on_fire'") as err:
        decode_incident(encode(_incident(failure_mode="gpu_on_fire")))
    assert err.value.field == "$.failure_mode"
    with pytest.raises(ContractError, match="before first_seen"):
        decode_incident(encode(_incident(last_seen=1.0)))
    bad = msgspec.json.decode(encode(inc))
    bad["state"] = "exploded"
    with pytest.raises(ContractError) as err:
        decode_incident(json.dumps(bad))
    assert err.value.field == "$.state"


def test_action_round_trip_and_bad_kind():
    a = ActionRecord(id="a1", incident_id="inc-1", host="h1", kind="drain", outcome="done", ts=5.0)
    assert decode_action(encode(a)) == a
    doc = msgspec.json.decode(encode(a))
    doc["kind"] = "format_disk"
    with pytest.raises(ContractError) as err:
        decode_action(json.dumps(doc))
    assert err.value.field == "$.kind"


def test_msgpack_wire_format_decodes_to_the_same_sample():
    from fleethealth.schema import encode_packed

    s = sample()
    assert decode_sample(encode_packed(s)) == s
    assert len(encode_packed(s)) < len(encode(s))


def test_msgpack_errors_name_the_field_too():
    import msgspec

    from fleethealth.schema import encode_packed

    doc = msgspec.to_builtins(sample(gpus=1))
    doc["gpus"][0]["index"] = "zero"
    with pytest.raises(ContractError) as err:
        decode_sample(msgspec.msgpack.encode(doc))
    assert err.value.field == "$.gpus[0].index"
    doc["v"] = 3
    with pytest.raises(ContractError, match="unsupported schema version 3"):
        decode_sample(msgspec.msgpack.encode(doc))
    with pytest.raises(ContractError, match="not valid msgpack"):
        decode_sample(encode_packed(sample(gpus=1))[:-5])
