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

Memory: per host, the Raw views keep the previous message buffer alive (one message per host, as
large as a sample), and the signature (about the sample's size without its gauges); ``max_hosts`` bounds the hosts kept (least recently seen dropped first), and
:meth:`forget` drops one (a partition moved away).
"""

from __future__ import annotations

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


@dataclass(slots=True)
class DecodeStats:
    samples: int = 0
    fallbacks: int = 0  # decoded by the strict decoder (non-canonical bytes, bad message, ...)
    reused: int = 0  # sub-objects taken from the cache
    decoded: int = 0  # sub-objects decoded because their bytes changed


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

    def __init__(self, max_hosts: int = 100_000) -> None:
        self.max_hosts = max_hosts
        self.stats = DecodeStats()
        self._hosts: dict[str, _HostEntry] = {}
        self._json = (msgspec.json.Decoder(_SampleEnvelope), msgspec.json.Encoder())
        self._msgpack = (msgspec.msgpack.Decoder(_SampleEnvelope), msgspec.msgpack.Encoder())
        self._buf = bytearray()  # the canonical re-encoding, written in place: no 14 KB bytes a sample

    def __call__(self, data: bytes | str) -> Sample:
        return self.decode(data)

    def decode(self, data: bytes | str) -> Sample:
        self.stats.samples += 1
        # Raw keeps a view of the input: only an immutable bytes object may be cached
        if type(data) is not bytes or len(data) > MAX_MESSAGE_BYTES or not data:
            self.stats.fallbacks += 1
            return decode_sample(data)
        packed = 0x80 <= data[0] <= 0x8F or data[0] in (0xDE, 0xDF)  # as schema._Codec.decode
        dec, enc = self._msgpack if packed else self._json
        try:
            env = dec.decode(data)
            buf = self._buf
            enc.encode_into(env, buf)
            if buf != data:  # not canonical: duplicate keys are possible
                raise _Fallback
            if env.seq > U64_MAX:  # the envelope's other integers are bounded by the schema, but
                raise _Fallback    # for clocks_event_reasons (checked per changed GPU below)
            return self._assemble(env, packed, enc.encode)
        except (msgspec.MsgspecError, RecursionError, _Fallback):
            self.stats.fallbacks += 1
            return decode_sample(data)

    def _assemble(self, env: Any, packed: bool, encode: Any) -> Sample:
        host = env.host
        hosts = self._hosts
        he = hosts.pop(host, None)  # re-inserted last: dict order is least recently seen first
        if he is None or he.packed != packed:  # same bytes never mean one value in both formats,
            he = _HostEntry([], packed)        # but a host switching formats starts afresh anyway
            if len(hosts) >= self.max_hosts:
                del hosts[next(iter(hosts))]
        try:
            envg = env.gpus
            keys = list(map(_gpu_key, envg))
            raws = _sample_raw(env)
            keys.append(raws)
            sig = encode(keys)
            if sig == he.sig:  # the usual case (99.5 %): only the gauges, ts, seq, ... moved
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
        self._hosts.pop(host, None)

    def clear(self) -> None:
        self._hosts.clear()

    def __len__(self) -> int:
        return len(self._hosts)

    def check_cache(self) -> list[str]:
        """Every cached object against a fresh strict decode of its cached bytes: the paths that
        differ (something downstream mutated a shared object). Empty when the cache is sound."""
        bad = []
        for host, he in self._hosts.items():
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
