"""A folder shaped like ``/sys`` (a captured snapshot): InfiniBand ports, EDAC controllers, PCIe AER.

:func:`read_tree` is the only I/O (it reads small text files under the known roots into a dict);
:func:`parse_files` is pure. Counter files that hold text (``N/A (no PMA)``) are skipped and counted.
"""

from __future__ import annotations

import re
from pathlib import Path

from fleethealth.schema import AerDevice, EdacDimm, EdacMc, NetPort
from parsers.base import Parsed, ParseError, new_parsed, to_count, to_number

FORMAT = "sysfs-snapshot"
ROOTS = ("class/infiniband", "devices/system/edac/mc", "bus/pci/devices")
MAX_FILES = 20000
MAX_FILE_BYTES = 65536


def find_sys_root(folder: Path) -> Path | None:
    for cand in (folder / "sys", folder):
        if any((cand / r).is_dir() for r in ROOTS):
            return cand
    return None


def read_tree(folder: Path) -> dict[str, str]:
    """Relative path (from the sys root) -> file text, for files under :data:`ROOTS`."""
    root = find_sys_root(folder)
    if root is None:
        raise ParseError(FORMAT, f"{folder} holds none of {', '.join('sys/' + r for r in ROOTS)}")
    files: dict[str, str] = {}
    for r in ROOTS:
        base = root / r
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            if len(files) >= MAX_FILES:
                break
            try:
                if p.is_symlink() or not p.is_file():
                    continue
                with p.open("rb") as fh:
                    data = fh.read(MAX_FILE_BYTES)
            except OSError:
                continue  # vanished or unreadable mid-walk: skip, the rest still counts
            files[p.relative_to(root).as_posix()] = data.decode("utf-8", "replace")
    _pci_links(root, files)
    return files


def _pci_links(root: Path, files: dict[str, str]) -> None:
    """A tree captured with its links (``cp -a``, ``tar``) has ``bus/pci/devices/ADDR`` pointing into
    ``devices/pci0000:00/<bridge>/ADDR``: read the device's link files there, and name the bridge it
    hangs below as ``bus/pci/devices/ADDR/.upstream`` (the collector reads the same from the live
    tree). Links that leave the capture are not followed."""
    base = root / "bus" / "pci" / "devices"
    if not base.is_dir():
        return
    top = root.resolve()
    for entry in sorted(base.iterdir())[:MAX_FILES]:
        if not entry.is_symlink():
            continue
        try:
            real = entry.resolve()
            real.relative_to(top)
        except (OSError, ValueError, RuntimeError):
            continue
        if not real.is_dir():
            continue
        key = f"bus/pci/devices/{entry.name}"
        for f in _LINK_FILES:
            try:
                files.setdefault(f"{key}/{f}", (real / f).read_text(errors="replace")[:MAX_FILE_BYTES])
            except OSError:
                continue
        if _ADDR.match(real.parent.name):
            files[f"{key}/.upstream"] = real.parent.name


_LINK_FILES = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width", "class", "vendor",
               "aer_dev_correctable", "aer_dev_fatal", "aer_dev_nonfatal")
_ADDR = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


_IB = re.compile(r"^class/infiniband/(?P<dev>[^/]+)/ports/(?P<port>\d+)/(?P<rest>.+)$")
_MC = re.compile(r"^devices/system/edac/mc/mc(?P<mc>\d+)/(?P<rest>.+)$")
_PCI = re.compile(r"^bus/pci/devices/(?P<addr>[^/]+)/(?P<rest>[^/]+)$")
_DIMM = re.compile(r"^(?P<unit>csrow\d+/ch\d+|dimm\d+|rank\d+)[_/](?:dimm_)?(?P<f>label|ce_count|ue_count)$")
_STATE = re.compile(r"^\s*\d+:\s*(?P<name>\S+)")


def parse_files(files: dict[str, str]) -> Parsed:
    out = new_parsed(FORMAT)
    ports: dict[tuple[str, int], NetPort] = {}
    mcs: dict[int, EdacMc] = {}
    dimms: dict[tuple[int, str], EdacDimm] = {}
    labels: dict[tuple[int, str], str] = {}
    aer: dict[str, AerDevice] = {}
    for path, text in sorted(files.items()):
        value = text.strip()
        if (m := _IB.match(path)) is not None:
            key = (m["dev"], min(int(m["port"]), 1_000_000))
            p = ports.get(key) or ports.setdefault(key, NetPort(device=m["dev"][:256], port=key[1]))
            rest = m["rest"]
            if rest == "state":
                s = _STATE.match(value)
                p.state = (s["name"] if s else value).upper()[:256]
            elif rest == "phys_state":
                s = _STATE.match(value)
                p.phys_state = (s["name"] if s else value)[:256]
            elif rest == "rate":
                p.rate_gbps = to_number(value)
            elif rest == "link_layer":
                p.link_layer = value[:256]
            elif rest.startswith(("counters/", "hw_counters/", "counters_ext/")):
                v = to_count(value)
                if v is None:
                    out.skipped_lines += 1
                else:
                    p.counters[rest.rsplit("/", 1)[-1][:256]] = v
            continue
        if (m := _MC.match(path)) is not None:
            mc = mcs.setdefault(int(m["mc"]), EdacMc(mc=min(int(m["mc"]), 1_000_000)))
            rest = m["rest"]
            if rest in ("ce_count", "ue_count", "ce_noinfo_count", "ue_noinfo_count"):
                setattr(mc, rest, to_count(value))
                continue
            mm = _DIMM.match(rest)
            if mm is None:
                continue
            unit = mm["unit"]
            if mm["f"] == "label":
                labels[(mc.mc, unit)] = value
                continue
            dimm = dimms.setdefault((mc.mc, unit), EdacDimm(label=unit))
            setattr(dimm, mm["f"].split("_")[0], to_count(value))
            continue
        if (m := _PCI.match(path)) is not None:
            dev = aer.setdefault(m["addr"], AerDevice(pci_addr=m["addr"][:256]))
            rest = m["rest"]
            if rest.startswith("aer_dev_"):
                target = {"aer_dev_correctable": dev.correctable, "aer_dev_fatal": dev.fatal,
                          "aer_dev_nonfatal": dev.nonfatal}.get(rest)
                if target is not None:
                    target.update(parse_aer_counters(value))
            elif rest in ("current_link_speed", "max_link_speed"):
                gen = _speed_gen(value)
                if rest.startswith("current"):
                    dev.link_gen_current = gen
                else:
                    dev.link_gen_max = gen
            elif rest in ("current_link_width", "max_link_width"):
                w = to_count(value)
                w = w if w is not None and w <= 1_000_000 else None
                if rest.startswith("current"):
                    dev.link_width_current = w
                else:
                    dev.link_width_max = w
    # an endpoint's slot: the link capability of the bridge it hangs below (bridges themselves are
    # left alone: their link runs to what is below them)
    bridges = {files[k].strip() for k in files if k.endswith("/.upstream")}
    for addr, dev in aer.items():
        up = files.get(f"bus/pci/devices/{addr}/.upstream", "").strip()
        port = aer.get(up)
        if up and addr not in bridges:
            dev.upstream = up[:256]
            if port is not None:
                dev.upstream_width_max, dev.upstream_gen_max = port.link_width_max, port.link_gen_max
    for (mcn, unit), d in sorted(dimms.items()):
        d.label = (labels.get((mcn, unit)) or f"mc{mcn}/{unit}")[:256]
        mcs[mcn].dimms.append(d)
    out.sample.net_ports = [ports[k] for k in sorted(ports)][:64]
    out.sample.edac = [mcs[k] for k in sorted(mcs)][:64]
    out.sample.aer = [aer[k] for k in sorted(aer)][:256]
    if not (out.sample.net_ports or out.sample.edac or out.sample.aer):
        raise ParseError(FORMAT, "no InfiniBand port, EDAC controller or PCI device files found")
    return out


def _speed_gen(text: str) -> int | None:
    m = re.match(r"^\s*([\d.]+)\s*GT/s", text)
    if not m:
        return None
    return {"2.5": 1, "5.0": 2, "5": 2, "8.0": 3, "8": 3, "16.0": 4, "16": 4, "32.0": 5, "32": 5,
            "64.0": 6, "64": 6}.get(m.group(1))


def parse_aer_counters(text: str) -> dict[str, int]:
    """An ``aer_dev_correctable|fatal|nonfatal`` file -> {name: count}. Current kernels print one-word
    names (``RxErr 0``), older ones and the ABI document several words (``Receiver Error 2``,
    ``Bad TLP 0``), unnamed bits ``…_bit[12] 0``; the count is always the last word. Lines whose
    last word is not a count are dropped."""
    out: dict[str, int] = {}
    for line in text.splitlines()[:64]:
        name, _, n = line.strip().rpartition(" ")
        v = to_count(n)
        if name and v is not None:
            out[name.strip()[:256]] = v
    return out


_AER_GREP = re.compile(r"^(?:/sys)?/(?:bus/pci/devices|devices/\S{0,256}?)/(?P<addr>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:"
                       r"[0-9a-fA-F]{2}\.[0-7])/(?P<file>aer_dev_(?:correctable|fatal|nonfatal)):(?P<rest>.*)$")
_AER_CMD = re.compile(r"(?P<addr>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])/(?P<file>aer_dev_(?:correctable|"
                      r"fatal|nonfatal))\b")


def parse_aer_text(text: str) -> Parsed:
    """``grep . /sys/bus/pci/devices/*/aer_dev_*`` (``path:NAME COUNT`` lines), or ``cat`` of one
    ``aer_dev_*`` file with its command line on top: the AER counters of each device, as the
    collector reads them from sysfs."""
    out = new_parsed("sysfs-aer")
    files: dict[tuple[str, str], list[str]] = {}
    current: tuple[str, str] | None = None
    for line in text.splitlines():
        if (m := _AER_GREP.match(line.strip())) is not None:
            files.setdefault((m["addr"].lower(), m["file"]), []).append(m["rest"])
            continue
        if (c := _AER_CMD.search(line)) is not None and not line.strip().endswith(("0", "1", "2", "3", "4", "5", "6",
                                                                                    "7", "8", "9")):
            current = (c["addr"].lower(), c["file"])
            continue
        if current is not None and line.strip():
            files.setdefault(current, []).append(line)
    aer: dict[str, AerDevice] = {}
    for (addr, fname), lines in files.items():
        dev = aer.setdefault(addr, AerDevice(pci_addr=addr[:256]))
        target = {"aer_dev_correctable": dev.correctable, "aer_dev_fatal": dev.fatal,
                  "aer_dev_nonfatal": dev.nonfatal}[fname]
        target.update(parse_aer_counters("\n".join(lines)))
    out.sample.aer = [aer[k] for k in sorted(aer)][:256]
    if not out.sample.aer:
        raise ParseError("sysfs-aer", "no '/sys/bus/pci/devices/<addr>/aer_dev_*' lines")
    return out
