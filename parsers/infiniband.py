"""InfiniBand tools: ``ibstat``, ``ibstatus``, ``perfquery`` (plain, ``-x``, ``-E``), ``ibqueryerrors``,
``ibnetdiscover -p`` and a ``for f in counters/*; cat`` dump of one port's sysfs counters (pure).

Counters are stored under their sysfs names (``symbol_error``, ``link_downed`` ...) whichever tool
printed them, so one rule reads them all.
"""

from __future__ import annotations

import re

from fleethealth.schema import NetPort
from parsers.base import Fact, Parsed, ParseError, new_parsed, to_count, to_number

# perfquery / ibqueryerrors names -> sysfs counter file names
PERF_TO_SYSFS = {
    "SymbolErrorCounter": "symbol_error", "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed", "PortRcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors", "PortXmitDiscards": "port_xmit_discards",
    "PortXmitConstraintErrors": "port_xmit_constraint_errors",
    "PortRcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors", "VL15Dropped": "VL15_dropped",
    "PortXmitWait": "port_xmit_wait", "PortXmitData": "port_xmit_data", "PortRcvData": "port_rcv_data",
    "PortXmitPkts": "port_xmit_packets", "PortRcvPkts": "port_rcv_packets",
}
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def counter_name(perf_name: str) -> str:
    return PERF_TO_SYSFS.get(perf_name) or _CAMEL.sub("_", perf_name).lower()


def _port(out: Parsed, device: str, port: int) -> NetPort:
    for p in out.sample.net_ports:
        if p.device == device and p.port == port:
            return p
    p = NetPort(device=device[:256], port=min(port, 1_000_000))
    out.sample.net_ports.append(p)
    return p


# ----------------------------------------------------------------------------------- ibstat
_CA = re.compile(r"^CA '(?P<dev>[^']+)'")
_PORTHDR = re.compile(r"^\s+Port (?P<port>\d+):\s*$")
_KV = re.compile(r"^\s+(?P<k>[A-Za-z][A-Za-z ]*?):\s*(?P<v>.*)$")


def parse_ibstat(text: str) -> Parsed:
    out = new_parsed("ibstat")
    dev: str | None = None
    port: NetPort | None = None
    for line in text.splitlines():
        if (m := _CA.match(line)) is not None:
            dev, port = m["dev"], None
            continue
        if (m := _PORTHDR.match(line)) is not None and dev is not None:
            port = _port(out, dev, int(m["port"]))
            continue
        if port is not None and (m := _KV.match(line)) is not None:
            k, v = m["k"].strip().lower(), m["v"].strip()
            if k == "state":
                port.state = v.upper()[:256]
            elif k == "physical state":
                port.phys_state = v[:256]
            elif k == "rate":
                port.rate_gbps = to_number(v)
            elif k == "link layer":
                port.link_layer = v[:256]
    if dev is None:
        if re.search(r"^[ \t]{0,32}(?:Physical )?[Ss]tate:[ \t]{0,16}\w", text, re.M):
            return parse_ibstat_fragment(text)
        raise ParseError("ibstat", "no \"CA '<device>'\" line")
    return out


# ---------------------------------------------------------------------------------- ibstatus
_IBSTATUS_HDR = re.compile(r"^Infiniband device '(?P<dev>[^']+)' port (?P<port>\d+) status:")
_STATE_VAL = re.compile(r"^\d+:\s*(?P<name>\S+)")


def parse_ibstatus(text: str) -> Parsed:
    out = new_parsed("ibstatus")
    port: NetPort | None = None
    for line in text.splitlines():
        if (m := _IBSTATUS_HDR.match(line)) is not None:
            port = _port(out, m["dev"], int(m["port"]))
            continue
        if port is None or (m := _KV.match(line)) is None:
            continue
        k, v = m["k"].strip().lower(), m["v"].strip()
        if k == "state":
            s = _STATE_VAL.match(v)
            port.state = (s["name"] if s else v).upper()[:256]
        elif k == "phys state":
            s = _STATE_VAL.match(v)
            port.phys_state = (s["name"] if s else v)[:256]
        elif k == "rate":
            port.rate_gbps = to_number(v)
        elif k == "link_layer":
            port.link_layer = v[:256]
    if not out.sample.net_ports:
        raise ParseError("ibstatus", "no \"Infiniband device '<dev>' port <n> status:\" line")
    return out


# --------------------------------------------------------------------------------- perfquery
_PQ_HDR = re.compile(r"^#\s*(?P<what>[^:]*counters):\s*(?:Lid (?P<lid>\d+)\s+)?port (?P<port>\d+|ALL)", re.I)
_PQ_KV = re.compile(r"^(?P<k>[A-Za-z0-9]+):\.*(?P<v>\S+)\s*$")


def parse_perfquery(text: str) -> Parsed:
    out = new_parsed("perfquery")
    port: NetPort | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if (m := _PQ_HDR.match(line)) is not None:
            p = m["port"]
            port = _port(out, f"lid{m['lid'] or '?'}", 255 if p == "ALL" else int(p))
            continue
        if (m := _PQ_KV.match(line.strip())) is not None:
            if port is None:  # a grep'd perfquery: counters without their header
                port = _port(out, "lid?", 0)
                out.warnings.append(f"line {lineno}: counters without a '# Port counters' header (grep'd?)")
            if m["k"] in ("PortSelect", "CounterSelect", "CounterSelect2"):
                continue
            v = to_count(m["v"])
            if v is None:
                out.skipped_lines += 1
                continue
            port.counters[counter_name(m["k"])] = v
    if not out.sample.net_ports or not any(p.counters for p in out.sample.net_ports):
        raise ParseError("perfquery", "no '# Port counters' header and no 'Name:....value' counter")
    return out


# ----------------------------------------------------------------------------- ibqueryerrors
_IQE_NODE = re.compile(r'^Errors for (?:(?P<guid>0x[0-9a-f]+) )?"(?P<name>[^"]*)"')
_IQE_PORT = re.compile(r"^\s*GUID (?P<guid>0x[0-9a-f]+) port (?P<port>\d+|ALL):(?P<rest>.*)$")
_IQE_ERR = re.compile(r"\[(?P<k>\w+) == (?P<v>\d+)\]")


def parse_ibqueryerrors(text: str) -> Parsed:
    out = new_parsed("ibqueryerrors")
    node = ""
    for line in text.splitlines():
        if (m := _IQE_NODE.match(line.strip())) is not None:
            node = m["name"]
            continue
        if (m := _IQE_PORT.match(line)) is not None:
            if m["port"] == "ALL":
                continue  # the sum over the node's ports; the ports themselves follow
            p = _port(out, f"{node or m['guid']} {m['guid']}", int(m["port"]))
            for e in _IQE_ERR.finditer(m["rest"]):
                v = to_count(e["v"])
                if v is not None:
                    p.counters[counter_name(e["k"])] = v
            out.facts.append(Fact("ib_port_line", f"{p.device}/{p.port}", {}, line.strip()))
    if "ibqueryerrors" not in text and "Errors for" not in text and "## Summary" not in text:
        raise ParseError("ibqueryerrors", "no 'Errors for' or '## Summary' line")
    return out


# ----------------------------------------------------------------------------- ibnetdiscover
_IBND = re.compile(r"^(?P<type>CA|SW|RT)\s+(?P<lid>\d+)\s+(?P<port>\d+)\s+(?P<guid>0x[0-9a-f]+)\s+"
                   r"(?P<width>\d+x)\s+(?P<speed>\S+)(?P<rest>.*)$")
SPEED_GBPS_PER_LANE = {"SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0, "EDR": 25.0,
                       "HDR": 50.0, "NDR": 100.0, "XDR": 200.0}


def parse_ibnetdiscover(text: str) -> Parsed:
    """``ibnetdiscover -p``: one line per port with its trained width and speed."""
    out = new_parsed("ibnetdiscover")
    for line in text.splitlines():
        m = _IBND.match(line.strip())
        if m is None:
            continue
        lanes = int(m["width"][:-1])
        per_lane = SPEED_GBPS_PER_LANE.get(m["speed"])
        comp = f"{m['type']} lid {m['lid']} port {m['port']}"
        out.facts.append(Fact("ib_link_speed", comp, {
            "speed": m["speed"], "lanes": lanes, "gbps": per_lane * lanes if per_lane else None,
            "connected": " - " in m["rest"]}, line.strip()))
    if not out.facts:
        raise ParseError("ibnetdiscover", "no '<CA|SW> <lid> <port> <guid> <width> <speed>' line")
    return out


# ------------------------------------------------------------------ sysfs counters cat dump
_DUMP_NAME = re.compile(r"^=== (?:\./)?(?P<name>[\w./-]+) ===\s*$")
_DUMP_PATH = re.compile(r"/sys/class/infiniband/(?P<dev>[^/\s]+)/ports/(?P<port>\d+)")


def parse_counter_dump(text: str) -> Parsed:
    """``=== ./link_downed ===`` then the value: a shell loop over one port's counters directory."""
    out = new_parsed("ib-counter-dump")
    m = _DUMP_PATH.search(text)
    port = _port(out, m["dev"] if m else "ib", int(m["port"]) if m else 1)
    name: str | None = None
    for line in text.splitlines():
        if (h := _DUMP_NAME.match(line)) is not None:
            name = h["name"].rsplit("/", 1)[-1]
            continue
        if name is not None and line.strip():
            v = to_count(line.strip())
            if v is None:
                out.skipped_lines += 1
            else:
                port.counters[name[:256]] = v
            name = None
    if not port.counters:
        raise ParseError("ib-counter-dump", "no '=== <counter> ===' blocks with numeric values")
    return out


# -------------------------------------------------------------------------------- iblinkinfo
_ILI_NODE = re.compile(r"^(?P<type>CA|Switch|Router)\s*: (?P<name>.{1,512}?):\s*$")
_ILI_PORT = re.compile(
    r"^\s{0,32}(?:(?P<guid>0x[0-9a-f]{1,16})\s{1,16})?(?P<lid>\d{1,6})\s{1,16}(?P<port>\d{1,4})\[[^\]]{0,8}\]\s{0,4}"
    r"==\(\s{0,32}(?:(?P<width>\d{1,2})X\s{1,16}(?P<gbps>[\d.]{1,12}) Gbps\s{1,8})?(?P<state>\w{1,16})/\s{0,8}"
    r"(?P<phys>\w{1,16})\)==>\s{0,32}(?:(?P<plid>\d{1,6})\s{1,16}(?P<pport>\d{1,4}))?\s{0,16}\[[^\]]{0,8}\]\s{0,4}"
    r"\"(?P<peer>[^\"]{0,256})\"\s{0,4}\(\s{0,4}(?P<note>[^)]{0,128}?)\s{0,4}\)", re.I)
_COULD_BE = re.compile(r"Could be (?P<gbps>[\d.]{1,12}) Gbps", re.I)


def parse_iblinkinfo(text: str) -> Parsed:
    """``iblinkinfo`` (whole fabric, ``-S GUID``, or grep'd lines): one ``ib_link`` fact per port with
    its state, physical state, trained width and per-lane speed, the peer and the tool's ``( Could be
    … )`` note. A connected port (one with a peer) is also a NetPort; a port with no peer is an
    empty cage as far as this output can tell, so it is a fact only."""
    out = new_parsed("iblinkinfo")
    node = ""
    for line in text.splitlines():
        if (m := _ILI_NODE.match(line)) is not None:
            node = m["name"].strip()
            continue
        m = _ILI_PORT.match(line)
        if m is None:
            continue
        lanes = int(m["width"]) if m["width"] else None
        per_lane = float(m["gbps"]) if m["gbps"] else None
        could = _COULD_BE.search(m["note"] or "")
        comp = f"{node or m['guid'] or 'lid ' + m['lid']} port {m['port']}"
        attrs = {"lid": int(m["lid"]), "port": int(m["port"]), "state": m["state"].upper(), "phys_state": m["phys"],
                 "lanes": lanes, "lane_gbps": per_lane, "gbps": lanes * per_lane if lanes and per_lane else None,
                 "peer": m["peer"], "peer_lid": int(m["plid"]) if m["plid"] else None,
                 "could_be_lane_gbps": float(could["gbps"]) if could else None}
        out.facts.append(Fact("ib_link", comp, attrs, line.strip()))
        if m["peer"]:
            p = _port(out, node or f"lid{m['lid']}", int(m["port"]))
            p.state, p.phys_state = m["state"].upper(), m["phys"]
            p.rate_gbps = attrs["gbps"]  # type: ignore[assignment]
    if not out.facts:
        raise ParseError("iblinkinfo", "no '<lid> <port>[ ] ==( … )==>' port line")
    return out


# ---------------------------------------------------------------------------- ibstat fragments
_FRAG_CMD = re.compile(r"\bibstat\s+(?P<dev>[\w.-]{1,64})")


def parse_ibstat_fragment(text: str) -> Parsed:
    """``ibstat | grep -E 'State|Rate'`` and the like: ``State:`` / ``Physical state:`` / ``Rate:`` /
    ``Link layer:`` lines without their ``CA '…'`` header. Each ``State:`` starts the next port
    (``Port N:`` lines, when kept, number them); the device comes from the command line on top when
    there is one (``ibstat mlx5_3 | grep …``), else ``ib?``."""
    if re.search(r"^CA '[^']+'", text, re.M):
        return parse_ibstat(text)
    out = new_parsed("ibstat")
    dev, n, port = "ib?", 0, None
    for line in text.splitlines()[:3]:
        if (c := _FRAG_CMD.search(line)) is not None and c["dev"] not in ("grep", "egrep"):
            dev = c["dev"]
    for line in text.splitlines():
        if (m := _PORTHDR.match(" " + line.strip())) is not None:
            n, port = int(m["port"]), None
            port = _port(out, dev, n)
            continue
        m = _KV.match(" " + line.strip())
        if m is None:
            continue
        k, v = m["k"].strip().lower(), m["v"].strip()
        if k == "state":
            if port is None or port.state:
                n += 1
                port = _port(out, dev, n)
            port.state = v.upper()[:256]
        elif port is None:
            continue
        elif k == "physical state":
            port.phys_state = v[:256]
        elif k == "rate":
            port.rate_gbps = to_number(v)
        elif k == "link layer":
            port.link_layer = v[:256]
    if not out.sample.net_ports:
        raise ParseError("ibstat", "no CA header and no 'State:' lines")
    out.warnings.append("ibstat fragment: ports numbered in order of their State: lines")
    return out
