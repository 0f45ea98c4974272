"""``ethtool -S <dev>`` statistics and ``ethtool <dev>`` settings (pure)."""

from __future__ import annotations

import re

from collectors.parsers.base import Fact, Parsed, ParseError, new_parsed, to_count, to_number
from fleethealth.schema import NetPort

_STAT = re.compile(r"^\s+(?P<k>[\w\[\]./-]+): (?P<v>-?\d+)\s*$")
_SETTINGS = re.compile(r"^Settings for (?P<dev>\S+?):\s*$")
_KV = re.compile(r"^\s+(?P<k>[A-Za-z][\w -]*?):\s*(?P<v>.*)$")


def parse_stats(text: str, device: str = "eth") -> Parsed:
    out = new_parsed("ethtool-stats")
    lines = text.splitlines()
    if not any(line.startswith("NIC statistics") for line in lines[:5]):
        raise ParseError("ethtool-stats", "no 'NIC statistics:' header")
    port = NetPort(device=device, port=1, link_layer="Ethernet")
    for line in lines:
        m = _STAT.match(line)
        if m is None:
            continue
        v = to_count(m["v"])
        if v is None:
            out.skipped_lines += 1
            continue
        port.counters[m["k"][:256]] = v
    out.sample.net_ports.append(port)
    return out


def parse_settings(text: str) -> Parsed:
    out = new_parsed("ethtool-settings")
    dev: str | None = None
    port: NetPort | None = None
    for line in text.splitlines():
        if (m := _SETTINGS.match(line)) is not None:
            dev = m["dev"]
            port = NetPort(device=dev[:256], port=1, link_layer="Ethernet")
            out.sample.net_ports.append(port)
            continue
        if port is None or (m := _KV.match(line)) is None:
            continue
        k, v = m["k"].strip().lower(), m["v"].strip()
        if k == "speed":
            mbps = to_number(v)
            port.rate_gbps = mbps / 1000 if mbps is not None and mbps >= 0 else None
        elif k == "link detected":
            port.state = "ACTIVE" if v.lower() == "yes" else "DOWN"
            port.phys_state = "LinkUp" if v.lower() == "yes" else "Disabled"
            out.facts.append(Fact("eth_link_detected", dev or "eth", {"up": v.lower() == "yes"}, line.strip()))
    if dev is None:
        raise ParseError("ethtool-settings", "no 'Settings for <dev>:' line")
    return out


__all__ = ["parse_stats", "parse_settings", "to_count"]
