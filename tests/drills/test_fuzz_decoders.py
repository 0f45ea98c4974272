"""Property-based fuzzing of every contract decoder: any bytes in, a value or a ContractError out."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleethealth.schema import DEADLETTER as DL_CODEC
from fleethealth.schema import (
    ContractError,
    decode_action,
    decode_incident,
    decode_sample,
    encode,
    encode_packed,
)
from tests.spine.sample_factory import sample

pytestmark = pytest.mark.drill
DECODERS = {"sample": decode_sample, "incident": decode_incident, "action": decode_action,
            "deadletter": DL_CODEC.decode}
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=30,
)


def _only_contract_errors(decode, data) -> None:
    try:
        decode(data)
    except ContractError as exc:
        assert exc.reason and exc.field.startswith("$")


@pytest.mark.parametrize("name", sorted(DECODERS))
@FUZZ
@given(data=st.binary(max_size=2048))
def test_random_bytes(name, data):
    _only_contract_errors(DECODERS[name], data)


@pytest.mark.parametrize("name", sorted(DECODERS))
@FUZZ
@given(doc=json_values)
def test_random_json_documents(name, doc):
    _only_contract_errors(DECODERS[name], json.dumps(doc).encode())
    try:
        packed = msgspec.msgpack.encode(doc)
    except OverflowError:  # msgpack has no integers past 64 bits; JSON above covers them
        return
    _only_contract_errors(DECODERS[name], packed)


_BASE = msgspec.to_builtins(sample(gpus=2))


def _paths(doc, prefix=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


PATHS = list(_paths(_BASE))


@FUZZ
@given(path=st.sampled_from(PATHS), value=json_values)
def test_one_field_replaced_by_anything(path, value):
    """Mutate one field of a valid sample to any JSON value: decoded or rejected, never a crash."""
    doc = json.loads(json.dumps(_BASE))
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    raw = json.dumps(doc).encode()
    try:
        s = decode_sample(raw)
    except ContractError as exc:
        assert exc.field.startswith("$")
        return
    assert encode(s)  # whatever decodes re-encodes (the contract is closed under round trip)


@FUZZ
@given(cut=st.integers(min_value=0, max_value=len(encode_packed(sample(gpus=2)))))
def test_truncated_msgpack(cut):
    _only_contract_errors(decode_sample, encode_packed(sample(gpus=2))[:cut])


def test_deeply_nested_json_is_rejected_quickly():
    for depth in (1_000, 100_000):
        raw = b"[" * depth + b"]" * depth
        with pytest.raises(ContractError):
            decode_sample(raw)
        nested = b'{"v":1,"host":"h","ts":1,"seq":1,"collector_version":"x","gpus":' + raw + b"}"
        with pytest.raises(ContractError):
            decode_sample(nested)


def test_giant_integer_is_rejected_not_parsed_forever():
    raw = b'{"v":1,"host":"h","ts":1,"seq":' + b"9" * 500_000 + b',"collector_version":"x"}'
    with pytest.raises(ContractError):
        decode_sample(raw)
