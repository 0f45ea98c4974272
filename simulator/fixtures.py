"""Literal telemetry samples shaped like a real 8-GPU H100 host with 8 InfiniBand ports: for tests,
the contract suite and the benchmark. ``HostSeries`` yields a host's samples over time, and lets a
caller bend one field at a time (a counter step, a flag, a port state) to stage an exact boundary
case; a whole fault of the vocabulary is staged from the one fault model
(:mod:`simulator.faultmodel`) with :func:`fault` or ``HostSeries.inject``, through
:class:`SampleWriter`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from fleethealth.schema import (
    AerDevice,
    EccCounters,
    EdacDimm,
    EdacMc,
    GpuSample,
    NetPort,
    NvlinkCounters,
    PcieLink,
    RemappedRows,
    Sample,
    XidEvent,
)

from . import faultmodel

IB_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
               "port_xmit_discards", "port_rcv_data", "port_xmit_data", "port_rcv_packets", "port_xmit_packets")


def gpu(i: int, host: str = "h", *, links: int = 18, **over: Any) -> GpuSample:
    bus = 0x18 + 0x10 * i
    g = GpuSample(
        index=i, uuid=f"GPU-{host}-{i:02d}-0000-4c2a-9b1e", pci_bus_id=f"00000000:{bus:02X}:00.0",
        name="NVIDIA H100 80GB HBM3",
        ecc=EccCounters(dram_corrected_volatile=0, dram_uncorrected_volatile=0, sram_corrected_volatile=0,
                        sram_uncorrected_volatile=0, dram_corrected_aggregate=3, dram_uncorrected_aggregate=0,
                        sram_corrected_aggregate=0, sram_uncorrected_aggregate=0, sram_threshold_exceeded=False),
        remapped_rows=RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False),
        pcie=PcieLink(gen_current=5, gen_max=5, width_current=16, width_max=16, replay_counter=0, replay_rollover=0),
        nvlink=NvlinkCounters(active=[True] * links, crc_flit=[0] * links, crc_data=[0] * links,
                              replay=[0] * links, recovery=[0] * links),
        temperature_c=55.0, power_w=420.0, utilization_pct=90.0, clocks_event_reasons=0,
    )
    for k, v in over.items():
        setattr(g, k, v)
    return g


def port(dev: int, **over: Any) -> NetPort:
    p = NetPort(device=f"mlx5_{dev}", port=1, link_layer="InfiniBand", state="ACTIVE", phys_state="LinkUp",
                rate_gbps=400.0, counters=dict.fromkeys(IB_COUNTERS, 0))
    for k, v in over.items():
        setattr(p, k, v)
    return p


def sample(host: str = "gpu-node-001", ts: float = 1_700_000_000.0, seq: int = 0, *, gpus: int = 8,
           ports: int = 8, boot_id: str = "boot-a", driver: str = "550.90.07") -> Sample:
    return Sample(
        host=host, cluster="c1", rack="r1", ts=ts, seq=seq, collector_version="0.1.0", boot_id=boot_id,
        driver_version=driver, expected_gpus=gpus, gpus=[gpu(i, host) for i in range(gpus)],
        net_ports=[port(d) for d in range(ports)],
        aer=[AerDevice(pci_addr=f"0000:{0x18 + 0x10 * i:02x}:00.0", correctable={"RxErr": 0, "TOTAL_ERR_COR": 2},
                       fatal={"TOTAL_ERR_FATAL": 0}, nonfatal={"TOTAL_ERR_NONFATAL": 0},
                       link_gen_current=5, link_gen_max=5, link_width_current=16, link_width_max=16)
             for i in range(2)],
        edac=[EdacMc(mc=m, ce_count=0, ue_count=0, ce_noinfo_count=0, ue_noinfo_count=0,
                     dimms=[EdacDimm(label=f"CPU{m}_DIMM_{c}", ce=0, ue=0) for c in "ABCD"]) for m in range(2)],
    )


class HostSeries:
    """A host polled every ``interval`` seconds; ``advance(fn)`` returns the next sample after ``fn``
    mutates a copy (counters move monotonically as on real hardware unless fn says otherwise)."""

    def __init__(self, host: str = "gpu-node-001", t0: float = 1_700_000_000.0, interval: float = 10.0,
                 **kw: Any) -> None:
        self.base = sample(host, t0, 0, **kw)
        self.ts = t0
        self.seq = -1
        self.interval = interval
        self.data_bytes = 0
        self.pending_xids: list[tuple[int, int]] = []

    def inject(self, mode: str, index: int = 0, *, strength: faultmodel.Strength = faultmodel.BURST) -> None:
        """From the next sample on, the host carries fault ``mode`` on component ``index`` (the
        one fault model's signature, written once into the host's state: counters stay raised,
        flags stay set; its Xids appear in the next sample only)."""
        self.pending_xids += _staged_xids(self.base, mode, index, strength)

    def advance(self, fn: Callable[[Sample], None] | None = None) -> Sample:
        self.seq += 1
        self.ts = self.base.ts + self.seq * self.interval
        self.data_bytes += 1 << 20
        s = msgspec.structs.replace(self.base, ts=self.ts, seq=self.seq)
        s.net_ports = [msgspec.structs.replace(p, counters={**p.counters, "port_rcv_data": self.data_bytes,
                                                            "port_xmit_data": self.data_bytes})
                       for p in self.base.net_ports]
        # fresh lists: an fn that replaces an element changes this sample only, never the base (a fed
        # sample is not mutated afterwards; the engine may compare the next sample's lists by identity)
        s.aer = list(self.base.aer)
        s.edac = [msgspec.structs.replace(m, dimms=list(m.dimms)) for m in self.base.edac]
        s.gpus = [g if (g.clocks_event_reasons or 0) & 0x60 or not g.present  # a staged thermal fault keeps its heat
                  else msgspec.structs.replace(g, temperature_c=55.0 + (self.seq + g.index) % 7) for g in self.base.gpus]
        for i, code in self.pending_xids:
            s.gpus[i] = msgspec.structs.replace(s.gpus[i], xids=[*s.gpus[i].xids, XidEvent(xid=code, ts=self.ts)])
        self.pending_xids = []
        if fn is not None:
            fn(s)
        return s


def _staged_xids(s: Sample, mode: str, index: int, strength: faultmodel.Strength) -> list[tuple[int, int]]:
    w = SampleWriter(s, xids=False)
    faultmodel.stage(mode, w, index, strength=strength)
    return w.xids


def fault(s: Sample, mode: str, index: int = 0, *, strength: faultmodel.Strength = faultmodel.BURST,
          onset: bool = True) -> Sample:
    """``s`` with fault ``mode`` staged on component ``index`` (see :func:`simulator.faultmodel.stage`);
    ``s`` itself is not changed."""
    out = msgspec.structs.replace(s, gpus=list(s.gpus), net_ports=list(s.net_ports), aer=list(s.aer),
                                  edac=list(s.edac))
    faultmodel.stage(mode, SampleWriter(out), index, strength=strength, onset=onset)
    return out


class SampleWriter:
    """:class:`simulator.faultmodel.Writer` onto a contract sample: every struct it changes is
    replaced, never edited in place, so samples that share parts (``HostSeries``) stay apart."""

    def __init__(self, s: Sample, *, xids: bool = True) -> None:
        self.s = s
        self.to_sample = xids
        self.xids: list[tuple[int, int]] = []  # (gpu, code) when not written into the sample

    def _gpu(self, i: int, **parts: Any) -> None:
        self.s.gpus[i] = msgspec.structs.replace(self.s.gpus[i], **parts)

    def xid(self, index: int, code: int) -> None:
        if not self.to_sample:
            self.xids.append((index, code))
            return
        g = self.s.gpus[index]
        self._gpu(index, xids=[*g.xids, XidEvent(xid=code, ts=self.s.ts)])

    def lose(self, index: int) -> None:
        g = self.s.gpus[index]
        self.s.gpus[index] = GpuSample(index=g.index, uuid=g.uuid, pci_bus_id=g.pci_bus_id, name=g.name,
                                       present=False, nvml_error="GPU_IS_LOST", xids=list(g.xids))

    def _aer(self, index: int) -> tuple[int, AerDevice]:
        addr = self.s.gpus[index].pci_bus_id.lower()[-12:]
        for k, a in enumerate(self.s.aer):
            if a.pci_addr.lower() == addr:
                return k, a
        self.s.aer.append(AerDevice(pci_addr=addr))
        return len(self.s.aer) - 1, self.s.aer[-1]

    def _dimm(self, index: int) -> tuple[int, int]:
        flat = [(m, d) for m, mc in enumerate(self.s.edac) for d in range(len(mc.dimms))]
        return flat[index]

    def bump(self, index: int, counter: str, n: int) -> None:
        s = self.s
        if counter.startswith(("ecc.", "pcie.", "nvlink.")):
            g = s.gpus[index]
            part, name = counter.split(".")
            if part == "ecc":
                loc, kind = name.split("_")
                vol, agg = f"{loc}_{kind}_volatile", f"{loc}_{kind}_aggregate"
                e = g.ecc or EccCounters()
                self._gpu(index, ecc=msgspec.structs.replace(e, **{vol: (getattr(e, vol) or 0) + n,
                                                                  agg: (getattr(e, agg) or 0) + n}))
            elif part == "pcie":
                p = g.pcie or PcieLink()
                self._gpu(index, pcie=msgspec.structs.replace(p, replay_counter=(p.replay_counter or 0) + n))
            else:
                nv = g.nvlink or NvlinkCounters(active=[True], crc_flit=[0], crc_data=[0], replay=[0], recovery=[0])
                attr = "crc_data" if name == "data" else name
                row = list(getattr(nv, attr)) or [0] * len(nv.active)
                row[0] = (row[0] or 0) + n  # link 0
                self._gpu(index, nvlink=msgspec.structs.replace(nv, **{attr: row}))
        elif counter.startswith("aer."):
            k, a = self._aer(index)
            if counter == "aer.corrected":
                cor = {**a.correctable, "Timeout": a.correctable.get("Timeout", 0) + n,
                       "TOTAL_ERR_COR": a.correctable.get("TOTAL_ERR_COR", 0) + n}
                s.aer[k] = msgspec.structs.replace(a, correctable=cor)
            else:
                fat = {**a.fatal, "MalfTLP": a.fatal.get("MalfTLP", 0) + n,
                       "TOTAL_ERR_FATAL": a.fatal.get("TOTAL_ERR_FATAL", 0) + n}
                s.aer[k] = msgspec.structs.replace(a, fatal=fat)
        elif counter in ("ce", "ue"):
            m, d = self._dimm(index)
            mc = s.edac[m]
            dimms = list(mc.dimms)
            dimms[d] = msgspec.structs.replace(dimms[d], **{counter: (getattr(dimms[d], counter) or 0) + n})
            total = f"{counter}_count"
            s.edac[m] = msgspec.structs.replace(mc, dimms=dimms, **{total: (getattr(mc, total) or 0) + n})
        else:  # an InfiniBand port counter (IB PortCounters saturate at 16 bits: 0xFFFF)
            port = s.net_ports[index]
            s.net_ports[index] = msgspec.structs.replace(
                port, counters={**port.counters, counter: min(0xFFFF, port.counters.get(counter, 0) + n)})

    def set(self, index: int, field: str, value: Any) -> None:
        s = self.s
        if field in ("state", "phys_state"):
            s.net_ports[index] = msgspec.structs.replace(s.net_ports[index], **{field: value})
            return
        g = s.gpus[index]
        if field.startswith("remap."):
            r = g.remapped_rows or RemappedRows()
            self._gpu(index, remapped_rows=msgspec.structs.replace(r, **{field[6:]: value}))
        elif field == "ecc.sram_threshold":
            self._gpu(index, ecc=msgspec.structs.replace(g.ecc or EccCounters(), sram_threshold_exceeded=value))
        elif field == "pcie.width":
            self._gpu(index, pcie=msgspec.structs.replace(g.pcie or PcieLink(), width_current=value))
            addr = g.pci_bus_id.lower()[-12:]
            s.aer[:] = [msgspec.structs.replace(a, link_width_current=value) if a.pci_addr.lower() == addr else a
                        for a in s.aer]  # sysfs sees the same width, where the sample has the device
        elif field == "clocks":
            self._gpu(index, clocks_event_reasons=(g.clocks_event_reasons or 0) | value)
        elif field == "temperature":
            self._gpu(index, temperature_c=value)
        else:
            raise ValueError(f"no field {field!r} to set")
