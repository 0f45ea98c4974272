"""Sniff a capture's format from its content (never from its file name) (pure)."""

from __future__ import annotations

import re

from collectors.parsers.base import ParseError

UNKNOWN = "unknown"

# (format, test) in order: specific shapes first, the kernel log (the catch-all) last.
_TESTS: list[tuple[str, re.Pattern[str]]] = [
    ("nvidia-smi-xml", re.compile(r"<nvidia_smi_log\b")),
    ("nvidia-smi-q", re.compile(r"^=+NVSMI LOG=+\s*$|^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]\s*\n"
                                r"\s{4}\S.* : ", re.M)),
    ("nvidia-smi-table", re.compile(r"NVIDIA-SMI \d+\.\d+.*Driver Version|^\|\s+GPU\s+Name\s+|Unable to determine "
                                    r"the device handle for GPU", re.M)),
    ("nvidia-smi-nvlink", re.compile(r"^GPU \d+: .*\(UUID: [^)]*\)\s*\n\s+(?:Link \d+[:,]|NVML: )|Unable to retrieve "
                                     r"NVLink information", re.M | re.I)),
    ("dcgmi-nvlink-status", re.compile(r"NvLink Link Status|^\s+gpuId \d+:\s*\n\s+[UDX_](?: [UDX_])+\s*$", re.M)),
    ("dcgm-hostengine-log", re.compile(r"\[\[Health\]\] Detected")),
    ("dcgm-exporter", re.compile(r"^(?:# (?:HELP|TYPE) \w+|DCGM_\w+(?:\{[^}]*\})? \S+\s*$)", re.M)),
    ("fabricmanager-log", re.compile(r"^\[\w{3} \d{1,2} \d{4} \d\d:\d\d:\d\d\] \[(?:INFO|WARNING|ERROR|FATAL)\] "
                                     r"\[tid \d+\]", re.M)),
    ("dcgmi-health", re.compile(r'^\|\s*Overall Health\s+\||^\s*"Overall Health"\s*:', re.M)),
    ("dcgmi-dmon", re.compile(r"^#\s?Entity\s+[A-Z]", re.M)),
    ("iblinkinfo", re.compile(r"^\s*(?:0x[0-9a-f]+\s+)?\d+\s+\d+\[[^\]]*\]\s*==\(.{0,80}\)==>", re.M)),
    ("dcgmi-diag", re.compile(r"^\|\s*(?:Diagnostic|Deployment|Denylist|Blacklist|GPU Memory|PCIe|Info|Warning|"
                              r"Memory Bandwidth|Targeted \w+|Diagnostic)\s+\|", re.M)),
    ("ibstat", re.compile(r"^CA '[^']+'\s*\n\s+CA type:", re.M)),
    ("ibstat", re.compile(r"^\s+Physical state:\s+\w+", re.M)),  # a grep'd fragment, no CA header
    ("ibstatus", re.compile(r"^Infiniband device '[^']+' port \d+ status:", re.M)),
    ("perfquery", re.compile(r"^# [\w ]*counters: (?:Lid \d+ )?port \d+", re.M)),
    ("perfquery", re.compile(r"^(?:SymbolErrorCounter|LinkDownedCounter|PortRcvErrors|PortXmitWait):\.{3,}\S+\s*$",
                             re.M)),  # grep'd, no header
    ("ibqueryerrors", re.compile(r"^Errors for (?:0x[0-9a-f]+ )?\"|^## Summary: \d+ nodes checked", re.M)),
    ("ibnetdiscover", re.compile(r"^(?:CA|SW|RT)\s+\d+\s+\d+\s+0x[0-9a-f]+\s+\d+x\s+\S+", re.M)),
    ("ib-counter-dump", re.compile(r"^=== (?:\./)?\w+ ===\s*$", re.M)),
    ("ethtool-stats", re.compile(r"^NIC statistics:\s*$", re.M)),
    ("ethtool-settings", re.compile(r"^Settings for \S+:\s*$", re.M)),
    ("ras-mc-ctl", re.compile(r"^(?:No Memory errors\.|MCE events:|Memory controller events:|Label\s+CE\s+UE|"
                              r"Memory controller events summary:|MCE records summary:|No PCIe AER errors\.)\s*$",
                              re.M)),
    ("mcelog", re.compile(r"mcelog(?:\[\d+\])?: (?:MCA|STATUS|Hardware event)|^Hardware event\. This is not a "
                          r"software error\.\s*$", re.M)),
    ("lspci-vvv", re.compile(r"^(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7] [^:\n]+: .*\n(?:\t.*\n)*?\t(?:Subsystem|"
                             r"Control|Physical Slot|Flags):", re.M)),
    ("sysfs-aer", re.compile(r"^(?:/sys)?/(?:bus/pci/devices|devices/\S{0,256}?)/[0-9a-fA-F:.]{12}/aer_dev_\w+:", re.M)),
    ("lspci-vvv", re.compile(r"^\s*LnkSta:\s+Speed [\d.]+GT/s", re.M)),  # a grep'd fragment
    ("kernel-log", re.compile(r"^(?:\[\s*\d+\.\d+\]|\[\w{3} \w{3} +\d+ [\d:]+ \d{4}\]|\d+,\d+,\d+,[^;]*;|"
                              r"\S{3,4}\s+\d{1,2} \d\d:\d\d:\d\d |\d{4}-\d\d-\d\d[T ]\d\d:\d\d|kern\s*:|kernel: |"
                              r"NVRM: )", re.M)),
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
