"""Parsers for captured tool output: text in, contract-shaped values out.

Use :func:`parse_text` (format sniffed, or given) for text, :func:`load` for a file or a sysfs
snapshot folder. Every parser raises only :class:`ParseError` on bad input.

Formats: see :data:`PARSERS` (``nvidia-smi-q``, ``nvidia-smi-xml``, ``nvidia-smi-table``,
``nvidia-smi-nvlink``, ``dcgmi-nvlink-status``, ``dcgmi-diag``, ``dcgm-hostengine-log``,
``dcgm-exporter``, ``fabricmanager-log``, ``ibstat``, ``ibstatus``, ``perfquery``, ``ibqueryerrors``,
``ibnetdiscover``, ``ib-counter-dump``, ``ethtool-stats``, ``ethtool-settings``, ``kernel-log``,
``mcelog``, ``ras-mc-ctl``, ``lspci-vvv``) plus ``sysfs-snapshot`` for folders.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from collectors.parsers import (
    dcgm,
    ethtool,
    infiniband,
    kernel,
    lspci,
    mce,
    nvlink,
    nvsmi_table,
    nvsmi_text,
    nvsmi_xml,
    prom,
    sysfs_snapshot,
)
from collectors.parsers.base import Fact, GpuInfo, Parsed, ParseError
from collectors.parsers.detect import detect_format

PARSERS: dict[str, Callable[[str], Parsed]] = {
    "nvidia-smi-q": nvsmi_text.parse,
    "nvidia-smi-xml": nvsmi_xml.parse,
    "nvidia-smi-table": nvsmi_table.parse,
    "nvidia-smi-nvlink": nvlink.parse,
    "dcgmi-nvlink-status": nvlink.parse_dcgmi,
    "dcgmi-diag": dcgm.parse_diag,
    "dcgm-hostengine-log": dcgm.parse_hostengine,
    "dcgm-exporter": prom.parse,
    "fabricmanager-log": dcgm.parse_fabricmanager,
    "ibstat": infiniband.parse_ibstat,
    "ibstatus": infiniband.parse_ibstatus,
    "perfquery": infiniband.parse_perfquery,
    "ibqueryerrors": infiniband.parse_ibqueryerrors,
    "ibnetdiscover": infiniband.parse_ibnetdiscover,
    "ib-counter-dump": infiniband.parse_counter_dump,
    "ethtool-stats": ethtool.parse_stats,
    "ethtool-settings": ethtool.parse_settings,
    "kernel-log": kernel.parse,
    "mcelog": mce.parse_mcelog,
    "ras-mc-ctl": mce.parse_ras_mc_ctl,
    "lspci-vvv": lspci.parse,
}
MAX_BYTES = 64 << 20


def parse_text(text: str, fmt: str | None = None, path: str | None = None) -> Parsed:
    """Parse ``text`` as ``fmt`` (sniffed from the content when None)."""
    fmt = fmt or detect_format(text, path)
    parser = PARSERS.get(fmt)
    if parser is None:
        raise ParseError("parse", f"no parser for format {fmt!r}")
    return parser(text)


def load(path: Path | str, fmt: str | None = None) -> Parsed:
    """Read a capture file (or a sysfs snapshot folder) and parse it. The only I/O in this package
    besides :func:`sysfs_snapshot.read_tree`. Raises ParseError or OSError."""
    p = Path(path)
    if p.is_dir():
        return sysfs_snapshot.parse_files(sysfs_snapshot.read_tree(p))
    with p.open("rb") as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ParseError("load", f"{p} is larger than {MAX_BYTES >> 20} MiB")
    if b"\x00" in data[:65536]:
        raise ParseError("load", f"{p} is binary, not captured text")
    return parse_text(data.decode("utf-8", "replace"), fmt, str(p))


__all__ = ["PARSERS", "Fact", "GpuInfo", "ParseError", "Parsed", "detect_format", "load", "parse_text"]
