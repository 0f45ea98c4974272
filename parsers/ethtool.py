"""``ethtool -S <dev>`` statistics and ``ethtool <dev>`` settings (pure)."""

from __future__ import annotations

import re

from fleethealth.schema import NetPort
from parsers.base import Fact, Parsed, ParseError, new_parsed, to_count, to_number

_STAT = re.compile(r"^\s*(?P<k>[\w\[\]./-]{1,256}): (?P<v>-?\d{1,24})\s*$")
_SETTINGS = re.compile(r"^Settings for (?P<dev>\S+?):\s*$")
_KV = re.compile(r"^\s+(?P<k>[A-Za-z][\w -]*?):\s*(?P<v>.*)$")
_CMD = re.compile(r"(?:^|[\s#$])ethtool\s+(?:-S|--statistics)\s+(?P<dev>[\w.:@-]{1,64})")


def parse_stats(text: str, device: str = "eth") -> Parsed:
    """``ethtool -S DEV`` whole (``NIC statistics:`` then ``name: value`` lines) or filtered (``| grep
    err``: no header, perhaps the command line on top, which names the device)."""
    out = new_parsed("ethtool-stats")
    lines = text.splitlines()
    head = [ln for ln in lines[:5] if ln.strip()]
    for line in head[:2]:
        if (c := _CMD.search(line)) is not None:
            device = c["dev"]
    stats = [m for m in map(_STAT.match, lines) if m is not None]
    body = [ln for ln in lines if ln.strip() and not ln.startswith("NIC statistics") and not _CMD.search(ln)]
    if not any(line.startswith("NIC statistics") for line in head) and (not stats or len(stats) * 2 < len(body)):
        raise ParseError("ethtool-stats", "no 'NIC statistics:' header and too few 'name: value' lines")
    port = NetPort(device=device[:256], port=1, link_layer="Ethernet")
    for m in stats:
        v = to_count(m["v"])
        if v is None:
            out.skipped_lines += 1
            continue
        port.counters[m["k"][:256]] = v
    out.sample.net_ports.append(port)
    return out


def parse_info(text: str) -> Parsed:
    """``ethtool -i DEV``: driver, firmware and PCI address of a NIC (a fact; no counters)."""
    out = new_parsed("ethtool-info")
    kv: dict[str, str] = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep and k.strip() in ("driver", "version", "firmware-version", "bus-info"):
            kv[k.strip()] = v.strip()[:256]
    if "driver" not in kv or "bus-info" not in kv:
        raise ParseError("ethtool-info", "no 'driver:' and 'bus-info:' lines")
    out.facts.append(Fact("nic_info", kv["bus-info"], dict(kv), f"driver: {kv['driver']}"))
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


__all__ = ["parse_info", "parse_settings", "parse_stats", "to_count"]
