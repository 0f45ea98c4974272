"""Kernel-log lines -> :class:`KernelEvent` (pure; no I/O).

Reads every prefix format a GPU host produces: raw ``/dev/kmsg`` records (``6,3964,206764307,-;msg``),
``dmesg`` (``[  123.456789] msg``), ``dmesg -T`` (``[Mon Jan  1 00:00:00 2024] msg``), ``dmesg
--time-format iso`` (optionally with ``--decode``'s ``kern  :warn  :`` facility prefix), syslog and
``journalctl -k`` (``Jan  1 00:00:00 host kernel: msg``, also the short-iso variant), and bare
messages (``NVRM: Xid ...``).

Recognised messages: NVRM Xid lines, "fallen off the bus" with or without a Xid, PCIe AER lines,
EDAC CE/UE lines, and MCE lines. Any other line gives ``None``. A line that starts like one we know
but is cut short (``NVRM: Xid (PCI:0000:3b:0``) gives ``kind="other"`` so the raw text is kept as
evidence. Nothing here raises on bad input.

Timestamps come from the line, never the wall clock: relative (seconds since boot) stamps need
``boot_time``; stamps without a year (syslog) take ``year_hint``; a line without any stamp takes
``default_ts`` (0.0 if not given).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fleethealth.ids import normalise_pci as _normalise_pci
from fleethealth.schema import KernelEvent

MAX_LINE = 8192

_MONTHS = {m: i + 1 for i, m in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"])}

_KMSG = re.compile(r"^(?P<pri>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<msg>.*)$")
_REL = re.compile(r"^\[\s*(?P<rel>\d+\.\d+)\]\s?(?P<msg>.*)$")
_CTIME = re.compile(
    r"^\[(?:\w{3}) (?P<mon>\w{3})\s+(?P<day>\d+) (?P<hms>\d\d:\d\d:\d\d) (?P<year>\d{4})\]\s?(?P<msg>.*)$"
)
_ISO = re.compile(
    r"^(?:\w+\s*:\s*\w+\s*:\s)?"  # dmesg --decode facility/level
    r"(?P<iso>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)"
    r"(?:\s+(?P<host>[^\s:]+)\s+(?P<tag>[\w.\-/]+(?:\[\d+\])?):)?\s(?P<msg>.*)$"
)
_SYSLOG = re.compile(
    r"^(?P<mon>\S{3,4})\s+(?P<day>\d{1,2}) (?P<hms>\d\d:\d\d:\d\d)(?:\s+(?P<host>[^\s:]+))??\s+"
    r"(?P<tag>[\w.\-/]+(?:\[\d+\])?): (?P<msg>.*)$"
)
_BARE_TAG = re.compile(r"^kernel: (?P<msg>.*)$")

_PCI = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_XID = re.compile(
    rf"NVRM: Xid \(PCI:(?P<pci>{_PCI})\): (?P<xid>\d+)"
    r"(?:, pid=(?:'?<unknown>'?|(?P<pid>\d+)))?(?:, name=(?P<name>[^,]*))?(?:, )?(?P<rest>.*)$"
)
_XID_START = re.compile(r"NVRM: Xid\b")
_FELL_PCI = re.compile(rf"(?:GPU (?:at )?(?:PCI:)?(?P<pci>{_PCI})\b.*)?fallen off the bus", re.I)
_NVRM_GPU = re.compile(rf"NVRM: (?:The NVIDIA GPU|GPU at PCI:|GPU) ?(?P<pci>{_PCI})")
_AER_LINE = re.compile(rf"^(?:\S+ )?(?P<pci>{_PCI}): (?:AER: )?(?P<body>.*)$")
_AER_RECV = re.compile(
    r"(?:Multiple )?(?P<sev>Corrected|Correctable|Uncorrected \((?:Fatal|Non-Fatal)\)|Uncorrectable"
    r"(?: \((?:Fatal|Non-Fatal)\))?|Fatal|Non-Fatal) error(?:s)? (?:message )?received",
    re.I,
)
_AER_SEV = re.compile(r"severity=(?P<sev>[^,\]]+)", re.I)
_AER_DETAIL = re.compile(r"^(?:\s*\[\s*\d+\] \S|\s*device \[|\s*TLP Header|Device recovery|.*Surprise Down)")
_EDAC = re.compile(r"EDAC (?:\w+ )?MC(?P<mc>\d+): (?P<n>\d+) (?P<t>CE|UE) ")
_MCE = re.compile(r"(?:mce|MCE): \[Hardware Error\]: (?P<body>.*)$")


normalise_pci = _normalise_pci  # one canonical form for every part (fleethealth.ids)


def _severity(text: str) -> str:
    t = text.strip().lower()
    if t.startswith("correct"):
        return "corrected"
    if "non-fatal" in t or "nonfatal" in t:
        return "non-fatal"
    if "fatal" in t:
        return "fatal"
    return "uncorrected"


@dataclass(frozen=True)
class Stamp:
    """The prefix of a kernel-log line: where its message starts and when it was logged."""

    msg: str
    ts: float | None  # unix seconds, None when the line has no usable stamp
    kmsg_seq: int | None = None


def split_prefix(line: str, *, boot_time: float | None = None, year_hint: int | None = None) -> Stamp:
    """Strip the kmsg / dmesg / syslog / journal prefix. Unknown shapes: the whole line is the message."""
    m = _KMSG.match(line)
    if m:
        ts = boot_time + int(m["usec"]) / 1e6 if boot_time is not None else None
        return Stamp(m["msg"], ts, int(m["seq"]))
    m = _REL.match(line)
    if m:
        return Stamp(m["msg"], boot_time + float(m["rel"]) if boot_time is not None else None)
    m = _CTIME.match(line)
    if m:
        return Stamp(m["msg"], _civil(int(m["year"]), m["mon"], int(m["day"]), m["hms"]))
    m = _ISO.match(line)
    if m:
        return Stamp(_inner_rel(m["msg"]), _iso(m["iso"]))
    m = _SYSLOG.match(line)
    if m:
        year = year_hint if year_hint is not None else datetime.now().year
        return Stamp(_inner_rel(m["msg"]), _civil(year, m["mon"], int(m["day"]), m["hms"]))
    s = line.strip()
    m = _BARE_TAG.match(s)
    return Stamp(_inner_rel(m["msg"]) if m else s, None)


def _inner_rel(msg: str) -> str:
    """syslog lines keep the printk stamp: ``kernel: [68183.615790] pcieport ...``."""
    m = _REL.match(msg)
    return m["msg"] if m else msg


def _civil(year: int, mon: str, day: int, hms: str) -> float | None:
    mo = _MONTHS.get(mon[:3].lower())
    if mo is None:
        return None  # a localised month name ("фев"): keep the message, drop the stamp
    try:
        h, mi, s = (int(x) for x in hms.split(":"))
        return datetime(year, mo, day, h, mi, s).timestamp()  # dmesg -T and syslog print local time
    except (ValueError, OverflowError):
        return None


def _iso(text: str) -> float | None:
    t = text.replace(",", ".").replace(" ", "T")
    if t.endswith("Z"):
        t = t[:-1] + "+00:00"
    m = re.search(r"([+-])(\d\d)(\d\d)$", t)
    if m:
        t = t[: m.start()] + f"{m[1]}{m[2]}:{m[3]}"
    try:
        dt = datetime.fromisoformat(t)
    except ValueError:
        return None
    if dt.tzinfo is None:
        return dt.timestamp()
    return dt.astimezone(UTC).timestamp()


def parse_kernel_line(
    line: str,
    *,
    year_hint: int | None = None,
    boot_time: float | None = None,
    default_ts: float | None = None,
) -> KernelEvent | None:
    """One kernel-log line -> a :class:`KernelEvent`, or ``None`` when it is not one we track."""
    if not line or len(line) > MAX_LINE:
        line = line[:MAX_LINE] if line else line
        if not line:
            return None
    line = line.rstrip("\r\n")
    stamp = split_prefix(line, boot_time=boot_time, year_hint=year_hint)
    ts = stamp.ts if stamp.ts is not None else (default_ts or 0.0)
    ts = min(max(ts, 0.0), 1e11)
    return _classify(stamp.msg, ts, line.strip())


def _classify(msg: str, ts: float, raw: str) -> KernelEvent | None:
    if "NVRM" in msg:
        m = _XID.search(msg)
        if m:
            return KernelEvent(
                ts=ts, kind="xid", line=raw, pci_addr=normalise_pci(m["pci"]), xid=min(int(m["xid"]), 1_000_000),
                pid=int(m["pid"]) if m["pid"] else None, message=m["rest"].strip(),
            )
        if _XID_START.search(msg):
            return KernelEvent(ts=ts, kind="other", line=raw, message=msg)  # cut short
        m = _FELL_PCI.search(msg)
        if m:
            pci = normalise_pci(m["pci"]) if m["pci"] else None
            return KernelEvent(ts=ts, kind="fell_off_bus", line=raw, pci_addr=pci, severity="fatal", message=msg)
        return None
    if "EDAC" in msg:
        m = _EDAC.search(msg)
        if m:
            sev = "corrected" if m["t"] == "CE" else "uncorrected"
            return KernelEvent(ts=ts, kind="edac", line=raw, severity=sev, message=msg)
        return None
    m = _MCE.search(msg)
    if m:
        body = m["body"].lower()
        sev = "uncorrected" if "uncorrected" in body else "corrected" if "corrected" in body else None
        return KernelEvent(ts=ts, kind="mce", line=raw, severity=sev, message=m["body"])
    m = _AER_LINE.match(msg)
    if m and ("AER" in msg or "PCIe Bus Error" in msg or _AER_DETAIL.match(m["body"])):
        body = m["body"]
        r = _AER_RECV.search(body) or _AER_SEV.search(body)
        if r is None and not _AER_DETAIL.match(body) and "PCIe Bus Error" not in body:
            return None
        sev = _severity(r["sev"]) if r else None
        return KernelEvent(
            ts=ts, kind="aer", line=raw, pci_addr=normalise_pci(m["pci"]), severity=sev, message=body.strip()
        )
    return None


@dataclass
class KernelLineParser:
    """Stateful wrapper for streams: joins what one line cannot say alone.

    * "fallen off the bus" without a Xid spans three lines (``The NVIDIA GPU 0000:b3:00.0`` /
      ``(PCI ID: ...) installed in this system has`` / ``fallen off the bus ...``): the PCI address
      is taken from the NVRM line that named a GPU just before.
    * AER detail lines (``[12] Timeout``) inherit the severity of their device's last header line.
    """

    boot_time: float | None = None
    year_hint: int | None = None
    default_ts: float | None = None
    _last_gpu: str | None = None
    _aer_sev: dict[str, str] = field(default_factory=dict)
    lines_seen: int = 0
    lines_matched: int = 0

    def feed(self, line: str) -> KernelEvent | None:
        self.lines_seen += 1
        ev = parse_kernel_line(
            line, year_hint=self.year_hint, boot_time=self.boot_time, default_ts=self.default_ts
        )
        if ev is None:
            m = _NVRM_GPU.search(line)
            if m:
                self._last_gpu = normalise_pci(m["pci"])
            return None
        if ev.kind == "fell_off_bus" and ev.pci_addr is None and self._last_gpu:
            ev.pci_addr = self._last_gpu
        elif ev.kind == "aer" and ev.pci_addr:
            if ev.severity:
                self._aer_sev[ev.pci_addr] = ev.severity
            else:
                ev.severity = self._aer_sev.get(ev.pci_addr)
        self.lines_matched += 1
        return ev

