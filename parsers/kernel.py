"""Kernel logs in every prefix format -> kernel events plus decoded facts (pure).

Line prefixes and the NVRM / AER / EDAC / MCE line shapes are the collectors' kernel-log parser's job
(:mod:`parsers.kernel_log`); this module runs it over a whole capture and adds what needs more
than one line: the AER error names under each ``PCIe Bus Error`` header (with the layer), the Xid a
``45`` line says it was ``caused by``, the GPU UUID the driver printed for a PCI address, and
machine-check records decoded by :mod:`parsers.mce`.
"""

from __future__ import annotations

import re

from fleethealth.lazyregex import lazy
from fleethealth.schema import MAX_EVENTS
from parsers.base import Fact, Parsed, ParseError, new_parsed, pci_norm
from parsers.kernel_log import MAX_LINE, KernelLineParser, split_prefix

FORMAT = "kernel-log"
_BUS_ERR = lazy(r"(?P<pci>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]): (?:AER: )?PCIe Bus Error: "
                      r"severity=(?P<sev>[^,]+), type=(?P<type>[^,]+)", re.I)
_AER_ITEM = lazy(r"(?P<pci>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]): (?:AER: )?\s*\[\s*(?P<bit>\d+)\]\s+"
                       r"(?P<name>[A-Za-z][\w ()-]*?)\s*(?:\(First\))?\s*$", re.I)
_CAUSED_BY = lazy(r"caused by previous Xid (?P<xid>\d+)", re.I)
_GPU_UUID = lazy(r"NVRM: GPU at PCI:(?P<pci>[0-9a-fA-F:.]+): (?P<uuid>GPU-[0-9a-fA-F-]+)")


def parse(text: str, *, lenient: bool = False) -> Parsed:
    """A kernel log in any prefix format. ``lenient``: never raise, even when no line is the kernel's
    (the fallback for text no other parser claims)."""
    out = new_parsed(FORMAT)
    kp = KernelLineParser(default_ts=0.0)
    aer_ctx: dict[str, tuple[str, str]] = {}  # pci -> (severity, layer) of the last bus-error header
    mce_lines: list[str] = []
    matched = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        evs = kp.feed_all(line)
        msg = split_prefix(line.rstrip()).msg
        for ev in evs:
            matched += 1
            if len(out.sample.kernel_events) < MAX_EVENTS:
                out.sample.kernel_events.append(ev)
            else:
                out.skipped_lines += 1
            if ev.kind == "xid" and (c := _CAUSED_BY.search(ev.line)) is not None:
                out.facts.append(Fact("xid_caused_by", ev.pci_addr or "", {"xid": ev.xid, "cause": int(c["xid"])},
                                      ev.line))
        if not kp.last_kernel:
            continue  # another program's line (sshd, sudo, a job): nothing in it is read (security review F7)
        if "NVRM" in msg and (m := _GPU_UUID.search(msg)) is not None:
            out.facts.append(Fact("gpu_uuid", pci_norm(m["pci"]), {"uuid": m["uuid"]}, line.strip()))
        if "Bus Error" in msg and (m := _BUS_ERR.search(msg)) is not None:
            aer_ctx[m["pci"].lower()] = (m["sev"].strip(), m["type"].strip())
            out.facts.append(Fact("aer_header", m["pci"].lower(), {
                "severity": _sev(m["sev"]), "layer": m["type"].strip()}, line.strip()))
        elif "]" in msg and (m := _AER_ITEM.search(msg)) is not None:
            sev, layer = aer_ctx.get(m["pci"].lower(), ("", ""))
            out.facts.append(Fact("aer_error", m["pci"].lower(), {
                "severity": _sev(sev), "layer": layer, "bit": int(m["bit"]), "name": m["name"].strip()}, line.strip()))
        elif "Device recovery failed" in msg and "AER" in msg:
            out.facts.append(Fact("aer_recovery_failed", _pci_in(msg), {}, line.strip()))
        if not ("Hardware Error" in line or "EDAC" in line or "edac" in line):
            continue
        from parsers import mce  # here: a log without machine-check lines never compiles its regexes

        if mce.is_mce_line(msg):
            mce_lines.append(msg)
        elif mce.is_mce_line(line):  # a prefix split that ate the "EDAC MCn:" tag: keep the raw line
            mce_lines.append(line.strip())
    if mce_lines:
        from parsers import mce

        out.facts.extend(mce.decode_kernel_mce(mce_lines))
    out.kernel_lines = kp.lines_kernel
    if kp.lines_foreign:
        out.warnings.append(f"{kp.lines_foreign} line(s) logged by other programs were not read as kernel lines")
    if kp.lines_cut:
        out.warnings.append(f"{kp.lines_cut} line(s) over {MAX_LINE} characters were cut")
    if not lenient and matched == 0 and not out.facts and not _looks_like_log(text):
        raise ParseError(FORMAT, "no line has a kernel-log prefix or a known kernel message")
    return out


def _sev(text: str) -> str:
    t = text.lower()
    if t.startswith("correct"):
        return "corrected"
    if "non-fatal" in t or "nonfatal" in t:
        return "non-fatal"
    if "fatal" in t:
        return "fatal"
    return t or "unknown"


def _pci_in(msg: str) -> str:
    m = re.search(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", msg, re.I)
    return m.group(0).lower() if m else "host"


_PREFIX = lazy(r"^(?:\[\s*\d+\.\d+\]|\[\w{3} \w{3} +\d+ [\d:]+ \d{4}\]|\d+,\d+,\d+,[^;]*;|"
                     r"\S{3,4}\s+\d{1,2} \d\d:\d\d:\d\d |\d{4}-\d\d-\d\dT|kern\s*:|kernel: )")


def _looks_like_log(text: str) -> bool:
    lines = [ln for ln in text.splitlines()[:200] if ln.strip()]
    if not lines:
        return False
    hits = sum(1 for ln in lines if _PREFIX.match(ln))
    return hits * 2 >= len(lines)
