"""sysfs readers: PCIe link + AER counters, InfiniBand/RoCE ports, EDAC memory controllers.

Every reader takes ``sysfs_root`` (``/sys`` on a host; a fixture tree in tests) and a
:class:`ReadStats` that counts what was skipped and why. sysfs is live: a device can vanish between
``listdir`` and ``open`` (hot unplug, driver unload), so a missing file is a counted skip, never an
exception. Non-numeric counter files (``N/A (no PMA)`` on iWARP NICs) are skipped and counted too.
Counters are returned raw; a 32-bit counter pegged at 4294967295 is passed on as read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from fleethealth.schema import AerDevice, EdacDimm, EdacMc, NetPort
from parsers.sysfs_snapshot import parse_aer_counters as _parse_aer_counters

U64_MAX = (1 << 64) - 1


@dataclass
class ReadStats:
    """What a read skipped: ``vanished`` (file gone mid-read), ``unreadable`` (other OSError),
    ``non_numeric`` (a counter file whose text is not a number)."""

    vanished: int = 0
    unreadable: int = 0
    non_numeric: int = 0
    skipped: list[str] = field(default_factory=list)  # first few paths, for the log

    def note(self, kind: str, path: Path | str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.skipped) < 20:
            self.skipped.append(f"{kind}:{path}")


def read_text(path: Path | str, stats: ReadStats) -> str | None:
    # os.open/os.read: a third of the cost of a text-mode open() on the ~340 small files of a poll
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, 65536).decode("utf-8", "replace").strip()
        finally:
            os.close(fd)
    except FileNotFoundError:
        stats.note("vanished", path)
    except OSError:  # EIO / ENODEV / EINVAL from a device that is going away
        stats.note("unreadable", path)
    return None


def read_int(path: Path | str, stats: ReadStats) -> int | None:
    text = read_text(path, stats)
    if text is None:
        return None
    try:
        v = int(text.split()[0], 0) if text else None
    except ValueError:
        v = None
    if v is None or v < 0:
        stats.note("non_numeric", path)
        return None
    return min(v, U64_MAX)


def listdir(path: Path | str, stats: ReadStats) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []
    except OSError:
        stats.note("unreadable", path)
        return []


# --------------------------------------------------------------------------- PCIe

_SPEED_GEN = {"2.5": 1, "5.0": 2, "5": 2, "8.0": 3, "8": 3, "16.0": 4, "16": 4, "32.0": 5, "32": 5, "64.0": 6, "64": 6}


def speed_to_gen(text: str | None) -> int | None:
    """``"16.0 GT/s PCIe"`` -> 4. Unknown speeds -> None."""
    if not text:
        return None
    m = re.match(r"([\d.]+)\s*GT/s", text)
    return _SPEED_GEN.get(m.group(1)) if m else None


parse_aer_counters = _parse_aer_counters  # the one reader of the aer_dev_* format (multi-word names too)


def read_pcie(sysfs_root: str | Path, stats: ReadStats, *, only: set[str] | None = None) -> list[AerDevice]:
    """PCIe devices that report AER counters or a link (GPUs, NICs, switch ports).

    ``only``: restrict to these PCI addresses (e.g. the GPUs and HCAs and their upstream ports).
    """
    base = Path(sysfs_root) / "bus" / "pci" / "devices"
    out: list[AerDevice] = []
    for addr in listdir(base, stats):
        if only is not None and addr not in only:
            continue
        d = base / addr
        files = set(listdir(d, stats))
        if not files & {"aer_dev_correctable", "current_link_speed"}:
            continue
        dev = AerDevice(pci_addr=addr)
        for name, attr in (("aer_dev_correctable", "correctable"), ("aer_dev_fatal", "fatal"),
                           ("aer_dev_nonfatal", "nonfatal")):
            if name in files:
                text = read_text(d / name, stats)
                if text is not None:
                    setattr(dev, attr, parse_aer_counters(text))
        if "current_link_speed" in files:
            dev.link_gen_current = speed_to_gen(read_text(d / "current_link_speed", stats))
            dev.link_gen_max = speed_to_gen(read_text(d / "max_link_speed", stats))
            dev.link_width_current = _small(read_int(d / "current_link_width", stats))
            dev.link_width_max = _small(read_int(d / "max_link_width", stats))
        out.append(dev)
    _link_upstream(base, out, stats)
    return out


_PCI_ADDR = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def _link_upstream(base: Path, devs: list[AerDevice], stats: ReadStats) -> None:
    """Each endpoint's upstream port -- the bridge its function hangs below in the device tree
    (``/sys/bus/pci/devices/ADDR`` links to ``/sys/devices/pci0000:00/<bridge>/ADDR``) -- and that
    port's link capability (its ``max_link_width`` / ``max_link_speed``, LnkCap): what the slot
    allows. A link as wide as the slot is slot-limited, not degraded. Bridges (devices something
    hangs below) are left alone: their link runs to what is below them."""
    parents: dict[str, str] = {}
    for dev in devs:
        try:
            parent = os.path.basename(os.path.dirname(os.path.realpath(base / dev.pci_addr)))
        except (OSError, ValueError):
            continue
        if _PCI_ADDR.match(parent) and parent != dev.pci_addr:
            parents[dev.pci_addr] = parent
    bridges = set(parents.values())
    for dev in devs:
        up = parents.get(dev.pci_addr)
        if up is None or dev.pci_addr in bridges:
            continue
        port = Path(os.path.realpath(base / dev.pci_addr)).parent
        dev.upstream = up
        if (port / "max_link_width").exists():  # a host bridge above a root-complex device has none
            dev.upstream_width_max = _small(read_int(port / "max_link_width", stats))
        if (port / "max_link_speed").exists():
            dev.upstream_gen_max = speed_to_gen(read_text(port / "max_link_speed", stats))


NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0302", "0x0300")  # 3D controller (datacenter GPUs), VGA controller


def nvidia_gpu_functions(sysfs_root: str | Path, stats: ReadStats) -> list[str]:
    """PCI addresses of NVIDIA GPU functions (vendor 0x10de, class 0x0302xx / 0x0300xx) in sysfs:
    what the PCI core enumerated, whatever the driver answers. NVSwitches (class 0x0680) and the
    GPUs' audio functions (0x0403) are not GPUs."""
    base = Path(sysfs_root) / "bus" / "pci" / "devices"
    out = []
    for addr in listdir(base, stats):
        vendor = read_text(base / addr / "vendor", stats)
        if vendor is None or vendor.strip().lower() != NVIDIA_VENDOR:
            continue
        cls = read_text(base / addr / "class", stats)
        if cls is not None and cls.strip().lower().startswith(GPU_CLASSES):
            out.append(addr)
    return sorted(out)


def _small(v: int | None) -> int | None:
    return v if v is not None and v <= 1_000_000 else None


# --------------------------------------------------------------------------- InfiniBand / RoCE

def _after_colon(text: str | None) -> str:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``; ``"5: LinkUp"`` -> ``"LinkUp"``."""
    if not text:
        return ""
    return text.split(":", 1)[1].strip() if ":" in text else text.strip()


def parse_rate(text: str | None) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` -> 400.0."""
    if not text:
        return None
    m = re.match(r"\s*([\d.]+)\s*Gb/sec", text)
    return float(m.group(1)) if m else None


def read_net_ports(sysfs_root: str | Path, stats: ReadStats) -> list[NetPort]:
    base = Path(sysfs_root) / "class" / "infiniband"
    out: list[NetPort] = []
    for dev in listdir(base, stats):
        pdir = base / dev / "ports"
        for port in listdir(pdir, stats):
            if not port.isdigit():
                continue
            p = pdir / port
            np = NetPort(device=dev, port=int(port))
            np.state = _after_colon(read_text(p / "state", stats))
            np.phys_state = _after_colon(read_text(p / "phys_state", stats))
            np.rate_gbps = parse_rate(read_text(p / "rate", stats))
            ll = read_text(p / "link_layer", stats)
            if ll:
                np.link_layer = ll
            counters: dict[str, int] = {}
            for sub, prefix in (("counters", ""), ("hw_counters", "hw_")):
                cdir = os.path.join(p, sub)  # str joins: pathlib's `/` cost more than the reads
                for name in listdir(cdir, stats):
                    v = read_int(os.path.join(cdir, name), stats)
                    if v is not None:
                        counters[prefix + name] = v
            np.counters = counters
            out.append(np)
    return out


# --------------------------------------------------------------------------- EDAC

def read_edac(sysfs_root: str | Path, stats: ReadStats) -> list[EdacMc]:
    base = Path(sysfs_root) / "devices" / "system" / "edac" / "mc"
    out: list[EdacMc] = []
    for name in listdir(base, stats):
        m = re.fullmatch(r"mc(\d+)", name)
        if not m:
            continue
        d = base / name
        mc = EdacMc(mc=int(m.group(1)))
        for attr in ("ce_count", "ue_count", "ce_noinfo_count", "ue_noinfo_count"):
            if (d / attr).exists():
                setattr(mc, attr, read_int(d / attr, stats))
        mc.dimms = _dimms(d, stats)
        out.append(mc)
    return out


def _dimms(mcdir: Path, stats: ReadStats) -> list[EdacDimm]:
    dimms: list[EdacDimm] = []
    entries = listdir(mcdir, stats)
    for e in entries:  # newer kernels: mcN/dimmM/{dimm_label,dimm_ce_count,dimm_ue_count}
        if re.fullmatch(r"(dimm|rank)\d+", e):
            d = mcdir / e
            label = read_text(d / "dimm_label", stats) or f"{mcdir.name}/{e}"
            dimms.append(EdacDimm(label=label, ce=read_int(d / "dimm_ce_count", stats),
                                  ue=read_int(d / "dimm_ue_count", stats)))
    if dimms:
        return dimms
    for e in entries:  # older kernels: mcN/csrowK/chJ_{ce_count,dimm_label}
        if not re.fullmatch(r"csrow\d+", e):
            continue
        d = mcdir / e
        for f in listdir(d, stats):
            m = re.fullmatch(r"ch(\d+)_ce_count", f)
            if not m:
                continue
            ch = m.group(1)
            label = read_text(d / f"ch{ch}_dimm_label", stats) or f"{mcdir.name}/{e}/ch{ch}"
            ue = read_int(d / f"ch{ch}_ue_count", stats) if (d / f"ch{ch}_ue_count").exists() else None
            dimms.append(EdacDimm(label=label[:256], ce=read_int(d / f, stats), ue=ue))
    return dimms


# --------------------------------------------------------------------------- host identity

def read_boot_id(proc_root: str | Path = "/proc") -> str:
    try:
        return (Path(proc_root) / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return ""


def read_boot_time(proc_root: str | Path = "/proc") -> float | None:
    """``btime`` from /proc/stat: the wall-clock second the host booted (for dmesg-relative stamps)."""
    try:
        for line in (Path(proc_root) / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError):
        pass
    return None
