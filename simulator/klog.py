"""Kernel-log lines as real hosts print them (NVRM Xid, PCIe AER, EDAC, MCE), wrapped in
:class:`~fleethealth.schema.KernelEvent`.

Lines carry the classic ``dmesg`` prefix ``[uptime.usec]``. Events are built by parsing the
generated line with the one kernel-line reader (``parsers.kernel_log.parse_kernel_line``), so
simulated and real hosts go through the same code; a line the reader does not turn into an event
gets the fields the simulator knows.
"""

from __future__ import annotations

from typing import Any

import msgspec

from fleethealth.schema import KernelEvent, XidEvent
from parsers.kernel_log import parse_kernel_line

from .topology import GPU_PCI_ID, GpuSpec

_UNKNOWN = "pid='<unknown>', name=<unknown>"

XID_TEXT: dict[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 4, TPC 1, SM 0): Out Of Range Address",
    31: "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_3 faulted @ 0x7f3a_12c40000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000008",
    45: "Ch 00000009",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, "
        "subpartition 0.",
    62: "2023b230 20238a3a 2023e8b6 2023eac4 2023ec3c 2023ea86 00000000 00000000",
    63: "Row Remapper: New row (0x00000000000a8e3f) marked for remapping, reset gpu to activate.",
    64: "Row Remapper Error: Failed to remap row (0x00000000000a8e3f), no spare rows left in bank.",
    74: "NVLink: fatal error detected on link 7(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No",
    109: "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x1c000",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) "
         "(0x20801348 0x4).",
    120: "GSP Error: Task 1 raised error code 0x5 for reason 0x0 at 0x4a1c (0 more errors skipped)",
    140: "An uncorrectable ECC error escaped containment (unrecoverable), reset GPU.",
    143: "GPU Initialization Failure: GPU failed to initialize, reset GPU.",
    158: "GPU fatal timeout detected, reset GPU.",
}
# Xids whose line names the process (application context)
_APP_XIDS = {13, 31, 43, 45, 94, 109}


def prefix(uptime: float) -> str:
    us = int(round(uptime * 1e6))
    return f"[{us // 1_000_000:5d}.{us % 1_000_000:06d}] "


def _event(ts: float, uptime: float, kind: str, text: str, **kw: Any) -> KernelEvent:
    line = prefix(uptime) + text
    try:
        ev = parse_kernel_line(line)
    except Exception:  # a parser bug must not stop the simulation; fall back to known fields
        ev = None
    if isinstance(ev, KernelEvent):
        return msgspec.structs.replace(ev, ts=ts)
    return KernelEvent(ts=ts, kind=kind, line=line, **kw)  # type: ignore[arg-type]


def xid(ts: float, uptime: float, gpu: GpuSpec, code: int, pid: int | None = None,
        proc: str = "python3", text: str | None = None) -> tuple[KernelEvent, XidEvent]:
    body = text if text is not None else XID_TEXT.get(code, "")
    who = f"pid={pid}, name={proc}" if (pid is not None and code in _APP_XIDS) else _UNKNOWN
    msg = f"NVRM: Xid (PCI:{gpu.xid_pci}): {code}, {who}, {body}"
    ev = _event(ts, uptime, "xid", msg, pci_addr=gpu.pci_addr, xid=code)
    return ev, XidEvent(xid=code, ts=ts, pid=pid if code in _APP_XIDS else None, message=body)


def gpu_at(ts: float, uptime: float, gpu: GpuSpec, uuid: str) -> KernelEvent:
    return _event(ts, uptime, "other", f"NVRM: GPU at PCI:{gpu.xid_pci}: {uuid}", pci_addr=gpu.pci_addr)


def fell_off_bus(ts: float, uptime: float, gpu: GpuSpec) -> list[KernelEvent]:
    lines = (f"NVRM: The NVIDIA GPU {gpu.pci_addr}", f"NVRM: (PCI ID: {GPU_PCI_ID}) installed in this system has",
             "NVRM: fallen off the bus and is not responding to commands.")
    return [_event(ts, uptime, "fell_off_bus", t, pci_addr=gpu.pci_addr) for t in lines]


AER_CORRECTED = (("Data Link Layer", "Transmitter ID", "00001000", "[12] Timeout               "),
                 ("Data Link Layer", "Receiver ID", "00000080", "[ 7] BadDLLP               "),
                 ("Physical Layer", "Receiver ID", "00000001", "[ 0] RxErr                  "),
                 ("Data Link Layer", "Receiver ID", "00000040", "[ 6] BadTLP                 "))
AER_FATAL = (("Transaction Layer", "Receiver ID", "00000020", "[ 5] SDES                   (First)"),
             ("Transaction Layer", "Receiver ID", "00040000", "[18] MalfTLP                (First)"))
AER_NONFATAL = (("Transaction Layer", "Requester ID", "00004000", "[14] CmpltTO                (First)"),
                ("Transaction Layer", "Receiver ID", "00100000", "[20] UnsupReq               (First)"))


def aer(ts: float, uptime: float, gpu: GpuSpec, severity: str, variant: int = 0) -> list[KernelEvent]:
    """A PCIe AER report as the kernel logs it: the root/switch port line, then the device lines."""
    table = {"corrected": AER_CORRECTED, "fatal": AER_FATAL, "non-fatal": AER_NONFATAL}[severity]
    layer, agent, status, bit = table[variant % len(table)]
    sev = {"corrected": "Corrected", "fatal": "Uncorrected (Fatal)", "non-fatal": "Uncorrected (Non-Fatal)"}[severity]
    head = "Corrected error received" if severity == "corrected" else f"{sev} error received"
    mask = "0000e000" if severity == "corrected" else "00000000"
    texts = (f"pcieport {gpu.upstream_port}: AER: {head}: {gpu.pci_addr}",
             f"nvidia {gpu.pci_addr}: PCIe Bus Error: severity={sev}, type={layer}, ({agent})",
             f"nvidia {gpu.pci_addr}:   device [{GPU_PCI_ID}] error status/mask={status}/{mask}",
             f"nvidia {gpu.pci_addr}:    {bit}")
    return [_event(ts, uptime, "aer", t, pci_addr=gpu.pci_addr, severity=severity) for t in texts]


def edac(ts: float, uptime: float, mc: int, label: str, kind: str, count: int, page: int) -> KernelEvent:
    """An EDAC i10nm report: ``EDAC MC2: 3 CE memory read error on CPU_SrcID#0_MC#2_Chan#1_DIMM#0 (...)``."""
    ch = int(label.split("Chan#")[1][0])
    sock = int(label.split("SrcID#")[1][0])
    imc = int(label.split("_MC#")[1][0])
    text = (f"EDAC MC{mc}: {count} {kind} memory read error on {label} (channel:{ch} slot:0 page:{page:#x} "
            f"offset:0x240 grain:32 syndrome:0x0 - err_code:0x0000:0x009f socket:{sock} imc:{imc} rank:0 "
            f"bg:1 ba:2 row:{page & 0x3ffff:#x} col:0x240)")
    sev = "corrected" if kind == "CE" else "uncorrected"
    return _event(ts, uptime, "edac", text, severity=sev)


def mce_uncorrected(ts: float, uptime: float, cpu: int, bank: int) -> list[KernelEvent]:
    texts = (f"mce: [Hardware Error]: CPU {cpu}: Machine Check Exception: 5 Bank {bank}: bd80000000100134",
             "mce: [Hardware Error]: Machine check events logged")
    return [_event(ts, uptime, "mce", t, severity="uncorrected") for t in texts]


def mce_logged(ts: float, uptime: float) -> KernelEvent:
    return _event(ts, uptime, "mce", "mce: [Hardware Error]: Machine check events logged", severity="corrected")


def net(ts: float, uptime: float, hca_pci: str, text: str) -> KernelEvent:
    return _event(ts, uptime, "other", f"mlx5_core {hca_pci}: {text}", pci_addr=hca_pci)


def plain(ts: float, uptime: float, text: str) -> KernelEvent:
    return _event(ts, uptime, "other", text)
