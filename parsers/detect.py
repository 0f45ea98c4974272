"""Sniff a capture's format from its content (never from its file name) (pure)."""

from __future__ import annotations

import re

from parsers.base import ParseError

UNKNOWN = "unknown"

# (format, test) in order: specific shapes first, the kernel log (the catch-all) last. Every pattern
# stays on one line ([ \t], never \s, where a line is meant) with bounded repeats, so a hostile
# capture costs linear time (security review F13; `python -m benchmarks --only kernel_reader` times
# every parser and this sniffing on hostile lines).
_TESTS: list[tuple[str, re.Pattern[str]]] = [
    ("nvidia-smi-xml", re.compile(r"<nvidia_smi_log\b")),
    ("nvidia-smi-q", re.compile(r"^=+NVSMI LOG=+[ \t]*$|^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7][ \t]*\n"
                                r"[ \t]{4}\S[^\n]{0,256} : ", re.M)),
    ("nvidia-smi-table", re.compile(r"NVIDIA-SMI \d{1,4}\.\d{1,4}[^\n]{0,256}Driver Version|^\|[ \t]+GPU[ \t]+Name[ \t]+|"
                                    r"Unable to determine the device handle for GPU", re.M)),
    ("nvidia-smi-nvlink", re.compile(r"^GPU \d{1,7}: [^\n]{0,512}\(UUID: [^)\n]{0,128}\)[ \t]*\n[ \t]{1,16}"
                                     r"(?:Link \d{1,3}[:,]|NVML: )|Unable to retrieve NVLink information", re.M | re.I)),
    ("dcgmi-nvlink-status", re.compile(r"NvLink Link Status|^[ \t]{1,32}gpuId \d{1,7}:[ \t]*\n[ \t]{1,32}[UDX_]"
                                       r"(?: [UDX_]){1,64}[ \t]*$", re.M)),
    ("dcgm-hostengine-log", re.compile(r"\[\[Health\]\] Detected")),
    ("dcgm-exporter", re.compile(r"^(?:# (?:HELP|TYPE) \w{1,256}|DCGM_\w{1,256}(?:\{[^}\n]{0,4096}\})? \S{1,64}[ \t]*$)",
                                 re.M)),
    ("fabricmanager-log", re.compile(r"^\[\w{3} \d{1,2} \d{4} \d\d:\d\d:\d\d\] \[(?:INFO|WARNING|ERROR|FATAL)\] "
                                     r"\[tid \d{1,10}\]", re.M)),
    ("dcgmi-health", re.compile(r'^\|[ \t]{0,8}Overall Health[ \t]{1,64}\||^[ \t]{0,32}"Overall Health"[ \t]*:', re.M)),
    ("dcgmi-dmon", re.compile(r"^#[ \t]?Entity[ \t]{1,16}[A-Z]", re.M)),
    ("iblinkinfo", re.compile(r"^[ \t]{0,64}(?:0x[0-9a-f]{1,16}[ \t]{1,16})?\d{1,6}[ \t]{1,16}\d{1,4}\[[^\]\n]{0,8}\]"
                              r"[ \t]{0,8}==\([^\n]{0,80}\)==>", re.M)),
    ("dcgmi-diag", re.compile(r"^\|[ \t]{0,8}(?:Diagnostic|Deployment|Denylist|Blacklist|GPU Memory|PCIe|Info|Warning|"
                              r"Memory Bandwidth|Targeted \w{1,32})[ \t]{1,64}\|", re.M)),
    ("ibstat", re.compile(r"^CA '[^'\n]{1,64}'[ \t]*\n[ \t]{1,16}CA type:", re.M)),
    ("ibstat", re.compile(r"^[ \t]{1,16}Physical state:[ \t]{1,16}\w", re.M)),  # a grep'd fragment, no CA header
    ("ibstatus", re.compile(r"^Infiniband device '[^'\n]{1,64}' port \d{1,3} status:", re.M)),
    ("perfquery", re.compile(r"^# [\w ]{0,64}counters: (?:Lid \d{1,6} )?port \d{1,3}", re.M)),
    ("perfquery", re.compile(r"^(?:SymbolErrorCounter|LinkDownedCounter|PortRcvErrors|PortXmitWait):\.{3,64}\S{1,24}"
                             r"[ \t]*$", re.M)),  # grep'd, no header
    ("ibqueryerrors", re.compile(r"^Errors for (?:0x[0-9a-f]{1,16} )?\"|^## Summary: \d{1,9} nodes checked", re.M)),
    ("ibnetdiscover", re.compile(r"^(?:CA|SW|RT)[ \t]{1,16}\d{1,6}[ \t]{1,16}\d{1,4}[ \t]{1,16}0x[0-9a-f]{1,16}[ \t]{1,16}"
                                 r"\d{1,2}x[ \t]{1,16}\S", re.M)),
    ("ib-counter-dump", re.compile(r"^=== (?:\./)?\w{1,64} ===[ \t]*$", re.M)),
    ("ethtool-stats", re.compile(r"^NIC statistics:[ \t]*$", re.M)),
    ("ethtool-settings", re.compile(r"^Settings for \S{1,64}:[ \t]*$", re.M)),
    ("ras-mc-ctl", re.compile(r"^(?:No Memory errors\.|MCE events:|Memory controller events:|Label[ \t]{1,64}CE[ \t]{1,8}UE|"
                              r"Memory controller events summary:|MCE records summary:|No PCIe AER errors\.)[ \t]*$",
                              re.M)),
    ("mcelog", re.compile(r"mcelog(?:\[\d{1,10}\])?: (?:MCA|STATUS|Hardware event)|^Hardware event\. This is not a "
                          r"software error\.[ \t]*$", re.M)),
    ("lspci-vvv", re.compile(r"^(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7] [^:\n]{1,128}: [^\n]{0,512}\n"
                             r"(?:\t[^\n]{0,512}\n){0,16}?\t(?:Subsystem|Control|Physical Slot|Flags):", re.M)),
    ("sysfs-aer", re.compile(r"^(?:/sys)?/(?:bus/pci/devices|devices/[^\s/]{1,64}(?:/[^\s/]{1,64}){0,8}?)/"
                             r"[0-9a-fA-F:.]{12}/aer_dev_\w{1,16}:", re.M)),
    ("lspci-vvv", re.compile(r"^[ \t]{0,16}LnkSta:[ \t]{1,8}Speed [\d.]{1,5}GT/s", re.M)),  # a grep'd fragment
    ("kernel-log", re.compile(r"^(?:\[[ \t]{0,16}\d{1,12}\.\d{1,9}\]|\[\w{3} \w{3} {1,2}\d{1,2} [\d:]{8} \d{4}\]|"
                              r"\d{1,4},\d{1,20},\d{1,20},[^;\n]{0,32};|\S{3,4}[ \t]{1,3}\d{1,2} \d\d:\d\d:\d\d |"
                              r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d|kern[ \t]{0,8}:|kernel: |NVRM: )", re.M)),
]


def detect_format(text: str, path: str | None = None) -> str:
    """Return the format name; raise :class:`ParseError` when nothing matches. ``path`` is only
    used in the error message: the name of a file says nothing reliable about its content."""
    head = text[:200_000]
    for fmt, test in _TESTS:
        if test.search(head):
            return fmt
    where = f" {path}" if path else ""
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")[:60]
    raise ParseError("detect", f"unrecognised format{where}: first line {first!r}")
