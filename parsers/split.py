"""One file, several captures: split pasted sessions and bundles into the outputs they hold (pure).

A support bundle (``nvidia-bug-report.log``), an issue comment or a shell session pasted into a file
holds several tools' outputs one after another. Each is cut out at the lines that start one: a shell
prompt with a command (``root@node:~# ibstat``, ``[root@n01 ~]# dmesg``, ``$ dcgmi health -c``), a
command line of a known tool on its own (``nvidia-smi -q``), a comment naming one (``# ethtool -i
output``), a bug-report section rule (``____…``) or a ``==> file <==`` header, and markdown fences.
The command, when there is one, travels with its part as a format hint (``ethtool -S eth0 | grep
err`` has no ``NIC statistics:`` header left).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleethealth.lazyregex import LazyPattern, lazy

MAX_PARTS = 256

# tools whose command line, alone on a line, starts a capture
TOOLS = ("nvidia-smi", "dcgmi", "dmesg", "journalctl", "ibstat", "ibstatus", "perfquery", "ibqueryerrors",
         "iblinkinfo", "ibnetdiscover", "ethtool", "lspci", "ras-mc-ctl", "mcelog", "talosctl", "ibv_devinfo",
         "mlxlink", "nvidia-bug-report.sh")
# after a bare "#", "$" or ">" prompt, also these
SHELL = TOOLS + ("cat", "grep", "egrep", "zcat", "tail", "head", "less", "kubectl", "sudo", "ls", "find", "for")
_TOOL = "|".join(re.escape(t) for t in TOOLS)
_SHELL = "|".join(re.escape(t) for t in SHELL)
_PROMPT = lazy(
    r"^(?:\[[\w.@-]{1,64}[^\]\n]{0,128}\][#$]|[\w.-]{1,64}@[\w.-]{1,64}:[^#$\n]{0,256}[#$])\s{1,4}"
    r"(?P<cmd>\S.{0,1000})$")
_SHORT_PROMPT = lazy(rf"^[#$>]\s{{1,4}}(?P<cmd>(?:{_SHELL})\b.{{0,1000}})$")
_BARE_CMD = lazy(rf"^(?:sudo\s+)?(?P<cmd>(?:{_TOOL})(?:\s+[^\n]{{0,1000}})?)\s*$")
_COMMENT_CMD = lazy(rf"^#+\s{{0,4}}(?P<cmd>(?:sudo\s+)?(?:{_TOOL})\b[^\n]{{0,1000}})$")
_RULE = lazy(r"^_{20,}\s*$")
_TAIL_HEAD = lazy(r"^==> (?P<cmd>.{1,512}) <==\s*$")
_FENCE = lazy(r"^\s{0,3}```")

# a command line -> the parser that reads its output (first match wins)
_HINTS: list[tuple[LazyPattern, str]] = [
    (lazy(r"\bnvidia-smi\b.*\bnvlink\b"), "nvidia-smi-nvlink"),
    (lazy(r"\bnvidia-smi\b.*--query-\w+="), "nvidia-smi-csv"),
    (lazy(r"\bnvidia-smi\b.*(?:-q\b.*-x|-x\b.*-q|--xml)"), "nvidia-smi-xml"),
    (lazy(r"\bnvidia-smi\b.*(?:-q\b|--query(?:\s|$))"), "nvidia-smi-q"),
    (lazy(r"\bnvidia-smi\s*$"), "nvidia-smi-table"),
    (lazy(r"\bdcgmi\s+diag\b"), "dcgmi-diag"),
    (lazy(r"\bdcgmi\s+health\b"), "dcgmi-health"),
    (lazy(r"\bdcgmi\s+dmon\b"), "dcgmi-dmon"),
    (lazy(r"\bdcgmi\s+nvlink\b"), "dcgmi-nvlink-status"),
    (lazy(r"\bibstatus\b"), "ibstatus"),
    (lazy(r"\bibstat\b"), "ibstat"),
    (lazy(r"\bperfquery\b"), "perfquery"),
    (lazy(r"\bibqueryerrors\b"), "ibqueryerrors"),
    (lazy(r"\biblinkinfo\b"), "iblinkinfo"),
    (lazy(r"\bethtool\s+(?:-S|--statistics)\b"), "ethtool-stats"),
    (lazy(r"\bethtool\s+-i\b"), "ethtool-info"),
    (lazy(r"\bethtool\s+\S+\s*$"), "ethtool-settings"),
    (lazy(r"\blspci\b"), "lspci-vvv"),
    (lazy(r"/aer_dev_(?:correctable|fatal|nonfatal)\b"), "sysfs-aer"),
    (lazy(r"\bras-mc-ctl\b"), "ras-mc-ctl"),
    (lazy(r"\bmcelog\b"), "mcelog"),
    (lazy(r"\b(?:dmesg|journalctl|talosctl\s+dmesg)\b|/var/log/|kern\.log|messages\b|syslog\b"), "kernel-log"),
]


@dataclass(frozen=True, slots=True)
class Part:
    title: str  # the command (or section header) that produced it; "" for the text before any
    text: str
    hint: str | None  # the format its command implies, when known


def hint_for(cmd: str) -> str | None:
    for rx, fmt in _HINTS:
        if rx.search(cmd):
            return fmt
    return None


def _marker(line: str) -> str | None:
    """The command / header a line starts a capture with, or None."""
    if len(line) > 1100:
        return None
    for rx in (_PROMPT, _SHORT_PROMPT, _TAIL_HEAD, _COMMENT_CMD, _BARE_CMD):
        m = rx.match(line)
        if m:
            return m["cmd"].strip()
    if _RULE.match(line):
        return ""
    return None


def split_captures(text: str) -> list[Part]:
    """The captures in ``text``, in order; text without markers is one part. Parts with no content
    (a prompt with no output) are dropped."""
    parts: list[Part] = []
    title, buf = "", []
    for line in text.splitlines():
        if _FENCE.match(line):
            continue
        cmd = _marker(line) if len(parts) < MAX_PARTS else None
        if cmd is None:
            buf.append(line)
            continue
        _flush(parts, title, buf)
        title, buf = cmd, []
    _flush(parts, title, buf)
    return parts


def _flush(parts: list[Part], title: str, buf: list[str]) -> None:
    body = "\n".join(buf)
    if body.strip():
        parts.append(Part(title, body + "\n", hint_for(title) if title else None))
