"""``fleethealth collect --simulate --inject MODE[@GPU]``: a fault from the vocabulary on the simulated host.

GPU modes go through the simulated NVML's fault API (``simulator.nvml.SimNvml``); host modes
(EDAC, InfiniBand, PCIe AER) edit the simulated sysfs tree that ``simulator.host`` built, the
way the kernel would change those files. Each label maps to one fault that leaves its evidence in
the next sample. ``healthy`` and ``host_unreachable`` are not injectable (stop the collector to
make a host unreachable).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleethealth.errors import UserError


@dataclass(frozen=True)
class Injection:
    mode: str
    gpu: int = 0


def _gpu_dir(sys_root: Path, gpu: int) -> Path:
    from simulator.host import GPU_BUSES

    return sys_root / "bus" / "pci" / "devices" / f"0000:{GPU_BUSES[gpu % 8] + gpu // 8:02x}:00.0"


def _bump(path: Path, n: int) -> None:
    path.write_text(str(int(path.read_text().strip() or 0) + n))


def _aer_fatal(sys_root: Path, gpu: int) -> None:
    from simulator.host import AER_UNC, aer_text

    _gpu_dir(sys_root, gpu).joinpath("aer_dev_fatal").write_text(
        aer_text(AER_UNC, "TOTAL_ERR_FATAL", {"CmpltTO": 1, "MalfTLP": 1}))


def _edac(sys_root: Path, which: str, n: int) -> None:
    mc = sys_root / "devices" / "system" / "edac" / "mc" / "mc0"
    _bump(mc / f"{which}_count", n)
    _bump(mc / "dimm0" / f"dimm_{which}_count", n)


def _ib(sys_root: Path, port: int) -> Path:
    return sys_root / "class" / "infiniband" / f"mlx5_{port}" / "ports" / "1"


def _ib_down(sys_root: Path, port: int) -> None:
    p = _ib(sys_root, port)
    (p / "state").write_text("1: DOWN")
    (p / "phys_state").write_text("3: Disabled")
    _bump(p / "counters" / "link_downed", 1)


def _ib_bad_cable(sys_root: Path, port: int) -> None:
    p = _ib(sys_root, port)
    _bump(p / "counters" / "symbol_error", 5000)
    _bump(p / "counters" / "link_error_recovery", 20)
    _bump(p / "counters" / "port_rcv_errors", 500)


# label -> (what it does, apply(nvml, sys_root, index)); the index is a GPU, or an IB port for net_*
Fault = Callable[[Any, Path, int], None]
FAULTS: dict[str, tuple[str, Fault]] = {
    "gpu_fell_off_bus": ("Xid 79; the GPU answers GPU_IS_LOST", lambda n, s, i: n.fall_off_bus(i)),
    "gpu_dram_uce": ("uncorrected DRAM ECC, a pending row remap, Xid 94", lambda n, s, i: n.dram_uce(i)),
    "gpu_sram_uce": ("uncorrected SRAM ECC over the threshold, Xid 94",
                     lambda n, s, i: n.sram_uce(i, threshold=True)),
    "gpu_ecc_sbe_storm": ("5000 corrected DRAM ECC errors, Xid 92", lambda n, s, i: n.sbe_storm(i)),
    "gpu_row_remap_pending": ("a row remap pending (needs a GPU reset)", lambda n, s, i: n.remap_pending(i)),
    "gpu_row_remap_failure": ("row remapping failed, Xid 64", lambda n, s, i: n.remap_failure(i)),
    "gpu_nvlink_error": ("CRC / replay / recovery errors on NVLink 0",
                         lambda n, s, i: n.nvlink_errors(i, 0, crc_flit=500, crc_data=100, replay=50, recovery=3)),
    "gpu_thermal": ("92 C with HW thermal slowdown", lambda n, s, i: n.thermal(i)),
    "gpu_hw_error": ("Xid 62 (PMU halt)", lambda n, s, i: n.xid(i, 62)),
    "gpu_gsp_error": ("Xid 119 (GSP RPC timeout)", lambda n, s, i: n.xid(i, 119)),
    "app_error": ("Xid 13 (graphics engine exception: an application fault)", lambda n, s, i: n.xid(i, 13)),
    "pcie_link_degraded": ("the GPU's link trains at Gen1 x8 (NVML and sysfs)",
                           lambda n, s, i: _pcie_degraded(n, s, i)),
    "pcie_fatal": ("fatal PCIe AER errors on the GPU's device", lambda n, s, i: _aer_fatal(s, i)),
    "host_dram_uce": ("an uncorrected EDAC error on mc0 / dimm0", lambda n, s, i: _edac(s, "ue", 1)),
    "host_dram_ce_storm": ("5000 corrected EDAC errors on mc0 / dimm0", lambda n, s, i: _edac(s, "ce", 5000)),
    "net_link_down": ("InfiniBand port mlx5_N/1 DOWN / Disabled (N from @N)", lambda n, s, i: _ib_down(s, i)),
    "net_link_bad_cable": ("symbol errors and link recoveries on mlx5_N/1", lambda n, s, i: _ib_bad_cable(s, i)),
}


def _pcie_degraded(nvml: Any, sys_root: Path, gpu: int) -> None:
    nvml.pcie_downtrain(gpu, gen=1, width=8)
    d = _gpu_dir(sys_root, gpu)
    (d / "current_link_speed").write_text("2.5 GT/s PCIe")
    (d / "current_link_width").write_text("8")


def supported() -> str:
    return "\n".join(f"  {k:<22} {v[0]}" for k, v in sorted(FAULTS.items()))


def parse(specs: Iterable[str], n_gpus: int, n_ports: int = 8) -> list[Injection]:
    """``MODE[@INDEX]`` strings (comma-separated lists allowed) -> injections; UserError names the
    supported labels for an unknown one, and the range for a bad index."""
    out = []
    for spec in (s.strip() for item in specs for s in item.split(",")):
        if not spec:
            continue
        mode, _, idx = spec.partition("@")
        if mode not in FAULTS:
            raise UserError(f"--inject {spec!r}: unknown failure mode {mode!r}; injectable modes:\n{supported()}")
        limit = n_ports if mode.startswith("net_") else n_gpus
        try:
            i = int(idx) if idx else 0
        except ValueError:
            raise UserError(f"--inject {spec!r}: {idx!r} is not a GPU / port index") from None
        if not 0 <= i < limit:
            raise UserError(f"--inject {spec!r}: index {i} out of range 0..{limit - 1}")
        out.append(Injection(mode, i))
    return out


def apply(injections: Iterable[Injection], nvml: Any, sys_root: Path) -> None:
    for inj in injections:
        FAULTS[inj.mode][1](nvml, Path(sys_root), inj.gpu)
