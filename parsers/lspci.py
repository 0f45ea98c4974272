"""``lspci -vvv``: link capability vs status per device and AER status bits (pure).

AER status bits are sticky (set once, kept until cleared), so a ``+`` proves an error happened
once, not that it is happening; the doctor weighs them accordingly.
"""

from __future__ import annotations

import re

from fleethealth.schema import AerDevice
from parsers.base import Fact, Parsed, ParseError, new_parsed, pci_norm

_DEV = re.compile(r"^(?P<addr>(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) (?P<cls>[^:]+): (?P<desc>.*)$")
_LNK = re.compile(r"^\s*(?P<which>LnkCap|LnkSta):\s+(?:Port #\d+, )?Speed (?P<speed>[\d.]+)GT/s(?P<sdown> \(downgraded\))?"
                  r"[^,]*, Width x(?P<width>\d+)(?P<wdown> \(downgraded\))?")
_STA = re.compile(r"^\s*(?P<which>UESta|CESta):\s+(?P<bits>.*)$")
_BUS = re.compile(r"^\s*Bus: primary=(?P<pri>[0-9a-f]{2}), secondary=(?P<sec>[0-9a-f]{2})", re.I)
_SEL = re.compile(r"\blspci\b.*?-s\s*(?P<addr>(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])", re.I)
GT_TO_GEN = {"2.5": 1, "5": 2, "8": 3, "16": 4, "32": 5, "64": 6}


def parse(text: str) -> Parsed:
    out = new_parsed("lspci-vvv")
    dev: AerDevice | None = None
    lines = text.splitlines()
    if not any(_DEV.match(line) for line in lines):  # grep'd: LnkCap / LnkSta lines without their device
        sel = next((m for m in map(_SEL.search, lines[:3]) if m), None)
        dev = AerDevice(pci_addr=pci_norm(sel["addr"]) if sel else "unknown")
        out.sample.aer.append(dev)
        out.warnings.append("lspci fragment: no device line" + ("" if sel else "; the device is unknown"))
    secondary: dict[tuple[str, str], AerDevice] = {}  # (domain, bus) -> the bridge whose secondary bus it is
    for line in lines:
        if (m := _DEV.match(line)) is not None:
            dev = AerDevice(pci_addr=pci_norm(m["addr"]))
            out.sample.aer.append(dev)
            out.facts.append(Fact("pci_device", dev.pci_addr, {"class": m["cls"].strip(), "desc": m["desc"]},
                                  line.strip()))
            continue
        if dev is None:
            continue
        if (m := _LNK.match(line)) is not None:
            gen = GT_TO_GEN.get(m["speed"].rstrip("0").rstrip(".") if "." in m["speed"] else m["speed"])
            width = int(m["width"])
            if m["which"] == "LnkCap":
                dev.link_gen_max, dev.link_width_max = gen, width
            else:
                dev.link_gen_current, dev.link_width_current = gen, width
                out.facts.append(Fact("lnksta", dev.pci_addr, {}, line.strip()))
            continue
        if (m := _BUS.match(line)) is not None:  # a bridge: the bus below it
            secondary[(dev.pci_addr.split(":")[0], m["sec"].lower())] = dev
            continue
        if (m := _STA.match(line)) is not None:
            bits = {b[:-1]: 1 for b in m["bits"].split() if b.endswith("+")}
            if m["which"] == "UESta":
                dev.nonfatal = bits  # lspci does not split by severity; the mask decides (UESvrt)
            else:
                dev.correctable = bits
            if bits:
                out.facts.append(Fact(m["which"].lower(), dev.pci_addr, {"bits": sorted(bits)}, line.strip()))
    _link_upstream(out.sample.aer, secondary)
    if not out.sample.aer or (out.sample.aer[0].pci_addr == "unknown" and len(out.sample.aer) == 1
                              and out.sample.aer[0].link_gen_current is None and not out.facts):
        raise ParseError("lspci-vvv", "no '<bus:dev.fn> <class>: <device>' line and no LnkCap/LnkSta line")
    return out


def _link_upstream(devs: list[AerDevice], secondary: dict[tuple[str, str], AerDevice]) -> None:
    """An endpoint's slot: the bridge whose secondary bus it sits on, when the capture shows that
    bridge's block, and the bridge's LnkCap (what the slot allows). Bridges are left alone."""
    bridges = {id(b) for b in secondary.values()}
    for d in devs:
        parts = d.pci_addr.split(":")
        if id(d) in bridges or len(parts) != 3:
            continue
        port = secondary.get((parts[0], parts[1].lower()))
        if port is not None and port is not d:
            d.upstream, d.upstream_width_max, d.upstream_gen_max = port.pci_addr, port.link_width_max, port.link_gen_max
