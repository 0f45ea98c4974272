"""The one kernel-line reader: kernel messages inside any text -> :class:`KernelEvent` (pure; no I/O).

Used by the collector's followers (``/dev/kmsg``, ``journalctl -k``, a log file) and by ``diagnose``
(:mod:`parsers.kernel`), so both paths read a line the same way.

**Prefixes** (:func:`split_prefix`), peeled in layers, each regex anchored and linear-time:

* ``/dev/kmsg`` records ``prio,seq,usec,flags;message`` with their `` KEY=VALUE`` dictionary lines
  (``SUBSYSTEM=pci`` / ``DEVICE=+pci:0000:…``; the PCI address fills in when the message has none);
  ``dmesg -r`` / pstore ``<6>[  12.3] …``;
* ``dmesg`` ``[  12.345678]`` (with a printk caller id ``[ T123]`` / ``[ C1]``), ``-T``
  ``[Wed Jan 27 23:04:35 2021]``, ``-H`` / reltime ``[Jan27 23:04]`` then ``[  +0.000123]``, delta
  ``[<    0.000020>]``, ``--time-format iso``, ``--decode`` ``kern  :warn  :``; a first line whose
  ``[`` was cut off;
* syslog / journald: RFC 3164 ``Jan  1 00:00:00 host tag[pid]: …`` (any month language: ``set``,
  ``Okt``, ``фев``, ``11月``; fractional seconds; a SONiC severity word), the ``<PRI>`` form,
  RFC 5424 ``<6>1 2024-… host kernel - - - …``, RFC 3339 ``2019-…-04:00 host kernel: …``,
  journalctl ``short``, ``short-iso``, ``short-precise``, ``short-full``, ``short-unix``,
  ``short-monotonic``, ``cat`` and ``json``; the syslog broadcast ``Message from syslogd@… / kernel:…``;
  a host-less condensed ``Sep 18 20:07:01 NVRM: …``;
* ``talosctl dmesg`` ``node: kern:    info: [2024-…Z]: …``;
* wrappers around any of the above: CRI (``…Z stdout F …``), ``kubectl logs --timestamps`` /
  ``--prefix``, docker json logs, ``docker compose`` ``svc  | …``, a pod name before a dmesg line,
  ``grep -n`` / ``grep -H`` file and line numbers.

**Who wrote the line.** A line counts only when the kernel wrote it: a kmsg / ``<PRI>`` record of
facility 0, a ``kernel`` syslog tag or journal transport, talos facility ``kern``, or a dmesg record
(a dmesg stamp and no program tag). A line another program logged (``sshd[42]: Invalid user NVRM:
Xid …``) is counted in ``lines_foreign`` and gives no event; the one exception is the carrier state
that ``systemd-networkd`` / ``NetworkManager`` log, emitted as ``kind="other"`` with the program in
``message`` (``"systemd-networkd: eth0: Lost carrier"``) so a rule can tell it apart. A line with no
prefix at all continues the line before it (wrapped text; its origin is inherited and the joined text
is read again) or, in a capture of bare messages (``journalctl -o cat``, a pasted excerpt), is read as
the kernel's.

**Messages.** NVRM Xid lines, "fallen off the bus" with or without a Xid, PCIe AER, EDAC, MCE as their
own kinds; the lines of the families the rule set reads by text (NVSwitch SXid, APEI/GHES
``[Hardware Error]`` records with the record's severity, mlx5 / NIC link, module and PCIe-bandwidth
lines, GSP / RPC / heartbeat / RmInitAdapter / ``NV_ERR_*`` NVRM lines, probe failures, bonding link
state) as ``kind="other"`` with ``message`` kept. What they mean is the rules' business; this module
decides nothing. Lines are cut at :data:`MAX_LINE` characters (counted) before any regex runs.

Timestamps come from the line, never the wall clock: relative (seconds since boot) stamps need
``boot_time``; stamps without a year take ``year_hint``; a line without any stamp takes ``default_ts``.
Nothing here raises on bad input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fleethealth.ids import normalise_pci as _normalise_pci
from fleethealth.lazyregex import lazy
from fleethealth.schema import KernelEvent

MAX_LINE = 8192

normalise_pci = _normalise_pci  # one canonical form for every part (fleethealth.ids)

# --------------------------------------------------------------------------- months in many languages

_MONTH_NAMES = [
    # en, de, fr, es, pt, it, nl, sv/da/no, pl, ru, uk (first three letters, lower case, accents kept)
    ("jan", "ene", "gen", "janv", "sty", "янв", "січ"),
    ("feb", "fev", "fév", "févr", "lut", "фев", "лют"),
    ("mar", "mär", "mrt", "mars", "мар", "бер"),
    ("apr", "abr", "avr", "kwi", "апр", "кві"),
    ("may", "mai", "mag", "mei", "maj", "мая", "май", "тра"),
    ("jun", "jui", "juin", "giu", "cze", "июн", "чер"),
    ("jul", "juil", "lug", "lip", "июл", "лип"),
    ("aug", "aoû", "août", "ago", "sie", "авг", "сер"),
    ("sep", "set", "sept", "wrz", "сен", "вер"),
    ("oct", "okt", "out", "ott", "paź", "окт", "жов"),
    ("nov", "lis", "ноя", "лис"),
    ("dec", "dez", "déc", "dic", "des", "gru", "дек", "гру"),
]
_MONTHS: dict[str, int] = {name: i + 1 for i, names in enumerate(_MONTH_NAMES) for name in names}
_CJK_MONTH = lazy(r"^(\d{1,2})[月월]$")


def month_number(token: str) -> int | None:
    """``Jan`` / ``janv.`` / ``Okt`` / ``фев`` / ``11月`` -> 1..12, or None."""
    t = token.strip().rstrip(".").lower()
    m = _CJK_MONTH.match(t)
    if m:
        n = int(m.group(1))
        return n if 1 <= n <= 12 else None
    if t.isdigit():
        n = int(t)
        return n if 1 <= n <= 12 else None
    return _MONTHS.get(t) or _MONTHS.get(t[:4]) or _MONTHS.get(t[:3])


# --------------------------------------------------------------------------- prefixes

_KMSG = lazy(r"^(?P<pri>\d{1,4}),(?P<seq>\d{1,20}),(?P<usec>\d{1,20}),[^;\n]{0,32};")
_PRI = lazy(r"^<(?P<pri>\d{1,3})>")
_REL = lazy(r"^\[\s{0,16}(?P<rel>\d{1,12}\.\d{1,9})\]\s?")
_REL_CUT = lazy(r"^\s{0,16}(?P<rel>\d{1,12}\.\d{6})\]\s")  # a first line whose "[" was cut off
_CALLER = lazy(r"^\s?\[\s{0,8}[TC]\d{1,8}\]\s?")
_CTIME = lazy(
    r"^\[(?P<wd>[^\s\]]{1,12}) (?P<mon>[^\s\]\d]{1,12})\s{1,3}(?P<day>\d{1,2}) (?P<hms>\d\d:\d\d:\d\d) "
    r"(?P<year>\d{4})\]\s?")
_RELTIME = lazy(r"^\[(?P<mon>[^\s\]\d]{2,8})\s?(?P<day>\d{1,2}) (?P<hm>\d\d:\d\d)(?::(?P<s>\d\d))?\]\s?")
_DELTA = lazy(r"^\[\s{0,16}\+(?P<d>\d{1,12}\.\d{1,9})\]\s?")
_DELTA2 = lazy(r"^\[<\s{0,16}(?P<d>\d{1,12}\.\d{1,9})>\]\s?")
_DECODE = lazy(r"^(?P<fac>kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local\d)"
                     r"\s{0,8}:(?P<lvl>\w{1,8})\s{0,8}:\s?")
_ISO_TS = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?"
_ISO = lazy(rf"^(?P<iso>{_ISO_TS})\s")
_DMESG_ISO = lazy(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{6}[+-]\d\d:?\d\d$")
_SHORT_FULL = lazy(r"^(?P<wd>[A-Za-z]{3}) (?P<iso>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,9})?) "
                         r"(?P<tz>[A-Za-z0-9+\-]{1,6})\s")
_UNIX = lazy(r"^(?P<unix>\d{9,11}\.\d{1,9})\s")
_SYSLOG = lazy(r"^(?P<mon>\d{1,2}[月월]|[^\s\d\[\]<>{}()]{3,6})\s{1,3}(?P<day>\d{1,2}),?\s{1,3}"
                     r"(?P<hms>\d\d:\d\d:\d\d)(?P<frac>\.\d{1,9})?\s")
_RFC5424 = lazy(r"^(?P<ver>\d{1,2}) (?P<iso>\S{1,40}) (?P<host>\S{1,255}) (?P<app>\S{1,48}) (?P<procid>\S{1,128}) "
                      r"(?P<msgid>\S{1,32}) (?:-|(?:\[[^\]]{0,2048}\]){1,16})(?: |$)")
# after a stamp: [host] [SEVERITY] tag[pid]: message
_TAGGED = lazy(r"^(?:(?P<host>[^\s:\[\]]{1,255})\s{1,4})?(?:(?P<sev>[A-Z]{3,9})\s{1,4})?"
                     r"(?P<tag>[A-Za-z_][^\s:\[\]]{0,63})(?:\[(?P<pid>\d{1,10})\])?:(?:\s|$)")
_BROADCAST = lazy(r"^Message from syslogd@\S{1,255} at ")
_KERNEL_TAG = lazy(r"^\s{0,8}kernel:\s?")
_TALOS = lazy(r"^\s{0,4}(?:(?P<node>[^\s:]{1,255}|\[[0-9a-fA-F:]{2,45}\]|[0-9a-fA-F:]{2,45}):\s)?"
                    r"(?P<fac>kern|user|mail|daemon|auth|syslog|local\d):\s{1,8}(?P<lvl>\w{1,8}):\s{1,8}"
                    rf"\[(?P<iso>{_ISO_TS})\]:\s?")
# wrappers: what follows them is read as a line of its own
_CRI = lazy(rf"^(?P<iso>{_ISO_TS}) (?:stdout|stderr) [FP] ")
_KUBE_TS = lazy(r"^(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{1,9}Z) ")
_KUBE_PREFIX = lazy(r"^\[pod/[^\s\]]{1,253}/[^\s\]]{1,253}\] ")
_COMPOSE = lazy(r"^[\w.-]{1,64}\s{1,32}\| ")
_POD_NAME = lazy(r"^[a-z0-9][a-z0-9.-]{0,252} (?=\[\s{0,16}\d{1,12}\.\d{1,9}\])")
_GREP_FILE = lazy(r"^/?[\w.-]{1,64}(?:/[\w.-]{1,64}){0,8}[:-](?:\d{1,9}[:-])?")
_GREP_NUM = lazy(r"^\d{1,9}(?::|-|\s{0,2})(?=\s{0,16}\[)")

_DICT_LINE = lazy(r"^ (?P<k>[A-Z_]{1,32})=(?P<v>.*)$")
_DEVICE_PCI = lazy(r"^\+pci:(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])$")

KERNEL = "kernel"  # the kernel wrote it
BARE = "bare"  # no prefix: a paste of messages or a wrapped line (decided by the stream)
FOREIGN = "foreign"  # another program logged it
HEADER = "header"  # a line that carries no message (a broadcast header, a pstore part header)

_PSTORE_HEAD = lazy(r"^(?:Oops|Panic|Emergency|Restart|Halt|Poweroff|Unknown)#\d{1,6} Part\d{1,6}\s*$")


@dataclass(frozen=True, slots=True)
class Stamp:
    """The prefix of a kernel-log line: where its message starts, when and by whom it was logged."""

    msg: str
    ts: float | None  # unix seconds, None when the line has no absolute stamp
    kmsg_seq: int | None = None
    origin: str = BARE
    program: str = ""  # the syslog tag / facility that decided the origin ("kernel", "sshd", ...); "" for dmesg
    rel: float | None = None  # seconds since boot, when the prefix says
    delta: float | None = None  # dmesg -H: seconds since the previous record
    fields: tuple[tuple[str, str], ...] = ()  # /dev/kmsg dictionary (SUBSYSTEM, DEVICE, ...)


_ANSI = lazy(r"\x1b\[[0-9;]{0,16}[A-Za-z]")


def split_prefix(line: str, *, boot_time: float | None = None, year_hint: int | None = None) -> Stamp:
    """Strip every prefix layer. Unknown shapes: the whole line is the message, origin :data:`BARE`.
    Terminal colour codes (``dmesg --color=always``, a pasted ``dmesg -H``) are dropped first."""
    line = line[:MAX_LINE]
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    return _split(line, boot_time, year_hint, 0)


def _split(line: str, boot_time: float | None, year_hint: int | None, depth: int) -> Stamp:
    first, _, rest = line.partition("\n")
    if rest:  # a /dev/kmsg record read whole: message, then " KEY=VALUE" lines
        st = _split(first, boot_time, year_hint, depth)
        kv = tuple((m["k"], m["v"]) for m in map(_DICT_LINE.match, rest.split("\n")) if m)
        return Stamp(st.msg, st.ts, st.kmsg_seq, st.origin, st.program, st.rel, st.delta, kv)
    line = line.rstrip("\r")
    m = _KMSG.match(line)
    if m:
        usec = int(m["usec"])
        ts = boot_time + usec / 1e6 if boot_time is not None else None
        origin = KERNEL if int(m["pri"]) >> 3 == 0 else FOREIGN
        inner = _strip_caller(line[m.end():])
        return Stamp(inner, ts, int(m["seq"]), origin, "" if origin == KERNEL else "kmsg", rel=usec / 1e6)
    m = _PRI.match(line)
    if m:
        body = line[m.end():]
        origin = KERNEL if int(m["pri"]) >> 3 == 0 else FOREIGN
        st = _split(body, boot_time, year_hint, depth + 1)
        if st.origin == FOREIGN or origin == FOREIGN:
            return _foreign(st.msg, st.ts, st.program or "syslog")
        return Stamp(st.msg, st.ts, None, KERNEL, st.program, st.rel, st.delta)
    return _stamped(line, boot_time, year_hint, depth)


def _strip_caller(msg: str) -> str:
    m = _CALLER.match(msg)
    return msg[m.end():] if m else msg


def _foreign(msg: str, ts: float | None, program: str) -> Stamp:
    return Stamp(msg, ts, None, FOREIGN, program)


def _after_stamp(rest: str, ts: float | None, rel: float | None, *, tag_means_foreign: bool,
                 boot_time: float | None, untagged_is_kernel: bool = True, depth: int = 0) -> Stamp:
    """What follows a timestamp: ``host kernel: msg``, ``host prog[pid]: msg``, or the message itself
    (a dmesg record; or, where the stamp is one no kernel tool prints without a tag — an
    application's ``2024-03-05 10:11:12.123 ERROR …`` — text that must prove itself like a wrapper's)."""
    m = _TAGGED.match(rest)
    if m:
        tag, msg = m["tag"], rest[m.end():]
        if tag == "kernel":
            return _kernel_msg(msg, ts, rel, boot_time, KERNEL)
        if m["pid"] or (m["host"] and tag_means_foreign):
            return _foreign(msg, ts, tag)
    if not untagged_is_kernel:
        return _wrapped(rest, ts, boot_time, None, depth)
    return _kernel_msg(rest, ts, rel, boot_time)


def _kernel_msg(msg: str, ts: float | None, rel: float | None, boot_time: float | None, program: str = "") -> Stamp:
    """A kernel message that may still carry the printk stamp and caller id (syslog keeps them)."""
    m = _REL.match(msg)
    if m:
        rel = float(m["rel"])
        msg = msg[m.end():]
        if ts is None and boot_time is not None:
            ts = boot_time + rel
    return Stamp(_strip_caller(msg), ts, None, KERNEL, program, rel)


def _stamped(line: str, boot_time: float | None, year_hint: int | None, depth: int) -> Stamp:
    m = _REL.match(line) or _REL_CUT.match(line)
    if m:
        rel = float(m["rel"])
        ts = boot_time + rel if boot_time is not None else None
        return _after_stamp(_strip_caller(line[m.end():]), ts, rel, tag_means_foreign=False, boot_time=None)
    if line.startswith("["):
        m = _CTIME.match(line)
        if m:
            ts = _civil(int(m["year"]), m["mon"], int(m["day"]), m["hms"])
            return Stamp(_strip_caller(line[m.end():]), ts, None, KERNEL)
        m = _DELTA.match(line) or _DELTA2.match(line)
        if m:
            return Stamp(_strip_caller(line[m.end():]), None, None, KERNEL, delta=float(m["d"]))
        m = _RELTIME.match(line)
        if m and month_number(m["mon"]):
            year = year_hint if year_hint is not None else datetime.now().year
            ts = _civil(year, m["mon"], int(m["day"]), f"{m['hm']}:{m['s'] or '00'}")
            return Stamp(_strip_caller(line[m.end():]), ts, None, KERNEL)
        m = _KUBE_PREFIX.match(line)
        if m and depth < 3:
            return _wrapped(line[m.end():], None, boot_time, year_hint, depth)
    m = _DECODE.match(line)
    if m:
        st = _split(line[m.end():], boot_time, year_hint, depth + 1)
        if m["fac"] != "kern":
            return _foreign(st.msg, st.ts, m["fac"])
        return Stamp(st.msg, st.ts, st.kmsg_seq, KERNEL, "", st.rel, st.delta)
    m = _TALOS.match(line)
    if m:
        ts = _iso(m["iso"])
        if m["fac"] != "kern":
            return _foreign(line[m.end():], ts, m["fac"])
        return _kernel_msg(line[m.end():], ts, None, None, KERNEL)
    if depth < 3:
        m = _CRI.match(line) or _KUBE_TS.match(line)
        if m:
            return _wrapped(line[m.end():], _iso(m["iso"]), boot_time, year_hint, depth)
    m = _ISO.match(line)
    if m:
        # dmesg --time-format iso writes "2024-03-05T10:11:12,123456+00:00" (a T, a comma, an offset);
        # syslog daemons and journalctl write a "." and always a tag; anything else is an application's
        dmesg = _DMESG_ISO.match(m["iso"]) is not None
        return _after_stamp(line[m.end():], _iso(m["iso"]), None, tag_means_foreign=not dmesg, boot_time=boot_time,
                            untagged_is_kernel=dmesg, depth=depth)
    m = _SHORT_FULL.match(line)
    if m:
        return _after_stamp(line[m.end():], _iso(m["iso"]), None, tag_means_foreign=True, boot_time=boot_time,
                            untagged_is_kernel=False, depth=depth)
    m = _UNIX.match(line)
    if m:
        return _after_stamp(line[m.end():], float(m["unix"]), None, tag_means_foreign=True, boot_time=boot_time,
                            untagged_is_kernel=False, depth=depth)
    m = _SYSLOG.match(line)
    if m and month_number(m["mon"]) is not None:
        year = year_hint if year_hint is not None else datetime.now().year
        ts = _civil(year, m["mon"], int(m["day"]), m["hms"])
        if ts is not None and m["frac"]:
            ts += float(m["frac"])
        return _after_stamp(line[m.end():], ts, None, tag_means_foreign=True, boot_time=boot_time)
    m = _RFC5424.match(line)
    if m:
        ts = _iso(m["iso"])
        msg = line[m.end():].removeprefix("\ufeff")
        if m["app"] != "kernel":
            return _foreign(msg, ts, m["app"])
        return _kernel_msg(msg, ts, None, boot_time, KERNEL)
    if _BROADCAST.match(line) or _PSTORE_HEAD.match(line):
        return Stamp("", None, None, HEADER)
    m = _KERNEL_TAG.match(line)
    if m:
        return _kernel_msg(line[m.end():], None, None, boot_time, KERNEL)
    if depth < 3:
        if line.startswith("{") and line.rstrip().endswith("}"):
            js = _json_line(line, boot_time, year_hint, depth)
            if js is not None:
                return js
        m = _GREP_FILE.match(line) or _GREP_NUM.match(line) or _COMPOSE.match(line) or _POD_NAME.match(line)
        if m:
            st = _split(line[m.end():].lstrip(), boot_time, year_hint, depth + 1)
            if st.origin != BARE:
                return st
    return Stamp(line.strip(), None, None, BARE)


def _wrapped(inner: str, ts: float | None, boot_time: float | None, year_hint: int | None, depth: int) -> Stamp:
    """A container-log wrapper: the inner text must prove it is the kernel's (a dmesg or syslog
    prefix); bare text inside a wrapper is an application's output."""
    st = _split(inner, boot_time, year_hint, depth + 1)
    if st.origin == BARE:
        return _foreign(st.msg, ts, "container")
    if st.ts is None and ts is not None and st.rel is None:
        return Stamp(st.msg, ts, st.kmsg_seq, st.origin, st.program, st.rel, st.delta, st.fields)
    return st


def _json_line(line: str, boot_time: float | None, year_hint: int | None, depth: int) -> Stamp | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("MESSAGE"), str):  # journalctl -o json
        ts = None
        rt = obj.get("__REALTIME_TIMESTAMP")
        if isinstance(rt, str) and rt.isdigit():
            ts = int(rt) / 1e6
        msg = obj["MESSAGE"][:MAX_LINE]
        if obj.get("_TRANSPORT") == "kernel" or (obj.get("SYSLOG_IDENTIFIER") == "kernel"
                                                 and "_TRANSPORT" not in obj):
            return _kernel_msg(msg, ts, None, boot_time, KERNEL)
        return _foreign(msg, ts, str(obj.get("SYSLOG_IDENTIFIER") or obj.get("_COMM") or "journal")[:64])
    if isinstance(obj.get("log"), str):  # docker json-file
        t = obj.get("time")
        return _wrapped(obj["log"].rstrip("\n")[:MAX_LINE], _iso(t) if isinstance(t, str) else None,
                        boot_time, year_hint, depth)
    return None


def _civil(year: int, mon: str, day: int, hms: str) -> float | None:
    mo = month_number(mon)
    if mo is None:
        return None
    try:
        h, mi, s = (int(x) for x in hms.split(":"))
        return datetime(year, mo, day, h, mi, s).timestamp()  # dmesg -T and syslog print local time
    except (ValueError, OverflowError):
        return None


_TZ = lazy(r"([+-])(\d\d)(\d\d)$")


def _iso(text: str) -> float | None:
    t = text.replace(",", ".").replace(" ", "T")
    if t.endswith("Z"):
        t = t[:-1] + "+00:00"
    m = _TZ.search(t)
    if m:
        t = t[: m.start()] + f"{m[1]}{m[2]}:{m[3]}"
    dot = t.find(".")
    if dot > 0:  # Python takes at most 6 fraction digits
        end = dot + 1
        while end < len(t) and t[end].isdigit():
            end += 1
        t = t[:dot + 1] + t[dot + 1:end][:6] + t[end:]
    try:
        dt = datetime.fromisoformat(t)
    except ValueError:
        return None
    if dt.tzinfo is None:
        return dt.timestamp()
    return dt.astimezone(UTC).timestamp()


# --------------------------------------------------------------------------- messages

_PCI = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_XID = lazy(
    rf"^NVRM: (?:GPU\d{{1,3}} )?Xid \((?:PCI:)?(?:(?P<pci>{_PCI})|[^)\s]{{0,32}})\): (?P<xid>\d{{1,7}})"
    r"(?:, pid=(?:'?<unknown>'?|(?P<pid>\d{1,10})))?(?:, {1,8}name=(?P<name>[^,]{0,256}))?(?:, )?")
_XID_START = lazy(r"^NVRM: (?:GPU\d{1,3} )?Xid\b")
_GPU_PCI = lazy(rf"GPU (?:at )?(?:PCI:)?(?P<pci>{_PCI})\b")
_NVRM_GPU = lazy(rf"^NVRM: (?:The NVIDIA GPU|GPU at PCI:|GPU) ?(?P<pci>{_PCI})")
_DEV_PCI = lazy(rf"^[\w.-]{{1,48}} (?P<pci>{_PCI})[: ]")
_PAREN_PCI = lazy(rf"\(PCI:(?P<pci>{_PCI})\)")
_AER_LINE = lazy(rf"^(?:[\w.-]{{1,48}} )?(?P<pci>{_PCI}): (?:AER: )?")
_AER_RECV = lazy(
    r"(?:Multiple )?(?P<sev>Corrected|Correctable|Uncorrected \((?:Fatal|Non-Fatal)\)|Uncorrectable"
    r"(?: \((?:Fatal|Non-Fatal)\))?|Fatal|Non-Fatal) errors? (?:message )?received",
    re.I,
)
_AER_HEAD = lazy(r"^(?:Multiple )?(?P<sev>Corrected|Correctable|Uncorrected \((?:Fatal|Non-Fatal)\)|"
                       r"Uncorrectable(?: \((?:Fatal|Non-Fatal)\))?) err", re.I)  # "… error rece>" cut by a pager
_AER_SEV = lazy(r"severity=(?P<sev>[^,\]]{1,32})", re.I)
_AER_DETAIL = lazy(r"^(?:\s{0,8}\[\s{0,3}\d{1,2}\] \S|\s{0,8}device \[|\s{0,8}TLP Header|Device recovery)")
_EDAC = lazy(r"EDAC (?:\w{1,32} )?MC(?P<mc>\d{1,4}): (?P<n>\d{1,12}) (?P<t>CE|UE) ")
_MCE = lazy(r"^(?:mce|MCE): \[Hardware Error\]: ")
_HWERR = lazy(r"^(?:\{(?P<rec>\d{1,10})\})?\[Hardware Error\]:\s{0,8}")
_GHES_SEV = lazy(r"^event severity: (?P<sev>\w{1,16})")
_SXID = lazy(rf"^nvidia-nvswitch\d{{0,3}}: SXid \(PCI:(?P<pci>{_PCI})\): (?P<sxid>\d{{1,7}})(?:, (?P<rest>[^,]{{0,32}}))?")
_NVRM_FAMILY = lazy(
    r"GSP|gsp|[Hh]eartbeat|RPC|[Rr]pc|RmInit|rm_init|NV_ERR_|[Aa]ssert|Cannot|failed|[Tt]ime(?:d )?out|probe|"
    r"[Rr]eset|lost|[Ee]rror|fatal|[Ff]all(?:en)? off|WPR2|recovery|ECC|[Rr]emap|[Dd]rain")
_LINK = lazy(r"(?i)\blink (?:is )?(?:down|up)\b|\blink (?:status )?definitely (?:down|up)\b|"
                   r"\bport: ?\d{1,3} link (?:down|active|init|armed)\b")
_NIC_FAMILY = lazy(r"(?i)PCIe bandwidth|module (?:\d{1,3}, )?\S{0,16} ?error|cable error|"
                         r"\bhealth\b|syndrome|firmware (?:error|fatal)|\bfatal\b|internal error|"
                         r"high temperature|over[- ]?temperature|PCIe slot power")
_PROBE = lazy(r"probe of \S{1,64} failed|probe with driver \S{1,64} failed")
# "mlx5_core 0000:53:00.0 enp83s0f0np0: …", "bond0: (slave x): …", "nvidia: probe of …": a driver or device
# names itself before the message (a bare word like "Health" in someone's table does not)
_DEVICE_PREFIX = lazy(r"^[\w.-]{1,48}(?: [\w.:@()-]{1,64}){0,3}: ")
_CARRIER = lazy(r"(?i)\b(?:lost|gained) carrier\b|carrier: link (?:connected|disconnected)|"
                      r"\bcarrier[- ]changed\b|\bcarrier (?:is )?(?:on|off|up|down)\b")
_CARRIER_PROGRAMS = frozenset({"systemd-networkd", "NetworkManager"})


def _severity(text: str) -> str:
    t = text.strip().lower()
    if t.startswith("correct"):
        return "corrected"
    if "non-fatal" in t or "nonfatal" in t:
        return "non-fatal"
    if "fatal" in t:
        return "fatal"
    return "uncorrected"


def parse_kernel_line(
    line: str,
    *,
    year_hint: int | None = None,
    boot_time: float | None = None,
    default_ts: float | None = None,
) -> KernelEvent | None:
    """One line, read on its own -> a :class:`KernelEvent`, or ``None``. A line with no prefix is
    taken as the kernel's (use :class:`KernelLineParser` for streams, where context decides)."""
    if not line:
        return None
    stamp = split_prefix(line, boot_time=boot_time, year_hint=year_hint)
    if stamp.origin in (FOREIGN, HEADER):
        return _carrier(stamp, default_ts, line) if stamp.origin == FOREIGN else None
    ts = stamp.ts if stamp.ts is not None else (default_ts or 0.0)
    return _event(stamp, _clamp(ts), line[:MAX_LINE].split("\n", 1)[0].strip())


def _clamp(ts: float) -> float:
    return min(max(ts, 0.0), 1e11)


def _event(stamp: Stamp, ts: float, raw: str) -> KernelEvent | None:
    ev = classify(_untruncate(stamp.msg), ts, raw)
    if ev is not None and ev.pci_addr is None:
        for k, v in stamp.fields:
            if k == "DEVICE" and (m := _DEVICE_PCI.match(v)):
                ev.pci_addr = normalise_pci(m["pci"])
    return ev


def _carrier(stamp: Stamp, default_ts: float | None, raw: str) -> KernelEvent | None:
    if stamp.program not in _CARRIER_PROGRAMS or not _CARRIER.search(stamp.msg):
        return None
    ts = stamp.ts if stamp.ts is not None else (default_ts or 0.0)
    return KernelEvent(ts=_clamp(ts), kind="other", line=raw[:MAX_LINE].strip(),
                       message=f"{stamp.program}: {stamp.msg.strip()}")


def _untruncate(msg: str) -> str:
    """``journalctl`` in a pager ends a cut line with ``>`` or ``…``: drop the marker."""
    if msg.endswith("…"):
        return msg[:-1]
    if msg.endswith(">") and not msg.endswith("<>") and len(msg) > 1 and msg[-2] not in " <-=":
        return msg[:-1]
    if msg.endswith("=>"):
        return msg[:-1]
    return msg


def classify(msg: str, ts: float, raw: str) -> KernelEvent | None:
    """A kernel message (prefixes gone) -> an event, or None when no rule family reads it."""
    msg = msg.strip()
    if not msg:
        return None
    sev: str | None
    if msg.startswith("NVRM"):
        return _nvrm(msg, ts, raw)
    if "EDAC" in msg:
        m = _EDAC.search(msg)
        if m:
            sev = "corrected" if m["t"] == "CE" else "uncorrected"
            return KernelEvent(ts=ts, kind="edac", line=raw, severity=sev, message=msg)
        if "rror" in msg:
            return KernelEvent(ts=ts, kind="other", line=raw, message=msg)
        return None
    if _MCE.match(msg):
        body = msg[msg.index("]:") + 2:].strip()
        low = body.lower()
        sev = "uncorrected" if "uncorrected" in low else "corrected" if "corrected" in low else None
        return KernelEvent(ts=ts, kind="mce", line=raw, severity=sev, message=body)
    if "[Hardware Error]" in msg:
        return KernelEvent(ts=ts, kind="other", line=raw, message=msg)
    if msg.startswith("nvidia-nvswitch"):
        m = _SXID.match(msg)
        if m:
            rest = (m["rest"] or "").lower()
            sev = "non-fatal" if rest.startswith("non-fatal") else "fatal" if rest.startswith("fatal") else None
            return KernelEvent(ts=ts, kind="other", line=raw, pci_addr=normalise_pci(m["pci"]), severity=sev,
                               message=msg)
        return None
    m = _AER_LINE.match(msg)
    if m and ("AER" in msg or "PCIe Bus Error" in msg or _AER_DETAIL.match(msg[m.end():])
              or "Surprise Down" in msg):
        body = msg[m.end():]
        r = _AER_RECV.search(body) or _AER_SEV.search(body) or _AER_HEAD.match(body)
        if r is not None or _AER_DETAIL.match(body) or "PCIe Bus Error" in body or "Surprise Down" in body:
            sev = _severity(r["sev"]) if r else None
            return KernelEvent(ts=ts, kind="aer", line=raw, pci_addr=normalise_pci(m["pci"]), severity=sev,
                               message=body.strip())
    if _DEVICE_PREFIX.match(msg) and ((_LINK.search(msg) and "SATA link" not in msg) or _NIC_FAMILY.search(msg)
                                      or _PROBE.search(msg)):
        d = _DEV_PCI.match(msg)
        return KernelEvent(ts=ts, kind="other", line=raw, pci_addr=normalise_pci(d["pci"]) if d else None,
                           message=msg)
    if "fallen off the bus" in msg:
        return _fell(msg, ts, raw)
    return None


def _fell(msg: str, ts: float, raw: str) -> KernelEvent:
    m = _GPU_PCI.search(msg)
    pci = normalise_pci(m["pci"]) if m else None
    return KernelEvent(ts=ts, kind="fell_off_bus", line=raw, pci_addr=pci, severity="fatal", message=msg)


def _nvrm(msg: str, ts: float, raw: str) -> KernelEvent | None:
    m = _XID.match(msg)
    if m:
        return KernelEvent(
            ts=ts, kind="xid", line=raw, pci_addr=normalise_pci(m["pci"]) if m["pci"] else None,
            xid=min(int(m["xid"]), 1_000_000),
            pid=int(m["pid"]) if m["pid"] else None, message=msg[m.end():].strip(),
        )
    if _XID_START.match(msg):
        return KernelEvent(ts=ts, kind="other", line=raw, message=msg)  # cut short
    if "fallen off the bus" in msg:
        return _fell(msg, ts, raw)
    if _NVRM_FAMILY.search(msg):
        g = _GPU_PCI.search(msg)
        return KernelEvent(ts=ts, kind="other", line=raw, pci_addr=normalise_pci(g["pci"]) if g else None,
                           message=msg)
    return None


_MARKER = lazy(r"^(?:-- (?:Logs begin|Journal begins|Boot [0-9a-f]|No entries|Reboot)|"
                     r"[\w.-]{1,64}@[\w.-]{1,64}:[^#$\n]{0,256}[#$] |\$ |# (?:dmesg|journalctl|cat|grep|zcat|tail) )")


@dataclass
class KernelLineParser:
    """The stream reader: one instance per source, fed line by line (or /dev/kmsg record by record).

    What one line cannot say alone:

    * origin: a line with no prefix right after a prefixed one continues it (wrapped text: its
      origin is inherited and the joined text is read again); after a blank line, a shell prompt or
      a journal marker it stands alone, and is the kernel's unless the stream is a syslog (tagged)
      one, where only tagged lines count;
    * several syslog records joined into one line (``kernel: … kernel: …``) are read one by one;
    * ``/dev/kmsg`` dictionary lines read from a file (`` SUBSYSTEM=pci`` / `` DEVICE=+pci:…``)
      belong to the record before them;
    * ``dmesg -H`` ``[  +0.000123]`` stamps count from the last absolute stamp;
    * "fallen off the bus" without a Xid spans three lines: the PCI address is taken from the NVRM
      line that named a GPU just before;
    * AER detail lines inherit the severity of their device's last header line; APEI/GHES record
      lines (``{N}[Hardware Error]:``) the record's ``event severity``.
    """

    boot_time: float | None = None
    year_hint: int | None = None
    default_ts: float | None = None
    _last_gpu: str | None = None
    _aer_sev: dict[str, str] = field(default_factory=dict)
    _ghes_sev: dict[str, str] = field(default_factory=dict)
    _open: bool = False  # the previous line may continue on this one
    _prev_origin: str = BARE
    _tagged: bool = False  # a syslog / journal stream: only tagged kernel lines count
    _prev_msg: str = ""
    _prev_ev: KernelEvent | None = None
    _last_ts: float | None = None
    lines_seen: int = 0
    lines_matched: int = 0
    lines_cut: int = 0  # over MAX_LINE, cut before reading
    lines_foreign: int = 0  # logged by another program: never an event (carrier state aside)
    lines_kernel: int = 0  # lines with a prefix that proves the kernel wrote them, or that gave an event
    last_kernel: bool = False  # the line fed last was read as the kernel's (callers that read more from it)

    def feed(self, line: str) -> KernelEvent | None:
        """One line -> its first event (see :meth:`feed_all` for lines that hold several records)."""
        evs = self.feed_all(line)
        return evs[0] if evs else None

    def feed_all(self, line: str) -> list[KernelEvent]:
        self.lines_seen += 1
        self.last_kernel = False
        if len(line) > MAX_LINE:
            self.lines_cut += 1
            line = line[:MAX_LINE]
        if self._prev_ev is not None and line.startswith(" ") and "=" in line and (d := _DICT_LINE.match(line)):
            self._dict_line(d["k"], d["v"])
            return []
        if not line.strip() or _MARKER.match(line):
            self._open = False
            return []
        stamp = split_prefix(line, boot_time=self.boot_time, year_hint=self.year_hint)
        if stamp.origin == HEADER:
            self._open = False
            return []
        if stamp.program:
            self._tagged = True
        if stamp.origin == FOREIGN:
            self.lines_foreign += 1
            self._open, self._prev_origin, self._prev_msg, self._prev_ev = True, FOREIGN, "", None
            return self._count([_carrier(stamp, self._ts(stamp), line)])
        raw = line.split("\n", 1)[0].strip()
        if stamp.origin == BARE:
            if self._open:
                self.last_kernel = self._prev_origin == KERNEL
                return self._continuation(stamp.msg, raw)
            if self._tagged:
                self.lines_foreign += 1
                return []
        self.last_kernel = True
        ts = self._ts(stamp)
        self._open, self._prev_origin = stamp.origin != BARE, KERNEL
        self.lines_kernel += stamp.origin == KERNEL
        pieces = [stamp]
        if stamp.program == KERNEL and " kernel: " in stamp.msg:  # records joined into one line
            pieces = [Stamp(p, stamp.ts, None, KERNEL, KERNEL, stamp.rel, stamp.delta, stamp.fields)
                      for p in (_kernel_msg(x, None, None, None).msg for x in stamp.msg.split(" kernel: "))]
        out = []
        for st in pieces:
            ev = _event(st, ts, raw)
            self._prev_msg, self._prev_ev = st.msg, ev
            m = _NVRM_GPU.search(st.msg)
            if m:
                self._last_gpu = normalise_pci(m["pci"])
            if ev is not None:
                out.append(self._context(ev))
        self.lines_kernel += bool(out) and stamp.origin == BARE
        return self._count(out)

    def _ts(self, stamp: Stamp) -> float:
        if stamp.ts is not None:
            self._last_ts = stamp.ts
            return _clamp(stamp.ts)
        if stamp.delta is not None and (self._last_ts is not None or self.boot_time is not None):
            self._last_ts = (self._last_ts if self._last_ts is not None else self.boot_time or 0.0) + stamp.delta
            return _clamp(self._last_ts)
        return _clamp(self.default_ts or 0.0)

    def _count(self, evs: Sequence[KernelEvent | None]) -> list[KernelEvent]:
        out = [e for e in evs if e is not None]
        self.lines_matched += bool(out)
        return out

    def _continuation(self, text: str, raw: str) -> list[KernelEvent]:
        """A bare line right after a prefixed one: the rest of that line."""
        if self._prev_origin != KERNEL:
            self.lines_foreign += 1
            return []
        joined = f"{self._prev_msg} {text}"[:MAX_LINE]
        prev = self._prev_ev
        ev = classify(_untruncate(joined), prev.ts if prev else _clamp(self._last_ts or self.default_ts or 0.0),
                      f"{prev.line if prev else self._prev_msg} {raw}"[:MAX_LINE])
        self._prev_msg = joined
        if ev is None or (prev is not None and prev.kind == ev.kind and prev.kind != "other"):
            return []
        if prev is not None and prev.kind == ev.kind == "other":
            return []
        self._prev_ev = ev
        return self._count([self._context(ev)])

    def _dict_line(self, key: str, value: str) -> None:
        ev = self._prev_ev
        if ev is not None and key == "DEVICE" and ev.pci_addr is None and (m := _DEVICE_PCI.match(value)):
            ev.pci_addr = normalise_pci(m["pci"])

    def _context(self, ev: KernelEvent) -> KernelEvent:
        if ev.kind == "fell_off_bus" and ev.pci_addr is None and self._last_gpu:
            ev.pci_addr = self._last_gpu
        elif ev.kind == "aer" and ev.pci_addr:
            if ev.severity:
                self._aer_sev[ev.pci_addr] = ev.severity
            else:
                ev.severity = self._aer_sev.get(ev.pci_addr)
        elif ev.kind == "other" and (h := _HWERR.match(ev.message)):
            rec = h["rec"] or ""
            s = _GHES_SEV.match(ev.message[h.end():])
            if s:
                self._ghes_sev[rec] = s["sev"].lower()
            elif "Hardware error from APEI" in ev.message:
                self._ghes_sev.pop(rec, None)  # a new record starts
            ev.severity = self._ghes_sev.get(rec)
        return ev
