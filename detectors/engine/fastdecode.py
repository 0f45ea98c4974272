"""Incremental per-host telemetry decoding: same contract as ``decode_sample``, less work.

A host's consecutive samples repeat most of their bytes: the NVLink arrays, ECC, PCIe, remapped
rows of every GPU, the InfiniBand ports, AER devices and EDAC controllers are byte-identical to the
previous poll ~97-99% of the time; what moves is ts, seq and the GPU gauges. The strict decoder
still has to parse, validate and allocate all of it (~45 µs for a 13.5 KiB 8-GPU sample).

:class:`IncrementalDecoder` decodes an *envelope* built from the schema's own types: every scalar
keeps its type and ``Meta`` constraints, but the heavy sub-objects (``gpus[i].ecc`` / ``pcie`` /
``nvlink`` / ..., and the ``net_ports`` / ``aer`` / ``edac`` lists) are kept as ``msgspec.Raw``
bytes. Each Raw is compared with the same host's previous bytes at the same position; an identical
one reuses the previously decoded object, a changed one is decoded by a strict sub-decoder for the
schema's own field type. The result is built from the schema's ``Sample`` / ``GpuSample`` types.
The usual sample (99.5 % on a 256-host recording) changes nothing but gauges and the envelope's
scalars, so it is found with one bytes compare: the encoded list of every GPU's fields but the
gauges (stable scalars and sub-object Raws) and the sample's Raws, against the host's previous
one; its GPUs are then the previous sample's with the new gauges. One object touched where the
fields and the Raws' views into older messages are a hundred: at 256 hosts all of it is cold in
the CPU caches, and the misses were the cost, not the Python steps. Otherwise GPU by GPU and part
by part, as above.

Why the result is the value ``decode_sample`` gives, and its errors are the same:

* the envelope is accepted only when re-encoding it gives back the input bytes exactly. The
  producers (``schema.encode`` / ``encode_packed``) write that canonical form, and it has no
  duplicate keys, so every Raw is the one occurrence the strict decoder would have read, at the
  same place (a duplicated ``"gpus"`` whose first value is invalid must stay an error);
* a sub-object is a context-free value: decoding its bytes alone gives what decoding it in place
  gives; identical bytes give an equal value;
* anything unusual — not canonical, an envelope or sub-object that fails, a ``str``/buffer of the
  wrong kind, a message over the size limit — goes to :func:`fleethealth.schema.decode_sample`,
  so a bad message raises the very same :class:`ContractError`, naming the field.

Shared objects: consecutive samples of a host share the unchanged sub-objects (and their lists).
msgspec structs are mutable, so nothing downstream may mutate a decoded sample — the detectors do
not (``tests/detectors/test_fastdecode.py`` feeds the engine, ML included, and checks every cached
object still equals a fresh decode of its bytes: :meth:`IncrementalDecoder.check_cache`).

msgpack: the byte template, tried first. A host's consecutive msgpack samples almost always have the
same length, and every byte but the values of ts, seq and the GPU gauges is the same (99.4 % of
samples on a 256-host recording; a float is 9 bytes whatever its value). So from a message P the
envelope path decoded, the host keeps a *template*: P's bytes with a hole at each such value (a
fixed-width number, type byte included, or a positive fixint), and P's sample. A
new message D of P's length whose bytes outside the holes are P's (one join of the template with D's
hole bytes, one compare), whose holes keep P's type bytes (or a byte 0x00-0x7f where P had a fixint),
is P's sample with those fields replaced by one decode of D's hole bytes as a tuple of the fields'
own annotated types. Anything else (another length, another byte, a value its field refuses: NaN,
out of range, a type byte that changed) goes to the envelope path above, which decides as before.
Why D's strict decode is that sample, or the same error:

* msgpack is read left to right, and a value's type byte (with, for strings and containers, the
  length after it) says how many bytes and items follow. Up to the first hole D is P; a hole holds
  a number of the width its type byte gives, the same width in D as in P (the same type byte, or a
  fixint: one byte); so the strict decoder reaches every byte of D at the same place in the same
  item as in P: the same maps with the same keys in the same order (P's: canonical, no duplicate),
  the same values, but at the holes. Each hole is then the value of the field whose key precedes
  it, decoded context-free: the tuple element of that field's type decodes the same bytes the same
  way (int to float, the Meta bounds, -0.0 kept) or refuses them as the strict decoder would.
* P's sample is ``decode_sample(P)`` (no salvage: the envelope path took no fallback), and no rule
  of the schema ties one field to another, so the strict decode of D is P's with the holes'
  fields replaced, and a message the template refuses is decided by the path that decided before.
* The template found for D is the one filed under D's host bytes (a hint: any other template
  differs from D in the host's bytes, which lie outside the holes, and is refused).

The base (:attr:`IncrementalDecoder.base`): P and every sample built on P's template share one
token, and differ in nothing but ts, seq and the GPUs' gauges, every other field holding P's very
object (the builder replaces only those). ``DetectorEngine.feed(sample, base)`` uses it to skip the
GPU gates' snapshot compares a sample with the last one's base proves unchanged (same findings:
tests/detectors/test_codegen.py); any other path gives None.

Memory: per host, the Raw views keep the previous message buffer alive (one message per host, as
large as a sample), and the signature (about the sample's size without its gauges; JSON only: the
template stands in for it on msgpack) or the template (P's bytes, its sample); ``max_hosts``
bounds the hosts kept (least recently seen dropped first), and :meth:`forget` drops one (a
partition moved away).
"""

from __future__ import annotations

import struct
import typing
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Annotated, Any

import msgspec
from msgspec import Raw

from fleethealth.salvage import has_long_digits
from fleethealth.schema import MAX_MESSAGE_BYTES, U64_MAX, GpuSample, Sample, decode_sample

# Sample fields decoded as Raw, whole (each a list, identical ~97% of the time).
SAMPLE_RAW = ("net_ports", "aer", "edac")
# What the envelope holds for a lazily decoded field the message leaves out. 0xC1 starts no JSON
# value (it is no UTF-8 byte) and no msgpack value (the one type byte msgpack never uses), so in the
# encoding of a tuple of such fields every element's extent is unambiguous: two tuples encode to the
# same bytes only when their elements do (the per-GPU signature below relies on it).
ABSENT = Raw(b"\xc1")


def _has_struct(t: Any) -> bool:
    """A struct, a list of structs, a dict, an optional one, possibly Annotated: decoded lazily,
    compared as bytes (so equal-but-different values like -0.0 vs 0.0 in an event never alias; a
    left-out dict costs no empty dict in the envelope)."""
    if isinstance(t, type) and issubclass(t, msgspec.Struct) or typing.get_origin(t) is dict:
        return True
    return any(_has_struct(a) for a in typing.get_args(t) if not isinstance(a, msgspec.Meta))


def _has_float(t: Any) -> bool:
    if t is float:
        return True
    return any(_has_float(a) for a in typing.get_args(t) if not isinstance(a, msgspec.Meta))


def _default(f: msgspec.structs.FieldInfo) -> Any:
    return f.default_factory() if f.default is msgspec.NODEFAULT else f.default


@dataclass(frozen=True, slots=True)
class _Part:
    """One field decoded lazily: its strict decoders (the schema's own annotated type)."""

    name: str
    json: msgspec.json.Decoder[Any]
    msgpack: msgspec.msgpack.Decoder[Any]
    default: msgspec.structs.FieldInfo


def _parts(cls: type[msgspec.Struct], names: tuple[str, ...]) -> tuple[_Part, ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    by = {f.name: f for f in msgspec.structs.fields(cls)}
    return tuple(_Part(n, msgspec.json.Decoder(hints[n]), msgspec.msgpack.Decoder(hints[n]), by[n]) for n in names)


def _envelope(cls: type[msgspec.Struct], raw: tuple[str, ...], replace: dict[str, Any]) -> Any:
    """``cls`` with the ``raw`` fields as Raw (absent = ABSENT) and ``replace`` types swapped in;
    every other field keeps the schema's annotated type and default, in the schema's order."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields: list[Any] = []
    for f in msgspec.structs.fields(cls):
        if f.name in raw:
            fields.append((f.name, Raw, ABSENT))
            continue
        t = replace.get(f.name, hints[f.name])
        fields.append((f.name, t) if f.required else (f.name, t, msgspec.field(default_factory=f.default_factory)
                                                      if f.default is msgspec.NODEFAULT else f.default))
    cfg = cls.__struct_config__
    return msgspec.defstruct(f"_Envelope{cls.__name__}", fields, kw_only=True, omit_defaults=cfg.omit_defaults,
                             forbid_unknown_fields=cfg.forbid_unknown_fields, gc=False)


def _swap_item(hint: Any, item: Any) -> Any:
    """``Annotated[list[X], Meta...]`` -> ``Annotated[list[item], Meta...]`` (same constraints)."""
    base, *metas = typing.get_args(hint)
    assert typing.get_origin(base) is list, hint
    return Annotated[(list[item], *metas)] if metas else list[item]  # type: ignore[valid-type]


_GPU_FIELDS = msgspec.structs.fields(GpuSample)
_GPU_HINTS = typing.get_type_hints(GpuSample, include_extras=True)
GPU_RAW = tuple(f.name for f in _GPU_FIELDS if _has_struct(_GPU_HINTS[f.name]))
GPU_GAUGES = tuple(f.name for f in _GPU_FIELDS if f.name not in GPU_RAW and _has_float(_GPU_HINTS[f.name]))
GPU_STABLE = tuple(f.name for f in _GPU_FIELDS if f.name not in GPU_RAW and f.name not in GPU_GAUGES)

_GpuEnvelope = _envelope(GpuSample, GPU_RAW, {})
_SampleEnvelope = _envelope(Sample, SAMPLE_RAW,
                            {"gpus": _swap_item(typing.get_type_hints(Sample, include_extras=True)["gpus"], _GpuEnvelope)})
_GPU_PARTS = _parts(GpuSample, GPU_RAW)
_SAMPLE_PARTS = _parts(Sample, SAMPLE_RAW)



def _getter(names: tuple[str, ...]) -> Any:
    """A tuple of attributes, in C (attrgetter of one name would return it bare)."""
    return attrgetter(*names) if len(names) > 1 else (lambda o: (getattr(o, names[0]),))


def _builders() -> dict[str, Any]:
    """Constructors with literal keyword names, generated from the schema's field lists: msgspec
    builds a struct from literal keywords ~5x faster than from a ``**dict``."""
    def kw(names: tuple[str, ...], src: str) -> str:
        return ", ".join(f"{n}={src}.{n}" for n in names)
    gpu_new = ", ".join([kw(GPU_STABLE, "g"), kw(GPU_GAUGES, "g"), *(f"{n}=o[{i}]" for i, n in enumerate(GPU_RAW))])
    plain = tuple(n for n in Sample.__struct_fields__ if n != "gpus" and n not in SAMPLE_RAW)
    sample_new = ", ".join([kw(plain, "e"), "gpus=gpus", *(f"{n}=o[{i}]" for i, n in enumerate(SAMPLE_RAW))])
    src = (f"def gpu_gauges(prev, g):\n    return replace(prev, {kw(GPU_GAUGES, 'g')})\n"
           f"def gpu_new(g, o):\n    return GpuSample({gpu_new})\n"
           f"def sample_new(e, gpus, o):\n    return Sample({sample_new})\n")
    ns: dict[str, Any] = {"replace": msgspec.structs.replace, "GpuSample": GpuSample, "Sample": Sample}
    exec(compile(src, "<fastdecode builders>", "exec"), ns)  # noqa: S102 - names come from the schema
    return ns


def _key_fn() -> Any:
    """A GPU's fields but the gauges, as one tuple (literal attribute reads: twice as fast as an
    ``attrgetter`` of 19 names or slices of ``astuple``)."""
    names = [f.name for f in _GPU_FIELDS if f.name not in GPU_GAUGES]
    src = f"def gpu_key(g):\n    return ({', '.join(f'g.{n}' for n in names)},)\n"
    ns: dict[str, Any] = {}
    exec(compile(src, "<fastdecode key>", "exec"), ns)  # noqa: S102 - names come from the schema
    return ns["gpu_key"]


_gpu_key = _key_fn()  # everything but the gauges
_gpu_raw = _getter(GPU_RAW)
_sample_raw = _getter(SAMPLE_RAW)
_B = _builders()
_gpu_with_gauges, _gpu_new, _sample_new = _B["gpu_gauges"], _B["gpu_new"], _B["sample_new"]


# ------------------------------------------------------------------ the byte-template path (msgpack)

# Fields whose value moves in the usual sample: the envelope's and every GPU's (the gauges).
FAST_SAMPLE = ("ts", "seq")
FAST_GPU = GPU_GAUGES
_SAMPLE_HINTS = typing.get_type_hints(Sample, include_extras=True)
# msgpack type bytes of fixed-width numbers -> the value's width (type byte included): float32/64,
# uint8-64, int8-64. The type byte alone gives the width; a positive fixint (0x00-0x7f) is its own
# type byte and value (width 1). Every other value (str, nil, bool, containers) is left as bytes.
_NUM_WIDTH = {0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9, 0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9}
# the width of a scalar whose type byte gives it (fixints, nil, bools, fixstr, numbers); 0: other
_SCALAR_WIDTH = tuple(1 if t < 0x80 or t >= 0xE0 or t in (0xC0, 0xC2, 0xC3) else 1 + (t & 0x1F) if 0xA0 <= t <= 0xBF
                      else _NUM_WIDTH.get(t, 0) for t in range(256))
_MAX_SHAPES = 512  # distinct (fields, GPU count) layouts with a compiled decoder and builder


def _map_len(data: bytes, pos: int) -> tuple[int, int]:
    t = data[pos]
    if 0x80 <= t <= 0x8F:
        return t & 0x0F, pos + 1
    if t == 0xDE:
        return int.from_bytes(data[pos + 1:pos + 3], "big"), pos + 3
    raise _Fallback  # map32: no sample is that large


def _array_len(data: bytes, pos: int) -> tuple[int, int]:
    t = data[pos]
    if 0x90 <= t <= 0x9F:
        return t & 0x0F, pos + 1
    if t == 0xDC:
        return int.from_bytes(data[pos + 1:pos + 3], "big"), pos + 3
    raise _Fallback


def _array_head(n: int) -> bytes:
    return bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big")


def _host_key(data: bytes) -> bytes | None:
    """The host value's bytes (a hint for the candidate base; the byte compare decides)."""
    # first the producers' layout: a map16 (msgspec writes a struct as one), "host" first, a fixstr
    t = data[8] if data[:1] == b"\xde" and data[3:8] == b"\xa4host" and len(data) > 9 else 0
    if 0xA0 <= t <= 0xBF:
        return data[8:9 + (t & 0x1F)]
    at = 1 if data[0] != 0xDE else 3
    if data[at:at + 5] != b"\xa4host" or len(data) < at + 7:
        return None
    t = data[at + 5]
    if 0xA0 <= t <= 0xBF:
        return data[at + 5:at + 6 + (t & 0x1F)]
    if t == 0xD9:
        return data[at + 5:at + 7 + data[at + 6]]
    return None


_shapes: dict[tuple[Any, ...], tuple[Any, Any]] = {}
_getters: dict[tuple[int, ...], tuple[Any, Any]] = {}  # the values' places -> their readers (shared)
_MAX_GETTERS = 4096


def _shape(names: tuple[tuple[int, str], ...], ngpus: int) -> tuple[Any, Any]:
    """A tuple decoder of the fields' own annotated types (their Meta constraints included) and a
    builder ``build(prev, *values) -> Sample`` with those fields replaced, for one layout (the
    values its parameters: a local each, not an index into the tuple)."""
    got = _shapes.get((names, ngpus))
    if got is not None:
        return got
    types = tuple(_SAMPLE_HINTS[n] if g < 0 else _GPU_HINTS[n] for g, n in names)
    dec = msgspec.msgpack.Decoder(tuple.__class_getitem__(types))  # type: ignore[attr-defined]
    top = [f"{n}=v{i}" for i, (g, n) in enumerate(names) if g < 0]
    per: list[list[str]] = [[] for _ in range(ngpus)]
    for i, (g, n) in enumerate(names):
        if g >= 0:
            per[g].append(f"{n}=v{i}")
    gpus = ", ".join(f"replace(g[{j}], {', '.join(kw)})" if kw else f"g[{j}]" for j, kw in enumerate(per))
    params = "".join(f", v{i}" for i in range(len(names)))
    src = (f"def build(s{params}):\n    g = s.gpus\n"
           f"    return replace(s, {', '.join([*top, f'gpus=[{gpus}]'])})\n")
    ns: dict[str, Any] = {"replace": msgspec.structs.replace}
    exec(compile(src, "<fastdecode template builder>", "exec"), ns)  # noqa: S102 - names come from the schema
    got = (dec, ns["build"])
    if len(_shapes) < _MAX_SHAPES:
        _shapes[(names, ngpus)] = got
    return got


@dataclass(slots=True, eq=False)
class _Template:
    """One msgpack message P of a host (decoded by the envelope path to ``sample``) as constant
    bytes around the values that move: ``parts`` is P's bytes with ``None`` at each such value
    (filled in with the new message's values, joined and compared with it)."""

    host: str
    size: int
    parts: list[bytes | None]
    values: Any  # the values' bytes, a tuple (one ``struct`` unpack: no slice object per value)
    types: Any  # the fixed-width values' type bytes, a tuple of ints (positions ``typepos``)
    typebytes: tuple[int, ...]
    fixint: tuple[int, ...]  # indexes (into the values) of positive fixints: any byte 0x00-0x7f
    head: bytes  # array header of the values
    decode: Any
    build: Any
    sample: Sample
    reused: int  # sub-objects a sample built on it shares (the statistics' "reused")
    given: bytes  # P's own values (head included), for check_cache
    key: bytes = b""  # the host value's bytes in P: where the decoder files it
    # P's and every sample built on it (IncrementalDecoder.base): a small object of its own, so that
    # an engine holding it keeps no old template alive
    token: object = field(default_factory=object)


def _template(data: bytes, env: Any, sample: Sample) -> _Template | None:
    """Walk P's top-level map and GPU maps (a canonical message the envelope decoded: each value's
    bytes are its canonical encoding, a Raw's bytes for a sub-object) and note where the moving
    values lie. None when there is nothing to gain (no such value) or a layout it does not know."""
    encode = msgspec.msgpack.Encoder().encode
    spans: list[tuple[int, int, int, str]] = []  # (start, end, GPU or -1, field)

    def value(obj: Any, name: str, pos: int, raws: tuple[str, ...], moving: tuple[str, ...], gpu: int) -> int:
        if name in raws:
            return pos + len(getattr(obj, name))
        t = data[pos]
        if name in moving and (t < 0x80 or t in _NUM_WIDTH):
            width = _SCALAR_WIDTH[t]
            spans.append((pos, pos + width, gpu, name))
            return pos + width
        return pos + (_SCALAR_WIDTH[t] or len(encode(getattr(obj, name))))

    def key(pos: int) -> tuple[str, int]:
        t = data[pos]
        if not 0xA0 <= t <= 0xBF:
            raise _Fallback
        end = pos + 1 + (t & 0x1F)
        return data[pos + 1:end].decode(), end

    try:
        n, pos = _map_len(data, 0)
        for _ in range(n):
            name, pos = key(pos)
            if name != "gpus":
                pos = value(env, name, pos, SAMPLE_RAW, FAST_SAMPLE, -1)
                continue
            m, pos = _array_len(data, pos)
            if m != len(env.gpus):
                return None
            for i, g in enumerate(env.gpus):
                k, pos = _map_len(data, pos)
                for _ in range(k):
                    gname, pos = key(pos)
                    pos = value(g, gname, pos, GPU_RAW, FAST_GPU, i)
    except (_Fallback, IndexError, UnicodeDecodeError, AttributeError, TypeError, ValueError):  # no template
        return None
    if pos != len(data) or len(spans) < 2:
        return None
    parts: list[bytes | None] = []
    at = 0
    typepos, typebytes, fixint = [], [], []
    for j, (a, b, _, _) in enumerate(spans):
        parts += [data[at:a], None]
        at = b
        if data[a] < 0x80:
            fixint.append(j)
        else:
            typepos.append(a)
            typebytes.append(data[a])
    parts.append(data[at:])
    if len(typepos) < 2:
        return None
    dec, build = _shape(tuple((g, n) for _, _, g, n in spans), len(env.gpus))
    where = (*(x for a, b, _, _ in spans for x in (a, b)), -1, *fixint)  # what the two getters are made of
    getters = _getters.get(where)  # hosts of one make and model have the values at the same places
    if getters is None:
        getters = _readers([(a, b) for a, b, _, _ in spans], typepos)
        if len(_getters) < _MAX_GETTERS:
            _getters[where] = getters
    values, types = getters
    head = _array_head(len(spans))
    return _Template(env.host, len(data), parts, values, types, tuple(typebytes), tuple(fixint),
                     head, dec.decode, build, sample, len(env.gpus) * len(GPU_RAW) + len(SAMPLE_RAW),
                     head + b"".join(values(data)))


def _readers(spans: list[tuple[int, int]], typepos: list[int]) -> tuple[Any, Any]:
    """``values(data)``: the bytes of each span, ``types(data)``: the byte at each position, as
    tuples, each one ``struct`` unpack (what ``itemgetter`` of slices and of indexes gives, without
    a slice object, its index checks and a call per value: a third of the template's cost)."""
    fmt, at = [">"], 0
    for a, b in spans:
        fmt.append(f"{a - at}x{b - a}s")
        at = b
    tfmt, at = [">"], 0
    for a in typepos:
        tfmt.append(f"{a - at}xB")
        at = a + 1
    return struct.Struct("".join(fmt)).unpack_from, struct.Struct("".join(tfmt)).unpack_from


def _template_bytes(tpl: _Template) -> bytes:
    """P again, from the constant parts and P's own values (check_cache)."""
    widths = iter(_NUM_WIDTH[t] for t in tpl.typebytes)
    fix = set(tpl.fixint)
    at = len(tpl.head)
    out = []
    for i, part in enumerate(tpl.parts):
        if i % 2 == 0:
            out.append(part)
            continue
        w = 1 if i // 2 in fix else next(widths)
        out.append(tpl.given[at:at + w])
        at += w
    return b"".join(out)  # type: ignore[arg-type]


class _Fallback(Exception):
    """Internal: take the strict path."""


@dataclass(slots=True)
class _GpuEntry:
    key: tuple[Any, ...]  # stable fields + sub-object Raws: all but the gauges
    raws: tuple[Any, ...]
    objs: tuple[Any, ...]
    out: GpuSample  # built on them (its gauges may be older than the host's last sample's)


@dataclass(slots=True)
class _HostEntry:
    gpus: list[_GpuEntry | None]  # per GPU position
    packed: bool
    raws: tuple[Any, ...] | None = None
    objs: tuple[Any, ...] = ()
    # the encoded list of every GPU's key and ``raws``: one compare finds a sample in which only the
    # gauges moved, and ``outs`` (the last sample's GPUs) are then the bases for the new gauges
    sig: bytes = b""
    outs: list[GpuSample] = field(default_factory=list)
    tpl: _Template | None = None  # the byte template of its last msgpack sample the envelope path decoded


@dataclass(slots=True)
class DecodeStats:
    samples: int = 0
    fallbacks: int = 0  # decoded by the strict decoder (non-canonical bytes, bad message, ...)
    reused: int = 0  # sub-objects taken from the cache
    decoded: int = 0  # sub-objects decoded because their bytes changed
    templated: int = 0  # msgpack samples built from the host's byte template (all but moving values equal)


def _decode_part(part: _Part, raw: Any, packed: bool) -> Any:
    if raw is ABSENT:
        return _default(part.default)
    if not packed and has_long_digits(raw):  # maybe an integer past 2**64-1: decode_sample removes it
        raise _Fallback
    try:
        return (part.msgpack if packed else part.json).decode(raw)
    except (msgspec.MsgspecError, RecursionError):
        raise _Fallback from None


class IncrementalDecoder:
    """``decode_sample`` with per-host reuse of unchanged sub-objects. Not thread-safe (one per
    worker). ``decoder.decode(data)`` (or ``decoder(data)``) -> Sample or ContractError."""

    def __init__(self, max_hosts: int = 100_000, templates: bool = True) -> None:
        self.max_hosts = max_hosts
        self.templates = templates  # msgpack: the byte-template path first (False: as before it, for tests)
        self.stats = DecodeStats()
        self._hosts: dict[str, _HostEntry] = {}
        self._json = (msgspec.json.Decoder(_SampleEnvelope), msgspec.json.Encoder())
        self._msgpack = (msgspec.msgpack.Decoder(_SampleEnvelope), msgspec.msgpack.Encoder())
        self._buf = bytearray()  # the canonical re-encoding, written in place: no 14 KB bytes a sample
        self._fast: dict[bytes, _Template] = {}  # host value's bytes -> its template (hosts in _hosts only)
        # the last decoded sample's base (None: none): samples with one base are P and those built
        # on P's template, which differ from P in nothing but ts, seq and the GPUs' gauges, all their
        # other fields holding P's very objects (DetectorEngine.feed skips comparing those)
        self.base: object = None

    def __call__(self, data: bytes | str) -> Sample:
        return self.decode(data)

    def decode(self, data: bytes | str) -> Sample:
        self.stats.samples += 1
        # Raw keeps a view of the input: only an immutable bytes object may be cached
        if type(data) is not bytes or len(data) > MAX_MESSAGE_BYTES or not data:
            self.stats.fallbacks += 1
            self.base = None
            return decode_sample(data)
        packed = 0x80 <= data[0] <= 0x8F or data[0] in (0xDE, 0xDF)  # as schema._Codec.decode
        if packed and self._fast:  # empty unless self.templates
            key = _host_key(data)
            tpl = self._fast.get(key) if key is not None else None
            if tpl is not None and len(data) == tpl.size:
                got = self._from_template(tpl, data)
                if got is not None:
                    self.base = tpl.token
                    return got
        self.base = None
        dec, enc = self._msgpack if packed else self._json
        try:
            env = dec.decode(data)
            buf = self._buf
            enc.encode_into(env, buf)
            if buf != data:  # not canonical: duplicate keys are possible
                raise _Fallback
            if env.seq > U64_MAX:  # the envelope's other integers are bounded by the schema, but
                raise _Fallback    # for clocks_event_reasons (checked per changed GPU below)
            sample = self._assemble(env, packed, enc.encode)
        except (msgspec.MsgspecError, RecursionError, _Fallback):
            self.stats.fallbacks += 1
            return decode_sample(data)
        if packed and self.templates:
            tpl = self._retemplate(data, env, sample)
            if tpl is not None:
                self.base = tpl.token  # P: the sample its template builds on
        return sample

    def _from_template(self, tpl: _Template, data: bytes) -> Sample | None:
        """The host's template with the new values, or None (then the envelope path decides)."""
        vals = tpl.values(data)
        if tpl.types(data) != tpl.typebytes:  # a fixed-width value that changed type or width
            return None
        for j in tpl.fixint:
            if vals[j][0] > 0x7F:  # no longer a positive fixint: another width
                return None
        parts = tpl.parts
        parts[1::2] = vals
        if b"".join(parts) != data:  # type: ignore[arg-type]  # a byte outside the values moved
            return None
        try:
            v = tpl.decode(tpl.head + b"".join(vals))
        except msgspec.MsgspecError:  # a value its field refuses (NaN, out of range, a str, ...)
            return None
        sample: Sample = tpl.build(tpl.sample, *v)
        hosts = self._hosts
        hosts[tpl.host] = hosts.pop(tpl.host)  # least recently seen first, as in _assemble
        st = self.stats
        st.templated += 1
        st.reused += tpl.reused
        return sample

    def _retemplate(self, data: bytes, env: Any, sample: Sample) -> _Template | None:
        he = self._hosts.get(env.host)
        if he is None:
            return None
        self._drop(he)
        tpl = _template(data, env, sample)
        key = _host_key(data)
        if tpl is None or key is None:
            return None
        other = self._fast.get(key)  # only where the hint is not the host (tests): that host loses it
        if other is not None:
            self._drop(self._hosts.get(other.host))
        tpl.key = key
        he.tpl = self._fast[key] = tpl
        return tpl

    def _drop(self, he: _HostEntry | None) -> None:
        """Drop a host's template (kept only while the host is kept)."""
        if he is not None and he.tpl is not None:
            if self._fast.get(he.tpl.key) is he.tpl:
                del self._fast[he.tpl.key]
            he.tpl = None

    def _assemble(self, env: Any, packed: bool, encode: Any) -> Sample:
        host = env.host
        hosts = self._hosts
        he = hosts.pop(host, None)  # re-inserted last: dict order is least recently seen first
        if he is None or he.packed != packed:  # same bytes never mean one value in both formats,
            he = _HostEntry([], packed, tpl=he.tpl if he else None)  # but a host switching formats
            if len(hosts) >= self.max_hosts:                       # starts afresh anyway
                self._drop(hosts.pop(next(iter(hosts))))
        try:
            envg = env.gpus
            keys = list(map(_gpu_key, envg))
            raws = _sample_raw(env)
            keys.append(raws)
            sig = encode(keys) if not packed or not self.templates else b""  # msgpack: the template
            if sig and sig == he.sig:  # the usual case (99.5 %): only the gauges, ts, seq, ... moved
                he.outs = gpus = list(map(_gpu_with_gauges, he.outs, envg))
                self.stats.reused += len(envg) * len(GPU_RAW) + len(raws)
            else:
                he.sig = b""  # until outs, objs and every entry agree again (check_cache tests it)
                gpus = self._changed(he, envg, keys, raws, packed)
                he.outs, he.sig = gpus, sig
        finally:  # entries already updated map bytes to their strict decode: keep them
            hosts[host] = he
        return _sample_new(env, gpus, he.objs)  # type: ignore[no-any-return]

    def _changed(self, he: _HostEntry, envg: list[Any], keys: list[Any], raws: tuple[Any, ...],
                 packed: bool) -> list[GpuSample]:
        """Something but the gauges changed: compare GPU by GPU and part by part."""
        gcache = he.gpus
        n = len(envg)
        if len(gcache) != n:
            del gcache[n:]
            gcache.extend([None] * (n - len(gcache)))
        gpus = []
        hits = 0
        for i, (g, ent) in enumerate(zip(envg, gcache, strict=True)):
            key = keys[i]
            if ent is not None and ent.key == key:  # only its gauges moved
                hits += 1
                out = _gpu_with_gauges(ent.out, g)
            else:
                if (g.clocks_event_reasons or 0) > U64_MAX:
                    raise _Fallback
                graws = _gpu_raw(g)
                objs = self._parts(_GPU_PARTS, graws, ent.raws if ent else None, ent.objs if ent else (), packed)
                out = _gpu_new(g, objs)
                gcache[i] = _GpuEntry(key, graws, objs, out)
            gpus.append(out)
        self.stats.reused += hits * len(GPU_RAW)
        if he.raws == raws:
            self.stats.reused += len(raws)
        else:
            he.objs = self._parts(_SAMPLE_PARTS, raws, he.raws, he.objs, packed)
            he.raws = raws
        return gpus

    def _parts(self, parts: tuple[_Part, ...], raws: tuple[Any, ...], old_raws: tuple[Any, ...] | None,
               old: tuple[Any, ...], packed: bool) -> tuple[Any, ...]:
        out = []
        for j, (part, raw) in enumerate(zip(parts, raws, strict=True)):
            if old_raws is not None and old_raws[j] == raw:
                out.append(old[j])
                self.stats.reused += 1
            else:
                out.append(_decode_part(part, raw, packed))
                self.stats.decoded += 1
        return tuple(out)

    # ------------------------------------------------------------------ cache management

    def forget(self, host: str) -> None:
        """Drop a host's cached sub-objects (its partition moved to another worker)."""
        self._drop(self._hosts.pop(host, None))

    def clear(self) -> None:
        self._hosts.clear()
        self._fast.clear()

    def __len__(self) -> int:
        return len(self._hosts)

    def check_cache(self) -> list[str]:
        """Every cached object against a fresh strict decode of its cached bytes: the paths that
        differ (something downstream mutated a shared object). Empty when the cache is sound."""
        bad = []
        for host, he in self._hosts.items():
            tpl = he.tpl
            if tpl is not None and (self._fast.get(tpl.key) is not tpl or tpl.sample != decode_sample(
                    _template_bytes(tpl)) or tpl.build(tpl.sample, *tpl.decode(tpl.given)) != tpl.sample):
                bad.append(f"{host}: template")
            if he.sig and (len(he.outs) != len(he.gpus) or any(  # the bases of the next gauges
                    e is None or _gpu_with_gauges(o, e.out) != e.out for o, e in zip(he.outs, he.gpus, strict=False))):
                bad.append(f"{host}: gpus")
            entries = [(f"gpus[{i}]", _GPU_PARTS, e.raws, e.objs) for i, e in enumerate(he.gpus) if e is not None]
            if he.raws is not None:
                entries.append(("", _SAMPLE_PARTS, he.raws, he.objs))
            for where, parts, raws, objs in entries:
                for part, raw, obj in zip(parts, raws, objs, strict=True):
                    if raw is ABSENT:
                        fresh = _default(part.default)
                    else:
                        fresh = (part.msgpack if he.packed else part.json).decode(raw)
                    if fresh != obj:
                        bad.append(f"{host}: {where}.{part.name}".replace(": .", ": "))
        return bad
