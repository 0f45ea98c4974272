"""The one fault model: every failure mode the simulator can produce, and the signature it leaves.

A :class:`FaultKind` says, per vocabulary label, which component it sits on, how long it lasts, and
its **signature** as a list of marks: which Xids the driver writes, which counters rise (and for a
rate fault, against which operating limit of :mod:`.limits`), which fields take which value. The
signature is data, used twice:

- :func:`stage` writes it through a small :class:`Writer` (the simulated NVML and sysfs tree of
  ``collect --simulate --inject``; a contract sample in :mod:`.fixtures`, for the tests and the ML
  test fleet);
- :func:`missing` checks it on the samples any producer wrote (the fleet engine's recordings, the
  collector's sample after an injection, a fixture), so one definition decides what a fault of each
  kind looks like, whoever made it.

The fleet engine (:mod:`.faults`) adds what a single staging cannot: time. It draws each fault's
strength from :mod:`.limits`, ramps, variants (Xid 48+63 or 95), flaps and repairs; its kinds,
durations and Xid codes come from here (precursor ramps from ``fleethealth.taxonomy.PRECURSORS``),
and ``tests/simulator/test_fault_model.py`` holds its output to the same signatures. Marks with ``required=False`` are what a severe fault
shows and a marginal one may not (an NVLink past 4x its limit raises Xid 74; a marginal one only
counts CRC errors): :func:`stage` writes them, :func:`missing` does not insist on them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from fleethealth.schema import GpuSample, Sample
from fleethealth.taxonomy import FAULT_LABELS

from .limits import LIMITS


@dataclass(frozen=True)
class Xid:
    """The driver writes one of ``codes`` for the GPU (:func:`stage` writes the first)."""

    codes: tuple[int, ...]
    required: bool = True


@dataclass(frozen=True)
class Rises:
    """Counter ``counter`` of the component rises. With ``limit`` it is a rate fault sized against
    that operating limit (``scale`` x the limit; checked at 0.8x the limit over the window);
    without, an event counter that moves by ``n`` at onset."""

    counter: str
    limit: str | None = None
    scale: float = 1.0
    n: int = 1
    required: bool = True


@dataclass(frozen=True)
class Shows:
    """Field ``field`` of the component reads one of ``values`` (:func:`stage` writes the first)."""

    field: str
    values: tuple[Any, ...]
    required: bool = True


@dataclass(frozen=True)
class Bits:
    """Bit field ``field`` has any of ``mask`` set (:func:`stage` sets ``write``)."""

    field: str
    mask: int
    write: int
    required: bool = True


@dataclass(frozen=True)
class Above:
    """Gauge ``field`` reads over ``at_least`` (:func:`stage` writes ``write``)."""

    field: str
    at_least: float
    write: float
    required: bool = True


@dataclass(frozen=True)
class Lost:
    """The GPU is lost: ``present=False`` with ``GPU_IS_LOST``, or no longer enumerated."""

    required: bool = True


@dataclass(frozen=True)
class Silent:
    """The host sends nothing (not stageable on one sample: a test stops feeding the host)."""

    required: bool = True


Mark = Xid | Rises | Shows | Bits | Above | Lost | Silent


@dataclass(frozen=True)
class FaultKind:
    mode: str
    component: str  # gpu | pci (the GPU's PCIe function) | port | dimm | host
    summary: str
    duration_s: tuple[float, float]  # log-uniform from onset to repair, in the fleet engine
    marks: tuple[Mark, ...]
    # kernel-log lines the fleet engine writes (regular expressions; {c} is the component), beside an
    # NVRM line for every Xid it raises (simulator.klog); staging writes no kernel lines but Xids
    klog: tuple[str, ...] = ()

    @property
    def stageable(self) -> bool:
        return not any(isinstance(m, Silent) for m in self.marks)


H = 3600.0
# The Xid codes below follow NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors); each is the
# driver's own for the failure (e.g. 94/95 contained / uncontained ECC on A100 and later).
HW_XIDS: Final = (62, 109, 140, 143, 158)  # RESET_GPU / CONTACT_SUPPORT buckets with no finer label
APP_XIDS: Final = (13, 31, 43)  # application faults; 45 follows as the channels are torn down

CATALOGUE: Final[dict[str, FaultKind]] = {k.mode: k for k in (
    FaultKind("gpu_fell_off_bus", "gpu", "Xid 79; the GPU answers GPU_IS_LOST or is no longer enumerated",
              (H, 8 * H), (Xid((79,)), Lost())),
    FaultKind("gpu_dram_uce", "gpu", "uncorrected DRAM ECC, Xid 94 (48+63 or 95 in the fleet engine), a row "
              "remap pending", (1800, 4 * H),
              (Rises("ecc.dram_uncorrected"), Xid((94, 48, 95)), Shows("remap.pending", (True,), required=False))),
    FaultKind("gpu_row_remap_failure", "gpu", "row remapping failed (flag), Xid 64 after an uncorrected error",
              (2 * H, 12 * H),
              (Xid((64,)), Shows("remap.failure", (True,)), Rises("ecc.dram_uncorrected", required=False))),
    FaultKind("gpu_row_remap_pending", "gpu", "a row remap pending until the GPU is reset, Xid 63", (1800, 4 * H),
              (Shows("remap.pending", (True,)), Xid((63,)))),
    FaultKind("gpu_sram_uce", "gpu", "uncorrected SRAM ECC, Xid 94/95, the SRAM threshold flag", (900, 2 * H),
              (Rises("ecc.sram_uncorrected"), Xid((94, 95)), Shows("ecc.sram_threshold", (True,), required=False))),
    FaultKind("gpu_ecc_sbe_storm", "gpu", "corrected DRAM ECC at a multiple of the HBM limit; Xid 92 when heavy",
              (2 * H, 24 * H), (Rises("ecc.dram_corrected", limit="hbm_ce"), Xid((92,), required=False))),
    FaultKind("gpu_hw_error", "gpu", "a hardware Xid (62, 109, 140, 143, 158)", (600, H), (Xid(HW_XIDS),)),
    FaultKind("gpu_nvlink_error", "gpu", "NVLink CRC errors at a multiple of the link limit; past 4x Xid 74 and "
              "link recoveries", (1800, 6 * H),
              (Rises("nvlink.data", limit="nvlink_crc"), Rises("nvlink.crc_flit", limit="nvlink_crc", scale=5.0),
               Rises("nvlink.replay", limit="nvlink_crc", scale=0.5, required=False),
               Rises("nvlink.recovery", n=3, required=False), Xid((74,), required=False))),
    FaultKind("gpu_gsp_error", "gpu", "Xid 119 (GSP RPC timeout), repeated; sometimes Xid 120", (600, H),
              (Xid((119,)),)),
    FaultKind("gpu_thermal", "gpu", "hot GPU with thermal slowdown clocks-event reasons", (1800, 8 * H),
              (Bits("clocks", 0x20 | 0x40, 0x20 | 0x40 | 0x8), Above("temperature", 80.0, 92.0))),
    FaultKind("pcie_link_degraded", "pci", "PCIe replays at a multiple of DCGM's limit; past 4x the link "
              "retrains to x8", (2 * H, 24 * H),
              (Rises("pcie.replays", limit="pcie_replays"), Shows("pcie.width", (8,), required=False),
               Rises("aer.corrected", required=False))),
    FaultKind("pcie_fatal", "pci", "AER uncorrectable errors on the GPU's PCIe function", (900, H),
              (Rises("aer.uncorrectable"),), klog=(r"nvidia {c}: PCIe Bus Error: severity=Uncorrected",)),
    FaultKind("net_link_bad_cable", "port", "symbol errors at a multiple of the InfiniBand limit; past 6x flaps "
              "and receive errors", (2 * H, 12 * H),
              (Rises("symbol_error", limit="ib_symbol_errors"), Rises("link_error_recovery", n=20, required=False),
               Rises("port_rcv_errors", n=500, required=False))),
    FaultKind("net_link_down", "port", "port state DOWN, physical state Disabled or Polling", (1800, 8 * H),
              (Shows("state", ("DOWN",)), Shows("phys_state", ("Disabled", "Polling")),
               Rises("link_downed", required=False))),
    FaultKind("host_dram_uce", "dimm", "an EDAC uncorrected error on one DIMM, with an MCE", (1800, 4 * H),
              (Rises("ue"),),
              klog=(r"EDAC MC\d+: 1 UE memory read error on {c} ", r"mce: \[Hardware Error\]: CPU \d+: Machine Check")),
    FaultKind("host_dram_ce_storm", "dimm", "EDAC corrected errors on one DIMM at a multiple of the DIMM limit",
              (2 * H, 24 * H), (Rises("ce", limit="dimm_ce"),), klog=(r"EDAC MC\d+: \d+ CE memory read error on {c} ",)),
    FaultKind("host_unreachable", "host", "no telemetry; the host returns rebooted", (H, 12 * H), (Silent(),)),
    FaultKind("app_error", "gpu", "an application Xid (13, 31, 43), then Xid 45", (60, 300),
              (Xid(APP_XIDS), Xid((45,)))),
)}


# --------------------------------------------------------------------------- writing a signature


class Writer(Protocol):
    """Where :func:`stage` writes: ``index`` is a GPU (gpu, pci), an IB port or a DIMM (flat over the
    memory controllers) as the kind's component says."""

    def xid(self, index: int, code: int) -> None: ...
    def bump(self, index: int, counter: str, n: int) -> None: ...
    def set(self, index: int, field: str, value: Any) -> None: ...
    def lose(self, index: int) -> None: ...


@dataclass(frozen=True)
class Strength:
    """How hard :func:`stage` writes a rate fault: ``multiple`` x the limit for ``seconds``. The
    default is one hour of a severe fault (past every strength-gated mark), as one burst."""

    multiple: float = 50.0
    seconds: float = H
    draw: Callable[[float], int] | None = None  # e.g. a seeded Poisson draw; None: the mean, rounded


BURST: Final = Strength()


def count(mark: Rises, strength: Strength) -> int:
    if mark.limit is None:
        return mark.n
    mean = LIMITS[mark.limit].per_hour * strength.multiple * mark.scale * strength.seconds / H
    return strength.draw(mean) if strength.draw is not None else max(1, round(mean))


def stage(mode: str, w: Writer, index: int, *, strength: Strength = BURST, onset: bool = True) -> None:
    """Write one poll of fault ``mode`` on component ``index``: rate counters move by ``strength``,
    states hold; event marks (Xids, event counters, a lost GPU) only at ``onset``."""
    kind = CATALOGUE.get(mode)
    if kind is None:
        raise ValueError(f"unknown failure mode {mode!r}; the catalogue has {', '.join(sorted(CATALOGUE))}")
    if not kind.stageable:
        raise ValueError(f"{mode} has no sample to stage (the host sends nothing)")
    for m in kind.marks:
        if isinstance(m, Xid):
            if onset:
                w.xid(index, m.codes[0])
        elif isinstance(m, Rises):
            if m.limit is not None or onset:
                w.bump(index, m.counter, count(m, strength))
        elif isinstance(m, Shows):
            w.set(index, m.field, m.values[0])
        elif isinstance(m, (Bits, Above)):
            w.set(index, m.field, m.write)
        elif isinstance(m, Lost) and onset:
            w.lose(index)


class Held:
    """A :class:`Writer` that keeps what a fault wrote, for a host whose samples are built afresh
    every poll: :meth:`lay` writes it again onto each new sample (counters keep their raised
    total until :meth:`reset`, a reboot; states and a lost GPU hold while the fault is active; Xids
    once)."""

    def __init__(self) -> None:
        self.totals: dict[tuple[int, str], int] = {}
        self.states: dict[tuple[int, str], Any] = {}
        self.lost: set[int] = set()
        self.xids: list[tuple[int, int]] = []

    def xid(self, index: int, code: int) -> None:
        self.xids.append((index, code))

    def bump(self, index: int, counter: str, n: int) -> None:
        self.totals[(index, counter)] = self.totals.get((index, counter), 0) + n

    def set(self, index: int, field: str, value: Any) -> None:
        self.states[(index, field)] = value

    def lose(self, index: int) -> None:
        self.lost.add(index)

    def lay(self, w: Writer, *, active: bool) -> None:
        if not active:
            self.states.clear()
            self.lost.clear()
        for (i, c), n in self.totals.items():
            w.bump(i, c, n)
        for (i, f), v in self.states.items():
            w.set(i, f, v)
        for i in self.lost:
            w.lose(i)
        for i, code in self.xids:
            w.xid(i, code)
        self.xids = []

    def reset(self) -> None:
        """A reboot: the counters start again from zero."""
        self.totals.clear()


# --------------------------------------------------------------------------- reading a signature


def component_name(kind: str, s: Sample, index: int) -> str:
    """The ground truth's name for component ``index`` of ``s`` (GPU UUID, the GPU's PCI address in
    sysfs form, ``mlx5_N/1``, DIMM label, ``host``)."""
    if kind == "gpu":
        return s.gpus[index].uuid
    if kind == "pci":
        return s.gpus[index].pci_bus_id.lower()[-12:]
    if kind == "port":
        return f"mlx5_{index}/1"
    if kind == "dimm":
        return [d.label for mc in s.edac for d in mc.dimms][index]
    return "host"


def _gpu(s: Sample, kind: str, comp: str) -> GpuSample | None:
    if kind == "pci":
        bus = comp.lower().split(":")[1]  # NVML writes 00000000:2A:00.0, sysfs 0000:2a:00.0
        return next((g for g in s.gpus if g.pci_bus_id.lower().split(":")[1:2] == [bus]), None)
    return next((g for g in s.gpus if g.uuid == comp), None)


def _gpu_value(g: GpuSample, name: str) -> Any:
    e, r, p, n = g.ecc, g.remapped_rows, g.pcie, g.nvlink
    values: dict[str, Callable[[], Any]] = {
        "ecc.dram_corrected": lambda: e and e.dram_corrected_volatile,
        "ecc.dram_uncorrected": lambda: e and e.dram_uncorrected_volatile,
        "ecc.sram_uncorrected": lambda: e and e.sram_uncorrected_volatile,
        "ecc.sram_threshold": lambda: e and e.sram_threshold_exceeded,
        "remap.pending": lambda: r and r.pending,
        "remap.failure": lambda: r and r.failure,
        "pcie.replays": lambda: p and p.replay_counter,
        "pcie.width": lambda: p and p.width_current,
        # the data-path counter is CRC_DATA before Hopper and ECC_DATA from Hopper on
        "nvlink.data": lambda: n and sum(x or 0 for x in (*n.crc_data, *n.ecc_data)),
        "nvlink.crc_flit": lambda: n and sum(x or 0 for x in n.crc_flit),
        "nvlink.replay": lambda: n and sum(x or 0 for x in n.replay),
        "nvlink.recovery": lambda: n and sum(x or 0 for x in n.recovery),
        "clocks": lambda: g.clocks_event_reasons,
        "temperature": lambda: g.temperature_c,
    }
    return values[name]()


def value(s: Sample, kind: str, comp: str, name: str) -> Any:
    """Field or counter ``name`` of component ``comp`` in ``s`` (None where the sample lacks it)."""
    if kind in ("gpu", "pci") and not name.startswith("aer."):
        g = _gpu(s, kind, comp)
        return _gpu_value(g, name) if g is not None and g.present else None
    if kind == "pci":
        a = next((a for a in s.aer if a.pci_addr.lower() == comp), None)
        if a is None:
            return None
        if name == "aer.corrected":
            return a.correctable.get("TOTAL_ERR_COR", 0)
        return a.fatal.get("TOTAL_ERR_FATAL", 0) + a.nonfatal.get("TOTAL_ERR_NONFATAL", 0)
    if kind == "port":
        p = next((p for p in s.net_ports if p.device == comp.split("/")[0]), None)
        if p is None:
            return None
        return getattr(p, name) if name in ("state", "phys_state") else p.counters.get(name, 0)
    if kind == "dimm":
        d = next((d for mc in s.edac for d in mc.dimms if d.label == comp), None)
        return getattr(d, name) if d is not None else None
    raise ValueError(f"no field {name!r} on a {kind}")


def _rise(before: Sample | None, window: list[Sample], kind: str, comp: str, name: str) -> int:
    start = (value(before, kind, comp, name) or 0) if before is not None else 0
    return max((value(s, kind, comp, name) or 0 for s in window), default=start) - start


def _xids(before: Sample | None, window: list[Sample], comp: str) -> set[int]:
    """Xids on GPU ``comp``: NVML's, and the kernel log's NVRM lines on the GPU's PCI address (the
    address as the GPU last showed it: a lost GPU has none)."""
    addr = {g.pci_bus_id.lower()[-12:-2] for s in (before, *window) if s is not None for g in s.gpus
            if g.uuid == comp and g.pci_bus_id}
    out = {x.xid for s in window for g in s.gpus if g.uuid == comp for x in g.xids}
    out |= {k.xid for s in window for k in s.kernel_events
            if k.xid is not None and k.pci_addr and k.pci_addr.lower()[:10] in addr}
    return out


def _lost(before: Sample | None, window: list[Sample], comp: str) -> bool:
    """GPU ``comp`` is gone from the sample, or there as ``GPU_IS_LOST`` (by UUID, or by its last
    index: a lost GPU may answer no UUID)."""
    index = next((g.index for s in (before, *window) if s is not None for g in s.gpus if g.uuid == comp), None)
    for s in window:
        g = next((g for g in s.gpus if g.uuid == comp or (not g.uuid and g.index == index)), None)
        if (g is None and len(s.gpus) < s.expected_gpus) or (g is not None and not g.present
                                                              and g.nvml_error == "GPU_IS_LOST"):
            return True
    return False


def _why_not(m: Mark, kind: FaultKind, comp: str, before: Sample | None, window: list[Sample]) -> str | None:
    c = kind.component
    if isinstance(m, Xid):
        return None if set(m.codes) & _xids(before, window, comp) else f"no Xid {'/'.join(map(str, m.codes))}"
    if isinstance(m, Rises):
        rise = _rise(before, window, c, comp, m.counter)
        if m.limit is None:
            return None if rise >= 1 else f"{m.counter} not rising"
        hours = max(window[-1].ts - window[0].ts, 60.0) / H
        need = max(1.0, 0.8 * LIMITS[m.limit].per_hour * m.scale * hours)
        return None if rise >= need else f"{m.counter} rose {rise}, under 0.8x the {m.limit} limit ({need:.0f})"
    if isinstance(m, Shows):
        ok = any(value(s, c, comp, m.field) in m.values for s in window)
        return None if ok else f"{m.field} never {'/'.join(map(str, m.values))}"
    if isinstance(m, Bits):
        ok = any((value(s, c, comp, m.field) or 0) & m.mask for s in window)
        return None if ok else f"{m.field} has none of {m.mask:#x}"
    if isinstance(m, Above):
        ok = any((value(s, c, comp, m.field) or 0) > m.at_least for s in window)
        return None if ok else f"{m.field} never over {m.at_least}"
    if isinstance(m, Lost):
        return None if _lost(before, window, comp) else "GPU not lost"
    if isinstance(m, Silent):
        return None if len(window) <= 1 else f"{len(window) - 1} samples while silent"
    raise TypeError(m)


def missing(mode: str, comp: str, before: Sample | None, window: list[Sample], *,
            optional: bool = False, klog: bool = False) -> list[str]:
    """What of ``mode``'s signature the samples do not show on component ``comp`` (the ground
    truth's name): ``before`` is the component's last sample before onset (None: counters from 0),
    ``window`` the samples during the fault. ``optional`` also checks the marks a severe fault shows;
    ``klog`` the kernel-log lines the fleet engine writes (an NVRM line for each required Xid mark,
    and the kind's ``klog`` patterns)."""
    kind = CATALOGUE[mode]
    if not window and not isinstance(kind.marks[0], Silent):
        return ["no samples"]
    out = []
    for m in kind.marks:
        if m.required or optional:
            why = _why_not(m, kind, comp, before, window)
            if why:
                out.append(why)
    if klog:
        lines = [e.line for s in window for e in s.kernel_events]
        for m in kind.marks:
            if isinstance(m, Xid) and m.required:
                codes = "|".join(map(str, m.codes))
                nvrm = re.compile(rf"NVRM: Xid \(PCI:[0-9a-fA-F:.]+\): ({codes}), ")
                if not any(nvrm.search(ln) for ln in lines):
                    out.append(f"no NVRM line for Xid {'/'.join(map(str, m.codes))}")
        for pattern in kind.klog:
            rx = re.compile(pattern.replace("{c}", re.escape(comp)))
            if not any(rx.search(ln) for ln in lines):
                out.append(f"no kernel line like {pattern!r}")
    return out


def _check_catalogue() -> None:
    """Every fault label of the vocabulary has a kind; every rate mark names a known limit."""
    if set(CATALOGUE) != set(FAULT_LABELS):
        raise AssertionError(f"fault catalogue != vocabulary: {sorted(set(CATALOGUE) ^ set(FAULT_LABELS))}")
    for k in CATALOGUE.values():
        for m in k.marks:
            if isinstance(m, Rises) and m.limit is not None and m.limit not in LIMITS:
                raise AssertionError(f"{k.mode}: unknown limit {m.limit}")


_check_catalogue()
