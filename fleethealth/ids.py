"""Identifiers every part compares: PCI addresses in one canonical form."""

from __future__ import annotations


def normalise_pci(addr: str) -> str:
    """``00000000:3B:00.0`` (NVML pads the domain to 8 digits), ``PCI:0000:3b:00`` (NVRM Xid lines),
    ``3b:00.0`` (no domain) and sysfs's ``0000:3b:00.0`` all become ``0000:3b:00.0``."""
    a = addr.strip().lower()
    if a.startswith("pci:"):
        a = a[4:]
    parts = a.split(":")
    if len(parts) == 2:
        parts.insert(0, "0000")
    if len(parts) != 3:
        return a
    dom, bus, devfn = parts
    dom = dom[-4:].rjust(4, "0")
    if "." not in devfn:
        devfn += ".0"
    return f"{dom}:{bus}:{devfn}"
