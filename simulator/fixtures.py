"""Literal telemetry samples shaped like a real 8-GPU H100 host with 8 InfiniBand ports: for tests,
the contract suite and the benchmark. ``HostSeries`` yields a host's samples over time, and lets a
caller bend one field at a time (a counter step, a flag, a port state) to stage a fault.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
)

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

    def advance(self, fn: Callable[[Sample], None] | None = None) -> Sample:
        import msgspec

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
        s.gpus = [msgspec.structs.replace(g, temperature_c=55.0 + (self.seq + g.index) % 7) for g in self.base.gpus]
        if fn is not None:
            fn(s)
        return s
