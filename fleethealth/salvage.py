"""Field-level rejection for telemetry samples: a bad value costs its field, not the sample.

A sample whose counter has thousands of digits, whose gauge is NaN or whose Xid event names a pid
past ``PID_MAX`` still carries real events (a Xid 79 in the same poll must count). The strict
decoder stops at the first bad value; :func:`salvage` (only called on that slow path) removes what
is bad and decodes the rest strictly:

* integers past 2**64-1 (or below -2**63) anywhere: msgspec cannot bound an int past int64, so
  :func:`has_long_digits` (a run of 20+ digits in the JSON bytes: 2**64-1 has 20) gates a walk of
  the generic decode that removes them;
* then, at most :data:`MAX_REMOVED` times: the path the strict decoder names is removed: an
  optional scalar field is dropped (its default applies: None is "not available"), an entry of a
  counter map is dropped, an item of a list of scalars becomes null (NVLink arrays keep their link
  positions), and an event (a Xid event, a kernel event, a source error) with a bad or missing
  field is dropped. What may not go is rejected whole, with the original reason: a required
  top-level field (host, ts, seq, ...), a component's identity (a GPU, port, AER device or DIMM
  without its index / name: dropping it would read as a GPU that fell off the bus), a whole object
  or list (``gpus`` past 64 entries), unknown fields, a wrong schema version, bytes that are not
  JSON / msgpack.

What was removed is appended to ``sample.source_errors`` as ``SourceError(source="contract",
error="$.path: reason; removed")`` (one entry per removal, within the contract's 64), so the
detect worker can count it and say so in a dead letter while the rest of the sample is processed.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from fleethealth.schema import SAMPLE, ContractError, Sample, SourceError

EVENT_LISTS = frozenset({"xids", "kernel_events", "source_errors"})  # items that may be dropped
MAX_REMOVED = 32  # removals per sample before it is rejected whole (bounds the work: one decode each)
CONTRACT_SOURCE = "contract"
_I64_MIN = -(1 << 63)
_U64_MAX = (1 << 64) - 1
_DIGITS = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))  # digit -> "0", else " "
_RUN = b"0" * 20
_TOKEN = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[\.\.\.\]")


def has_long_digits(data: bytes | bytearray | memoryview) -> bool:
    """A run of 20 or more ASCII digits: a possible integer past 2**64-1 (also a long digit run in a
    string; the walk then finds nothing and costs only time)."""
    return _RUN in bytes(data).translate(_DIGITS)


def _path(field: str) -> list[str | int] | None:
    """``$.gpus[0].ecc.x`` -> ["gpus", 0, "ecc", "x"]; ``[...]`` (a map value) -> "..."."""
    if not field.startswith("$"):
        return None
    out: list[str | int] = []
    pos = 1
    while pos < len(field):
        m = _TOKEN.match(field, pos)
        if m is None:
            return None
        out.append(m.group(1) if m.group(1) is not None else int(m.group(2)) if m.group(2) is not None else "...")
        pos = m.end()
    return out


def _fmt(path: list[str | int]) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else "[...]" if p == "..." else f".{p}" for p in path)


def _bad_int(v: Any) -> bool:
    return type(v) is int and not (_I64_MIN <= v <= _U64_MAX)


def _drop_big_ints(obj: Any, path: list[str | int], removed: list[str]) -> None:
    """Remove integers outside int64/uint64 in place (map entries and fields dropped, list items
    nulled) and name each one."""
    if isinstance(obj, dict):
        for k in list(obj):
            v = obj[k]
            if _bad_int(v):
                del obj[k]
                removed.append(f"{_fmt([*path, str(k)])}: integer of {len(str(abs(v)))} digits, past 2**64-1")
            elif isinstance(v, (dict, list)):
                _drop_big_ints(v, [*path, str(k)], removed)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            if _bad_int(v):
                obj[i] = None
                removed.append(f"{_fmt([*path, i])}: integer of {len(str(abs(v)))} digits, past 2**64-1")
            elif isinstance(v, (dict, list)):
                _drop_big_ints(v, [*path, i], removed)


def _valid_count(v: Any) -> bool:
    return type(v) is int and 0 <= v <= _U64_MAX


def _remove(root: dict[str, Any], path: list[str | int]) -> bool:
    """Remove what ``path`` names, if it may be removed (see the module doc); False otherwise."""
    if not path:
        return False
    parents: list[Any] = [root]
    for p in path[:-1]:
        cur = parents[-1]
        try:
            parents.append(cur[p])
        except (KeyError, IndexError, TypeError):
            return False
    parent, last = parents[-1], path[-1]
    if last == "...":  # a map value (or key): drop the entries that are not valid counters
        if not isinstance(parent, dict):
            return False
        bad = [k for k, v in parent.items() if not (isinstance(k, str) and len(k) <= 256 and _valid_count(v))]
        for k in bad:
            del parent[k]
        return bool(bad)
    if isinstance(last, int):
        if not isinstance(parent, list) or last >= len(parent):
            return False
        if isinstance(parent[last], (dict, list)):
            # an event may go; a GPU, port, AER device or DIMM may not: a sample one GPU short of
            # expected_gpus reads as a GPU that fell off the bus
            if len(path) < 2 or path[-2] not in EVENT_LISTS:
                return False
            del parent[last]
        elif parent[last] is None:
            return False
        else:
            parent[last] = None
        return True
    if isinstance(parent, dict) and last in parent and not isinstance(parent[last], (dict, list)):
        del parent[last]  # a scalar field: its default (None, "not available") applies
        return True
    return False  # a whole object or list (gpus, ecc, ...) is never dropped for one bad value


def _enclosing_item(path: list[str | int]) -> list[str | int] | None:
    """The path of the nearest list item containing ``path`` (a required field costs that item)."""
    for i in range(len(path) - 1, -1, -1):
        if isinstance(path[i], int):
            return path[: i + 1]
    return None


def _give_up(first: ContractError | None, last: ContractError, removed: list[str]) -> ContractError:
    """The error to reject the whole sample with: the strict decoder's own, or (it accepted an
    integer past 2**64-1 in a field the sample cannot do without) the removal that broke it."""
    if first is not None:
        return first
    m = re.match(r"Object missing required field `([^`]*)`", last.reason)
    for note in reversed(removed):
        where, _, why = note.partition(": ")
        if m and where == f"{last.field}.{m.group(1)}":
            return ContractError(SAMPLE.kind, f"{why} (a field the sample requires)", where, invalid_value=True)
    return last


def salvage(data: bytes, first: ContractError | None) -> Sample:
    """Decode ``data`` with its bad values removed (see the module doc). ``first`` is the strict
    decoder's error (None: it decoded, but :func:`has_long_digits` fired). Raises ``first`` (or a
    ContractError naming the field) when the sample cannot be kept."""
    packed = len(data) > 0 and (0x80 <= data[0] <= 0x8F or data[0] in (0xDE, 0xDF))  # as schema._Codec
    try:
        obj = (msgspec.msgpack.decode if packed else msgspec.json.decode)(data)
    except (msgspec.MsgspecError, RecursionError, ValueError):
        if first is not None:
            raise first from None
        raise ContractError(SAMPLE.kind, "not decodable") from None
    if not isinstance(obj, dict):
        if first is not None:
            raise first
        raise ContractError(SAMPLE.kind, "not an object")
    removed: list[str] = []
    if not packed:
        _drop_big_ints(obj, [], removed)
        if not removed and first is None:  # a long digit run in a string: the strict decode stands
            return SAMPLE.decode(data)  # type: ignore[no-any-return]
    enc = msgspec.msgpack.encode if packed else msgspec.json.encode
    err = first
    for attempt in range(MAX_REMOVED + 1):
        try:
            sample: Sample = SAMPLE.decode(enc(obj))
        except ContractError as exc:
            err = exc
            path = _path(exc.field) if exc.invalid_value else None
            if path is None or len(removed) >= MAX_REMOVED or exc.reason.startswith("Object contains unknown field"):
                raise _give_up(first, exc, removed) from None
            target: list[str | int] | None = path
            if exc.reason.startswith("Object missing required field"):
                target = _enclosing_item(path)
            if target is None or not _remove(obj, target):
                raise _give_up(first, exc, removed) from None
            removed.append(f"{_fmt(target)}: {exc.reason}")
            continue
        if attempt == 0 and first is not None and not removed:
            raise first  # what failed is not in the generic decode (a duplicate key): no salvage
        break
    else:
        raise _give_up(first, err or ContractError(SAMPLE.kind, "too many invalid fields"), removed) from None
    room = 64 - len(sample.source_errors)
    notes = [SourceError(source=CONTRACT_SOURCE, error=f"{r[:8000]}; removed") for r in removed[:room]]
    if len(removed) > room > 0:
        notes[-1] = SourceError(source=CONTRACT_SOURCE, error=f"{len(removed) - room + 1} more invalid field(s) removed")
    sample.source_errors = [*sample.source_errors, *notes]
    return sample


def removed_fields(sample: Sample) -> list[str]:
    """What the receiver removed from this sample (empty for nearly every sample)."""
    return [e.error for e in sample.source_errors if e.source == CONTRACT_SOURCE] if sample.source_errors else []
