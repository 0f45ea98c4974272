"""The failure-mode vocabulary every part of fleethealth speaks.

One table, one place: rules, models, replay ground truth, ``diagnose`` output, metrics and
dashboards all use these labels. Adding a label needs a reason in ``docs/failure-modes.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FailureMode(StrEnum):
    GPU_FELL_OFF_BUS = "gpu_fell_off_bus"
    GPU_DRAM_UCE = "gpu_dram_uce"
    GPU_ROW_REMAP_FAILURE = "gpu_row_remap_failure"
    GPU_ROW_REMAP_PENDING = "gpu_row_remap_pending"
    GPU_SRAM_UCE = "gpu_sram_uce"
    GPU_ECC_SBE_STORM = "gpu_ecc_sbe_storm"
    GPU_HW_ERROR = "gpu_hw_error"
    GPU_NVLINK_ERROR = "gpu_nvlink_error"
    GPU_GSP_ERROR = "gpu_gsp_error"
    GPU_THERMAL = "gpu_thermal"
    PCIE_LINK_DEGRADED = "pcie_link_degraded"
    PCIE_FATAL = "pcie_fatal"
    NET_LINK_BAD_CABLE = "net_link_bad_cable"
    NET_LINK_DOWN = "net_link_down"
    HOST_DRAM_UCE = "host_dram_uce"
    HOST_DRAM_CE_STORM = "host_dram_ce_storm"
    HOST_UNREACHABLE = "host_unreachable"
    APP_ERROR = "app_error"
    HEALTHY = "healthy"


class Action(StrEnum):
    """Remediation verbs the default table recommends (policy files may choose others)."""

    DRAIN = "drain"
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    TICKET = "ticket"
    TICKET_IF_RECURS = "ticket_if_recurs"
    ANNOTATE = "annotate"


class Severity(StrEnum):
    CRITICAL = "critical"  # kills jobs now; drain
    MAJOR = "major"  # degrades jobs or will soon; drain or ticket
    MINOR = "minor"  # predictive; ticket, no drain
    INFO = "info"  # annotate only


class ComponentKind(StrEnum):
    GPU = "gpu"
    NVLINK = "nvlink"
    PCI = "pci"
    NET_PORT = "net_port"
    DIMM = "dimm"
    HOST = "host"


@dataclass(frozen=True, slots=True)
class ModeInfo:
    mode: FailureMode
    component: ComponentKind
    severity: Severity
    drain: bool
    actions: tuple[Action, ...]
    summary: str


_A = Action
_S = Severity
_C = ComponentKind
_F = FailureMode

MODES: dict[FailureMode, ModeInfo] = {
    m.mode: m
    for m in (
        ModeInfo(_F.GPU_FELL_OFF_BUS, _C.GPU, _S.CRITICAL, True, (_A.DRAIN, _A.TICKET),
                 "GPU no longer answers on PCIe (Xid 79, NVML GPU_IS_LOST, missing GPU); reseat or RMA"),
        ModeInfo(_F.GPU_DRAM_UCE, _C.GPU, _S.CRITICAL, True, (_A.DRAIN, _A.RESET_GPU, _A.TICKET_IF_RECURS),
                 "uncorrectable HBM ECC error (Xid 48, 94/95 on DRAM, DRAM UCE counter increment)"),
        ModeInfo(_F.GPU_ROW_REMAP_FAILURE, _C.GPU, _S.CRITICAL, True, (_A.DRAIN, _A.TICKET),
                 "row remapping failed: no spare rows left (Xid 64, remap failure flag); RMA"),
        ModeInfo(_F.GPU_ROW_REMAP_PENDING, _C.GPU, _S.MAJOR, True, (_A.DRAIN, _A.RESET_GPU),
                 "a row remap waits for the next GPU reset to take effect"),
        ModeInfo(_F.GPU_SRAM_UCE, _C.GPU, _S.CRITICAL, True, (_A.DRAIN, _A.RESET_GPU, _A.TICKET_IF_RECURS),
                 "uncorrectable on-chip SRAM ECC error (Xid 94/95 on SRAM, SRAM UCE increment)"),
        ModeInfo(_F.GPU_ECC_SBE_STORM, _C.GPU, _S.MINOR, False, (_A.TICKET,),
                 "correctable ECC rate far above the fleet baseline (Xid 92); predictive"),
        ModeInfo(_F.GPU_HW_ERROR, _C.GPU, _S.CRITICAL, True, (_A.DRAIN, _A.RESET_GPU, _A.TICKET_IF_RECURS),
                 "a Xid in NVIDIA's RESET_GPU or CONTACT_SUPPORT bucket with no more specific label"),
        ModeInfo(_F.GPU_NVLINK_ERROR, _C.NVLINK, _S.MAJOR, True, (_A.DRAIN, _A.RESET_GPU, _A.TICKET_IF_RECURS),
                 "NVLink errors (Xid 74, NVLink5 Xids, CRC/replay/recovery counters rising, links down)"),
        ModeInfo(_F.GPU_GSP_ERROR, _C.GPU, _S.CRITICAL, True, (_A.DRAIN, _A.RESET_GPU),
                 "GPU System Processor RPC timeout or error (Xid 119/120)"),
        ModeInfo(_F.GPU_THERMAL, _C.GPU, _S.MINOR, False, (_A.TICKET,),
                 "thermal slowdown or shutdown, or temperature past the slowdown point; cooling ticket"),
        ModeInfo(_F.PCIE_LINK_DEGRADED, _C.PCI, _S.MAJOR, True, (_A.DRAIN, _A.TICKET),
                 "PCIe link trained below its max gen/width under load, replay rate or corrected-AER storm"),
        ModeInfo(_F.PCIE_FATAL, _C.PCI, _S.CRITICAL, True, (_A.DRAIN, _A.TICKET),
                 "PCIe AER uncorrectable (fatal or non-fatal) errors"),
        ModeInfo(_F.NET_LINK_BAD_CABLE, _C.NET_PORT, _S.MAJOR, True, (_A.DRAIN, _A.TICKET),
                 "InfiniBand/RoCE port symbol errors, link-error recoveries, link_downed increments, flaps"),
        ModeInfo(_F.NET_LINK_DOWN, _C.NET_PORT, _S.CRITICAL, True, (_A.DRAIN, _A.TICKET),
                 "InfiniBand/RoCE port down, physical state disabled or polling"),
        ModeInfo(_F.HOST_DRAM_UCE, _C.DIMM, _S.CRITICAL, True, (_A.DRAIN, _A.TICKET),
                 "uncorrectable host memory error (EDAC UE, MCE uncorrected memory error)"),
        ModeInfo(_F.HOST_DRAM_CE_STORM, _C.DIMM, _S.MINOR, False, (_A.TICKET,),
                 "corrected host memory errors far above baseline on one DIMM or channel; predictive"),
        ModeInfo(_F.HOST_UNREACHABLE, _C.HOST, _S.MAJOR, False, (_A.TICKET,),
                 "no telemetry for N intervals; ticket after a grace period"),
        ModeInfo(_F.APP_ERROR, _C.GPU, _S.INFO, False, (_A.ANNOTATE,),
                 "application-caused Xid (13, 31, 43, 45 ...): notify the job owner, do not drain"),
        ModeInfo(_F.HEALTHY, _C.HOST, _S.INFO, False, (), "no finding"),
    )
}

assert set(MODES) == set(FailureMode), "every failure mode needs a ModeInfo row"


@dataclass(frozen=True, slots=True)
class Precursor:
    """A correctable-error ramp that may lead up to an uncorrectable fault on the same part."""

    storm: str  # the predictive mode the ramp looks like while it lasts
    ramp_s: float  # how long before the fault's onset the ramp may start


# The one precursor table: the simulator plants ramps of at most ``ramp_s`` (and reserves that time
# before onset); the scorecard reads a storm detection on the fault's component within ``ramp_s``
# before its onset as that fault's evidence, not a false positive; the ML labels leave the ramp's
# windows out of training and count the storm as explained in evaluation.
PRECURSORS: dict[str, Precursor] = {
    _F.GPU_DRAM_UCE.value: Precursor(_F.GPU_ECC_SBE_STORM.value, 6 * 3600.0),
    _F.GPU_ROW_REMAP_FAILURE.value: Precursor(_F.GPU_ECC_SBE_STORM.value, 3 * 3600.0),
    _F.HOST_DRAM_UCE.value: Precursor(_F.HOST_DRAM_CE_STORM.value, 6 * 3600.0),
}

ALL_LABELS: tuple[str, ...] = tuple(m.value for m in FailureMode)
FAULT_LABELS: tuple[str, ...] = tuple(m.value for m in FailureMode if m is not FailureMode.HEALTHY)
DRAIN_WORTHY: frozenset[FailureMode] = frozenset(m for m, i in MODES.items() if i.drain)


class UnknownFailureMode(ValueError):
    """A label outside the vocabulary."""


def parse_mode(label: str) -> FailureMode:
    try:
        return FailureMode(label)
    except ValueError:
        raise UnknownFailureMode(
            f"unknown failure mode {label!r}; the vocabulary is: {', '.join(ALL_LABELS)}"
        ) from None


def info(mode: FailureMode | str) -> ModeInfo:
    return MODES[parse_mode(mode) if isinstance(mode, str) else mode]
