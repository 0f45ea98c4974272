"""A fixture-shaped host for ``--simulate``: a sysfs tree, a kernel log and a boot id on disk.

Written in the exact layout and text formats of the real files (``4: ACTIVE``, ``400 Gb/sec (4X
NDR)``, ``RxErr 0`` AER lines, EDAC ``mcN/dimmM``), so the real readers run unchanged on it.
"""

from __future__ import annotations

import uuid
from pathlib import Path

AER_COR = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF")
AER_UNC = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP",
           "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr")
IB_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
               "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
               "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
               "excessive_buffer_overrun_errors", "VL15_dropped", "port_xmit_data", "port_rcv_data",
               "port_xmit_packets", "port_rcv_packets", "port_xmit_wait")
HW_COUNTERS = ("out_of_sequence", "local_ack_timeout_err", "rnr_nak_retry_err", "req_cqe_error", "resp_cqe_error",
               "roce_adp_retrans", "np_cnp_sent", "rp_cnp_handled")
GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def _w(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")


def aer_text(names: tuple[str, ...], total: str, values: dict[str, int] | None = None) -> str:
    values = values or {}
    lines = [f"{n} {values.get(n, 0)}" for n in names]
    lines.append(f"{total} {sum(values.values())}")
    return "\n".join(lines)


def build_sim_host(root: str | Path, *, n_gpus: int = 8, n_ports: int = 8, n_mc: int = 2) -> dict[str, Path]:
    """Create ``root/sys``, ``root/proc`` and ``root/kmsg.log``; return their paths."""
    root = Path(root)
    sys_root, proc = root / "sys", root / "proc"
    for i in range(n_gpus):
        d = sys_root / "bus" / "pci" / "devices" / f"0000:{GPU_BUSES[i % 8] + i // 8:02x}:00.0"
        _w(d / "vendor", "0x10de")  # NVIDIA, 3D controller: what the collector's sysfs cross-check counts
        _w(d / "class", "0x030200")
        _w(d / "current_link_speed", "32.0 GT/s PCIe")
        _w(d / "max_link_speed", "32.0 GT/s PCIe")
        _w(d / "current_link_width", "16")
        _w(d / "max_link_width", "16")
        _w(d / "aer_dev_correctable", aer_text(AER_COR, "TOTAL_ERR_COR"))
        _w(d / "aer_dev_fatal", aer_text(AER_UNC, "TOTAL_ERR_FATAL"))
        _w(d / "aer_dev_nonfatal", aer_text(AER_UNC, "TOTAL_ERR_NONFATAL"))
    for i in range(n_ports):
        p = sys_root / "class" / "infiniband" / f"mlx5_{i}" / "ports" / "1"
        _w(p / "state", "4: ACTIVE")
        _w(p / "phys_state", "5: LinkUp")
        _w(p / "rate", "400 Gb/sec (4X NDR)")
        _w(p / "link_layer", "InfiniBand")
        for c in IB_COUNTERS:
            _w(p / "counters" / c, "0")
        for c in HW_COUNTERS:
            _w(p / "hw_counters" / c, "0")
    for m in range(n_mc):
        d = sys_root / "devices" / "system" / "edac" / "mc" / f"mc{m}"
        for f in ("ce_count", "ue_count", "ce_noinfo_count", "ue_noinfo_count"):
            _w(d / f, "0")
        for k in range(4):
            _w(d / f"dimm{k}" / "dimm_label", f"CPU_SrcID#{m}_MC#0_Chan#{k}_DIMM#0")
            _w(d / f"dimm{k}" / "dimm_ce_count", "0")
            _w(d / f"dimm{k}" / "dimm_ue_count", "0")
    boot = proc / "sys" / "kernel" / "random" / "boot_id"
    if not boot.exists():
        _w(boot, str(uuid.uuid4()))
    if not (proc / "stat").exists():
        _w(proc / "stat", "cpu  0 0 0 0 0 0 0 0 0 0\nbtime 1700000000\n")
    kmsg = root / "kmsg.log"
    kmsg.touch()
    return {"sys": sys_root, "proc": proc, "kmsg": kmsg}
