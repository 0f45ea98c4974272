"""``fleethealth collect --simulate --inject MODE[@GPU]``: a fault from the vocabulary on the simulated host.

What each label does is the one fault model's signature (:mod:`simulator.faultmodel`), staged as
one burst (an hour of a severe fault: 50x the operating limit of :mod:`simulator.limits`) through
:class:`SimHostWriter`: GPU marks go through the simulated NVML's fault API
(``simulator.nvml.SimNvml``), host marks (EDAC, InfiniBand, PCIe AER) edit the simulated sysfs tree
that ``simulator.host`` built, the way the kernel would change those files. ``healthy`` and
``host_unreachable`` are not injectable (stop the collector to make a host unreachable).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleethealth.errors import UserError

from .faultmodel import CATALOGUE, stage


@dataclass(frozen=True)
class Injection:
    mode: str
    gpu: int = 0


def _gpu_dir(sys_root: Path, gpu: int) -> Path:
    from simulator.host import GPU_BUSES

    return sys_root / "bus" / "pci" / "devices" / f"0000:{GPU_BUSES[gpu % 8] + gpu // 8:02x}:00.0"


def _bump(path: Path, n: int) -> None:
    path.write_text(str(int(path.read_text().strip() or 0) + n))


def _bump_aer(path: Path, name: str, total: str, n: int) -> None:
    """Add ``n`` to line ``name`` and the ``total`` line of a sysfs aer_dev_* file."""
    rows = dict(line.split() for line in path.read_text().splitlines() if line.strip())
    for k in (name, total):
        rows[k] = str(int(rows.get(k, "0")) + n)
    path.write_text("".join(f"{k} {v}\n" for k, v in rows.items()))


_IB_STATE = {"ACTIVE": "4: ACTIVE", "DOWN": "1: DOWN"}
_IB_PHYS = {"LinkUp": "5: LinkUp", "Polling": "2: Polling", "Disabled": "3: Disabled"}


class SimHostWriter:
    """:class:`simulator.faultmodel.Writer` onto the simulated host: GPU marks through the simulated
    NVML's fault API, host marks as the kernel would change the sysfs files (AER, EDAC, InfiniBand).
    NVLink errors land on link 0; a DIMM index is flat over the memory controllers (4 DIMMs each)."""

    def __init__(self, nvml: Any, sys_root: Path, kmsg: Path | None = None) -> None:
        self.nvml = nvml
        self.sys = Path(sys_root)
        self.kmsg = kmsg

    def xid(self, index: int, code: int) -> None:
        """The NVML Xid event, and the NVRM line the driver writes to the kernel log beside it (for a
        GPU that fell off the bus the line is all there is: NVML cannot read a lost GPU's events)."""
        self.nvml.xid(index, code)
        if self.kmsg is not None:
            from .host import GPU_BUSES
            from .klog import XID_TEXT, prefix

            bus = GPU_BUSES[index % 8] + index // 8
            line = (f"{prefix(self._uptime())}NVRM: Xid (PCI:0000:{bus:02x}:00): {code}, pid='<unknown>', name=<unknown>, "
                    f"{XID_TEXT.get(code, '')}\n")
            with open(self.kmsg, "a", encoding="utf-8") as f:
                f.write(line)

    def _uptime(self) -> float:
        """Seconds since the simulated host's boot (``btime`` of its /proc/stat): the line's time is now."""
        import time

        stat = self.sys.parent / "proc" / "stat"
        btime = next((float(ln.split()[1]) for ln in stat.read_text().splitlines() if ln.startswith("btime ")),
                     time.time()) if stat.exists() else time.time()
        return max(0.0, time.time() - btime)

    def lose(self, index: int) -> None:
        self.nvml.lose(index)

    def _mc(self, index: int) -> tuple[Path, Path]:
        mc = self.sys / "devices" / "system" / "edac" / "mc" / f"mc{index // 4}"
        return mc, mc / f"dimm{index % 4}"

    def bump(self, index: int, counter: str, n: int) -> None:
        nv = self.nvml
        if counter.startswith("ecc."):
            loc, kind = counter[4:].split("_")
            nv.ecc_errors(index, n, location=loc, corrected=kind == "corrected")
        elif counter == "pcie.replays":
            nv.pcie_replays(index, n)
        elif counter.startswith("nvlink."):
            name = counter[7:]
            nv.nvlink_errors(index, 0, **{"crc_data" if name == "data" else name: n})
        elif counter == "aer.corrected":
            _bump_aer(_gpu_dir(self.sys, index) / "aer_dev_correctable", "Timeout", "TOTAL_ERR_COR", n)
        elif counter == "aer.uncorrectable":
            _bump_aer(_gpu_dir(self.sys, index) / "aer_dev_fatal", "MalfTLP", "TOTAL_ERR_FATAL", n)
        elif counter in ("ce", "ue"):
            mc, dimm = self._mc(index)
            _bump(mc / f"{counter}_count", n)
            _bump(dimm / f"dimm_{counter}_count", n)
        else:  # an InfiniBand port counter
            _bump(_ib(self.sys, index) / "counters" / counter, n)

    def set(self, index: int, field: str, value: Any) -> None:
        nv = self.nvml
        if field == "state":
            (_ib(self.sys, index) / "state").write_text(_IB_STATE[value])
        elif field == "phys_state":
            (_ib(self.sys, index) / "phys_state").write_text(_IB_PHYS[value])
        elif field == "remap.pending":
            nv.remap_rows(index, pending=value)
        elif field == "remap.failure":
            nv.remap_rows(index, failure=value)
        elif field == "ecc.sram_threshold":
            nv.gpus[index].sram_threshold = value
        elif field == "pcie.width":
            nv.pcie_downtrain(index, gen=None, width=value)
            (_gpu_dir(self.sys, index) / "current_link_width").write_text(str(value))
        elif field == "clocks":
            nv.gpus[index].reasons |= value
        elif field == "temperature":
            nv.gpus[index].temp = value
        else:
            raise ValueError(f"no field {field!r} on the simulated host")


def _ib(sys_root: Path, port: int) -> Path:
    return sys_root / "class" / "infiniband" / f"mlx5_{port}" / "ports" / "1"


# every kind of the one fault model but the host going silent (stop the collector for that)
FAULTS: dict[str, str] = {k.mode: k.summary for k in CATALOGUE.values() if k.stageable}


def supported() -> str:
    return "\n".join(f"  {k:<22} {v}" for k, v in sorted(FAULTS.items()))


def parse(specs: Iterable[str], n_gpus: int, n_ports: int = 8, n_dimms: int = 8) -> list[Injection]:
    """``MODE[@INDEX]`` strings (comma-separated lists allowed) -> injections; UserError names the
    supported labels for an unknown one, and the range for a bad index."""
    out = []
    for spec in (s.strip() for item in specs for s in item.split(",")):
        if not spec:
            continue
        mode, _, idx = spec.partition("@")
        if mode not in FAULTS:
            raise UserError(f"--inject {spec!r}: unknown failure mode {mode!r}; injectable modes:\n{supported()}")
        limit = {"port": n_ports, "dimm": n_dimms}.get(CATALOGUE[mode].component, n_gpus)
        try:
            i = int(idx) if idx else 0
        except ValueError:
            raise UserError(f"--inject {spec!r}: {idx!r} is not a GPU / port index") from None
        if not 0 <= i < limit:
            raise UserError(f"--inject {spec!r}: index {i} out of range 0..{limit - 1}")
        out.append(Injection(mode, i))
    return out


def component_kind(mode: str) -> str:
    return {"port": "port", "dimm": "DIMM"}.get(CATALOGUE[mode].component, "GPU")


def apply(injections: Iterable[Injection], nvml: Any, sys_root: Path, kmsg: Path | None = None) -> None:
    """Stage each injection on the simulated host; with ``kmsg``, Xids are also written there as
    kernel-log lines."""
    w = SimHostWriter(nvml, Path(sys_root), kmsg)
    for inj in injections:
        stage(inj.mode, w, inj.gpu)
