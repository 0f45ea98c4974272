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

import gzip
import io
import sys
from collections.abc import Callable, Iterator, Mapping
from importlib import import_module
from pathlib import Path
from typing import BinaryIO

from parsers import kernel, split
from parsers.base import Fact, GpuInfo, Parsed, ParseError
from parsers.detect import detect_format
from parsers.kernel_log import MAX_LINE

# format -> (module in this package, function). A parser's module is imported the first time its
# format is asked for, so reading one kernel log does not compile every tool's regexes (start-up of
# `fleethealth diagnose FILE`, issue 18).
_PARSER_SITES: dict[str, tuple[str, str]] = {
    "nvidia-smi-q": ("nvsmi_text", "parse"),
    "nvidia-smi-xml": ("nvsmi_xml", "parse"),
    "nvidia-smi-table": ("nvsmi_table", "parse"),
    "nvidia-smi-csv": ("nvsmi_table", "parse_query_csv"),
    "nvidia-smi-nvlink": ("nvlink", "parse"),
    "dcgmi-nvlink-status": ("nvlink", "parse_dcgmi"),
    "dcgmi-diag": ("dcgm", "parse_diag"),
    "dcgmi-health": ("dcgm", "parse_health"),
    "dcgmi-dmon": ("dcgm", "parse_dmon"),
    "dcgm-hostengine-log": ("dcgm", "parse_hostengine"),
    "dcgm-exporter": ("prom", "parse"),
    "fabricmanager-log": ("dcgm", "parse_fabricmanager"),
    "ibstat": ("infiniband", "parse_ibstat"),
    "ibstatus": ("infiniband", "parse_ibstatus"),
    "perfquery": ("infiniband", "parse_perfquery"),
    "ibqueryerrors": ("infiniband", "parse_ibqueryerrors"),
    "iblinkinfo": ("infiniband", "parse_iblinkinfo"),
    "ibnetdiscover": ("infiniband", "parse_ibnetdiscover"),
    "ib-counter-dump": ("infiniband", "parse_counter_dump"),
    "ethtool-stats": ("ethtool", "parse_stats"),
    "ethtool-settings": ("ethtool", "parse_settings"),
    "ethtool-info": ("ethtool", "parse_info"),
    "kernel-log": ("kernel", "parse"),
    "mcelog": ("mce", "parse_mcelog"),
    "ras-mc-ctl": ("mce", "parse_ras_mc_ctl"),
    "lspci-vvv": ("lspci", "parse"),
    "sysfs-aer": ("sysfs_snapshot", "parse_aer_text"),
}


class _LazyParsers(Mapping[str, Callable[[str], Parsed]]):
    """``format -> parse function``, each module imported on first use."""

    def __init__(self, sites: dict[str, tuple[str, str]]) -> None:
        self._sites = sites
        self._loaded: dict[str, Callable[[str], Parsed]] = {}

    def __getitem__(self, fmt: str) -> Callable[[str], Parsed]:
        fn = self._loaded.get(fmt)
        if fn is None:
            module, name = self._sites[fmt]
            fn = self._loaded[fmt] = getattr(import_module(f"parsers.{module}"), name)
        return fn

    def __iter__(self) -> Iterator[str]:
        return iter(self._sites)

    def __len__(self) -> int:
        return len(self._sites)

    def __contains__(self, fmt: object) -> bool:
        return fmt in self._sites


PARSERS: Mapping[str, Callable[[str], Parsed]] = _LazyParsers(_PARSER_SITES)
MAX_BYTES = 64 << 20
_WANTS_COMMAND = {"ethtool-stats", "nvidia-smi-csv", "ibstat", "sysfs-aer", "lspci-vvv"}  # parsers that read the device from the command line above the output


def parse_text(text: str, fmt: str | None = None, path: str | None = None) -> Parsed:
    """Parse ``text`` as ``fmt`` (sniffed from the content when None)."""
    fmt = fmt or detect_format(text, path)
    parser = PARSERS.get(fmt)
    if parser is None:
        raise ParseError("parse", f"no parser for format {fmt!r}")
    return parser(text)


def load(path: Path | str, fmt: str | None = None) -> Parsed:
    """Read a capture file (or a sysfs snapshot folder) and parse it as ONE capture. The only I/O in
    this package besides :func:`sysfs_snapshot.read_tree` and :func:`read_source`. Raises ParseError
    or OSError."""
    p = Path(path)
    if p.is_dir():
        from parsers import sysfs_snapshot

        return sysfs_snapshot.parse_files(sysfs_snapshot.read_tree(p))
    return parse_text(decode_capture(read_source(str(p)), str(p)), fmt, str(p))


GZIP_MAGIC = b"\x1f\x8b"


def read_source(path: str, stdin: BinaryIO | None = None) -> bytes:
    """The bytes of a capture: a file, or standard input for ``-``; at most :data:`MAX_BYTES` (after
    gzip decompression, which is detected by content, never by the file name). Raises ParseError
    for a file over the limit, OSError when it cannot be read."""
    if path == "-":
        src = stdin if stdin is not None else sys.stdin.buffer
        data = src.read(MAX_BYTES + 1)
    else:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    if data[:2] == GZIP_MAGIC:
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
                data = gz.read(MAX_BYTES + 1)
        except (OSError, EOFError) as exc:
            raise ParseError("load", f"{path} starts like gzip but does not decompress: {exc}") from None
    if len(data) > MAX_BYTES:
        raise ParseError("load", f"{path} is larger than {MAX_BYTES >> 20} MiB")
    return data


def decode_capture(data: bytes, path: str) -> str:
    """Captured text from bytes; NUL bytes in the first 64 KiB mean a binary file (ParseError)."""
    if b"\x00" in data[:65536]:
        raise ParseError("load", f"{path} is binary, not captured text")
    return data.decode("utf-8", "replace")


def parse_captures(text: str, path: str | None = None) -> list[Parsed]:
    """Every capture in ``text`` (a bundle or a pasted session is split: :mod:`split`), each parsed
    as the format its content (or, failing that, its command line) says. Text no parser claims is
    read by the kernel-line reader, so text that holds kernel lines is never unreadable. Never
    raises ParseError; what was odd is in each part's ``warnings``."""
    text, cut = bound_lines(text)
    out = []
    for part in split.split_captures(text):
        p = _parse_part(part, path)
        if part.title:
            p.warnings.insert(0, f"capture {part.title!r}")
        out.append(p)
    out = out or [kernel.parse(text, lenient=True)]
    if cut:
        out[0].warnings.append(f"{cut} line(s) over {MAX_LINE} characters were cut before parsing")
    return out


def bound_lines(text: str) -> tuple[str, int]:
    """Every line cut to :data:`MAX_LINE` characters before any parser's regex sees it (security
    review F13: regexes run on bounded lines). Returns the text and how many lines were cut."""
    if len(text) <= MAX_LINE or max(map(len, text.splitlines()), default=0) <= MAX_LINE:
        return text, 0
    lines = text.splitlines()
    cut = sum(len(ln) > MAX_LINE for ln in lines)
    return "\n".join(ln[:MAX_LINE] for ln in lines) + "\n", cut


def _parse_part(part: split.Part, path: str | None) -> Parsed:
    notes: list[str] = []
    try:
        found: str | None = detect_format(part.text, path)
    except ParseError:
        found = None
    order: list[str | None] = [found] if found and found != kernel.FORMAT else []
    order += [part.hint, found]
    tried: list[str] = []
    for fmt in order:
        if not fmt or fmt in tried or fmt not in PARSERS:
            continue
        tried.append(fmt)
        text = f"{part.title}\n{part.text}" if part.title and fmt in _WANTS_COMMAND else part.text
        try:
            return PARSERS[fmt](text)
        except ParseError as exc:
            notes.append(str(exc))
    p = kernel.parse(part.text, lenient=True)
    if kernel.FORMAT not in tried:
        p.format = f"{kernel.FORMAT} (fallback)"
        notes.append("no known tool format; read for kernel lines")
    p.warnings[:0] = notes
    return p


__all__ = ["PARSERS", "Fact", "GpuInfo", "ParseError", "Parsed", "decode_capture", "detect_format", "load",
           "parse_captures", "parse_text", "read_source"]
