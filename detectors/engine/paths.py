"""Paths into a telemetry sample, compiled once into fast getters.

A rule names the value it reads with a path such as ``gpus[*].ecc.dram_uncorrected_volatile``:
a *scope* (the repeated component it walks: ``gpus[*]``, ``gpus[*].nvlink[*]``, ``net_ports[*]``,
``aer[*]``, ``edac[*]``, ``edac[*].dimms[*]``, or the host itself) and the attribute chain inside
one element of that scope. Dict-valued fields take a key (``net_ports[*].counters.symbol_error``)
or ``#total`` (``aer[*].fatal.#total``: the kernel's ``TOTAL_ERR_*`` entry, else the sum).

Compilation turns the chain into a closure so that evaluation costs a few attribute loads.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from fleethealth.ids import normalise_pci as _normalise_pci
from fleethealth.schema import (
    AerDevice,
    EdacDimm,
    EdacMc,
    GpuSample,
    NetPort,
    NvlinkCounters,
    Sample,
)

Getter = Callable[[Any], Any]


class PathError(ValueError):
    """A path that does not name a field of the telemetry sample."""


# scope name -> (struct type of one element, prefix in paths)
SCOPES: dict[str, tuple[type, str]] = {
    "host": (Sample, ""),
    "gpu": (GpuSample, "gpus[*]"),
    "nvlink": (NvlinkCounters, "gpus[*].nvlink[*]"),
    "net_port": (NetPort, "net_ports[*]"),
    "aer": (AerDevice, "aer[*]"),
    "edac_mc": (EdacMc, "edac[*]"),
    "dimm": (EdacDimm, "edac[*].dimms[*]"),
}
_PREFIXES = sorted(((p, s) for s, (_, p) in SCOPES.items() if p), key=lambda x: -len(x[0]))
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$|^#total$")


@dataclass(frozen=True, slots=True)
class Path:
    text: str
    scope: str
    chain: tuple[str, ...]  # attribute names (and a final dict key) inside one scope element
    get: Getter  # element -> value (None when any step is missing)
    group: str  # first attribute: counters of one group are compared together
    is_dict_key: bool


def _struct_fields(typ: type) -> dict[str, Any]:
    return {f: typ.__annotations__.get(f) for f in getattr(typ, "__struct_fields__", ())}




def _nested_type(typ: type, attr: str) -> type | None:
    """The struct type a field holds (for validating the next step), or None for leaves."""
    from fleethealth import schema

    ann = str(typ.__annotations__.get(attr, ""))
    for name in ("EccCounters", "RemappedRows", "RetiredPages", "PcieLink", "NvlinkCounters", "GpuThermal"):
        if name in ann:
            return getattr(schema, name)  # type: ignore[no-any-return]
    return None


def _dict_total(d: dict[str, int] | None) -> int | None:
    if not d:
        return None if d is None else 0
    for k, v in d.items():
        if k.startswith("TOTAL_"):
            return v
    return sum(d.values())


def parse_path(text: str) -> Path:
    """Compile a path; raise PathError saying what is wrong."""
    text = text.strip()
    scope, rest = "host", text
    for prefix, s in _PREFIXES:
        if text == prefix or text.startswith(prefix + "."):
            scope, rest = s, text[len(prefix) + 1 :]
            break
    if not rest:
        raise PathError(f"path {text!r} names a scope but no field")
    chain = tuple(rest.split("."))
    typ: type | None = SCOPES[scope][0]
    is_key = False
    for i, step in enumerate(chain):
        if not _NAME.match(step):
            raise PathError(f"path {text!r}: bad step {step!r}")
        if typ is None:
            raise PathError(f"path {text!r}: {chain[i - 1]!r} is a value, it has no field {step!r}")
        fields = _struct_fields(typ)
        if step not in fields:
            raise PathError(
                f"path {text!r}: {typ.__name__} has no field {step!r} (fields: {', '.join(sorted(fields))})"
            )
        ann = str(fields[step])
        if "dict[" in ann:
            if i == len(chain) - 1:
                raise PathError(f"path {text!r}: {step!r} is a dict; add a key, e.g. {step}.NAME or {step}.#total")
            if i != len(chain) - 2:
                raise PathError(f"path {text!r}: only one key may follow the dict {step!r}")
            is_key = True
            break
        typ = _nested_type(typ, step)
    get = _compile(chain, is_key)
    return Path(text, scope, chain, get, chain[0], is_key)


def _compile(chain: tuple[str, ...], is_key: bool) -> Getter:
    if is_key:
        *attrs, key = chain
        head = _compile(tuple(attrs), False)
        if key == "#total":
            return lambda e: _dict_total(head(e))

        def get_key(e: Any) -> Any:
            d = head(e)
            return None if d is None else d.get(key)

        return get_key
    if len(chain) == 1:
        a = chain[0]
        return lambda e: getattr(e, a)
    if len(chain) == 2:
        a, b = chain

        def get2(e: Any) -> Any:
            x = getattr(e, a)
            return None if x is None else getattr(x, b)

        return get2

    def get_n(e: Any) -> Any:
        for a in chain:
            if e is None:
                return None
            e = getattr(e, a)
        return e

    return get_n


# --------------------------------------------------------------------------- components


def gpu_component(g: GpuSample) -> str:
    return g.uuid or (f"pci:{g.pci_bus_id}" if g.pci_bus_id else f"gpu{g.index}")


norm_pci = _normalise_pci  # one canonical form for every part (fleethealth.ids)


def iter_scope(sample: Sample, scope: str) -> Iterator[tuple[str, Any, Any]]:
    """Yield (component name, element, owning GPU or None) for every element of a scope."""
    if scope == "host":
        yield "host", sample, None
    elif scope == "gpu":
        for g in sample.gpus:
            yield gpu_component(g), g, g
    elif scope == "nvlink":
        for g in sample.gpus:
            if g.nvlink is not None:
                yield gpu_component(g), g.nvlink, g
    elif scope == "net_port":
        for p in sample.net_ports:
            yield f"{p.device}/{p.port}", p, None
    elif scope == "aer":
        for d in sample.aer:
            yield norm_pci(d.pci_addr), d, None
    elif scope == "edac_mc":
        for m in sample.edac:
            yield f"mc{m.mc}", m, None
    elif scope == "dimm":
        for m in sample.edac:
            for dimm in m.dimms:
                yield dimm.label or f"mc{m.mc}", dimm, None
