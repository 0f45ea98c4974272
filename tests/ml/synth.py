"""A small seeded fleet of hand-built samples with ground truth, for the ML tests.

The fleet is its own (each test controls exactly what is injected: a labelled fault, an unlabelled
drift, a reboot, a counter wrap, and the fleet stays tiny and fast); its faults are the one fault
model's (simulator/faultmodel.py), staged every poll through the fixtures' sample writer at
:data:`MULTIPLE` x the operating limits of simulator/limits.py. Hosts run jobs (all GPUs of a host
share a load level), temperatures and power follow load with per-GPU offsets and noise, counters
see rare background noise, and hosts reboot now and then (new boot_id, volatile counters back to 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from detectors.ml.labels import Fault
from fleethealth.schema import (
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
from simulator import faultmodel
from simulator.fixtures import SampleWriter

MODES = ("gpu_dram_uce", "gpu_ecc_sbe_storm", "gpu_nvlink_error", "gpu_thermal", "pcie_link_degraded",
         "gpu_gsp_error", "gpu_fell_off_bus", "net_link_bad_cable", "net_link_down", "host_dram_ce_storm",
         "host_dram_uce", "gpu_row_remap_pending")
NGPU, NPORT, NLINK = 8, 4, 6
PORT_C = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors")
T0 = 1_767_225_600.0  # 2026-01-01
MULTIPLE = 50.0  # fault strength: x the operating limit (a severe fault, as collect --inject stages it)


@dataclass
class _Gpu:
    ce: int = 0
    ue: int = 0
    replay: int = 0
    crc: list[int] = field(default_factory=lambda: [0] * NLINK)
    offset: float = 0.0


@dataclass
class _Host:
    name: str
    rack: str
    gpus: list[_Gpu]
    ports: list[dict[str, int]]
    edac_ce: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    edac_ue: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    boot: int = 0
    util: float = 0.0
    fault: faultmodel.Held = field(default_factory=faultmodel.Held)


@dataclass
class Drift:
    """An unlabelled degradation no rule names: a GPU running hot or a port slowly gathering errors."""

    host: int
    kind: str  # "temp" or "port"
    index: int
    start_s: float
    amount: float  # °C for temp; symbol errors per sample at the end, for port


def fleet(seed: int, hosts: int = 16, duration_s: float = 2 * 3600.0, interval_s: float = 10.0,
          faults: int = 8, drifts: tuple[Drift, ...] = (), reboots: bool = True,
          modes: tuple[str, ...] = MODES) -> tuple[list[Sample], list[Fault]]:
    """Samples in time order and ground truth. ``faults`` hosts get one labelled fault each."""
    rng = np.random.default_rng(seed)
    hs = [_Host(f"node-{seed}-{h:03d}", f"r{h // 8}", [_Gpu(offset=float(rng.normal(0, 1.5))) for _ in range(NGPU)],
                [dict.fromkeys(PORT_C, 0) for _ in range(NPORT)]) for h in range(hosts)]
    ticks = int(duration_s / interval_s)
    truth: list[Fault] = []
    plan: dict[int, tuple[str, int, int, int]] = {}  # host -> (mode, component index, start, end tick)
    for h in rng.choice(hosts, size=min(faults, hosts), replace=False):
        mode = modes[int(rng.integers(len(modes)))]
        start = int(rng.integers(ticks // 6, ticks // 2))
        end = min(ticks, start + int(rng.integers(ticks // 6, ticks // 3)))
        kind = faultmodel.CATALOGUE[mode].component
        comp = int(rng.integers(NPORT if kind == "port" else NGPU)) % (4 if kind == "dimm" else NGPU)
        plan[int(h)] = (mode, comp, start, end)
        host = hs[int(h)]
        # a DRAM UCE's pending row remap lingers (as in the fleet engine's Xid 48+63 variant)
        secondary = ("gpu_row_remap_pending",) if mode == "gpu_dram_uce" else ()
        truth.append(Fault(host.name, component(kind, host.name, comp), mode, T0 + start * interval_s,
                           T0 + end * interval_s, secondary))
    out: list[Sample] = []
    for t in range(ticks):
        ts = T0 + t * interval_s
        for hi, host in enumerate(hs):
            if t % 180 == 0:
                host.util = float(rng.choice([0.0, 85.0, 95.0]))
            if reboots and t > 0 and rng.random() < 1 / 3000:
                host.boot += 1
                for g in host.gpus:
                    g.ce = g.ue = g.replay = 0
                    g.crc = [0] * NLINK
                host.ports = [dict.fromkeys(PORT_C, 0) for _ in range(NPORT)]
                host.edac_ce, host.edac_ue = [0, 0, 0, 0], [0, 0, 0, 0]
                host.fault.reset()
            out.append(_sample(rng, host, hi, t, ts, plan.get(hi), drifts, interval_s))
    return out, truth


def uuid(host: str, i: int) -> str:
    return f"GPU-{host}-{i:02d}"


def component(kind: str, host: str, i: int) -> str:
    """The ground truth's name for this fleet's component ``i`` (as faultmodel.component_name)."""
    return {"gpu": uuid(host, i), "pci": f"0000:{0x18 + 16 * i:02x}:00.0", "port": f"mlx5_{i}/1",
            "dimm": f"DIMM{i}"}.get(kind, "host")


def _sample(rng: np.random.Generator, host: _Host, hi: int, t: int, ts: float,
            fault: tuple[str, int, int, int] | None, drifts: tuple[Drift, ...], interval_s: float) -> Sample:
    mode, comp, start, end = fault if fault else ("", -1, 0, 0)
    active = bool(fault) and start <= t < end
    onset = bool(fault) and t == start
    gpus = []
    for i, g in enumerate(host.gpus):
        util = max(0.0, host.util + float(rng.normal(0, 2))) if host.util else 0.0
        temp = 35 + 0.4 * util + g.offset + float(rng.normal(0, 0.7))
        power = 70 + 6 * util + float(rng.normal(0, 8))
        g.ce += int(rng.poisson(0.002))
        thr = 0x1 if not util else 0
        for d in drifts:
            if d.host == hi and d.kind == "temp" and d.index == i and ts >= T0 + d.start_s:
                temp += min(d.amount, d.amount * (ts - T0 - d.start_s) / 1800.0)
        gpus.append(GpuSample(
            index=i, uuid=uuid(host.name, i), pci_bus_id=f"00000000:{0x18 + 16 * i:02X}:00.0",
            ecc=EccCounters(dram_corrected_volatile=g.ce, dram_uncorrected_volatile=g.ue, sram_corrected_volatile=0,
                            sram_uncorrected_volatile=0),
            remapped_rows=RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False),
            pcie=PcieLink(gen_current=5 if util else 1, gen_max=5, width_current=16, width_max=16,
                          replay_counter=g.replay),
            nvlink=NvlinkCounters(active=[True] * NLINK, crc_flit=list(g.crc), crc_data=[0] * NLINK,
                                  replay=[0] * NLINK, recovery=[0] * NLINK),
            temperature_c=round(temp, 1), power_w=round(power, 1), utilization_pct=round(util, 1),
            clocks_event_reasons=thr))
    ports = []
    for p, c in enumerate(host.ports):
        c["symbol_error"] += int(rng.poisson(0.001))
        state, phys = "ACTIVE", "LinkUp"
        for d in drifts:
            if d.host == hi and d.kind == "port" and d.index == p and ts >= T0 + d.start_s:
                c["symbol_error"] += int(rng.poisson(min(d.amount, d.amount * (ts - T0 - d.start_s) / 3600.0)))
        ports.append(NetPort(device=f"mlx5_{p}", port=1, state=state, phys_state=phys, rate_gbps=400.0,
                             counters=dict(c)))
    edac = [EdacMc(mc=m, ce_count=host.edac_ce[2 * m] + host.edac_ce[2 * m + 1],
                   ue_count=host.edac_ue[2 * m] + host.edac_ue[2 * m + 1],
                   dimms=[EdacDimm(label=f"DIMM{2 * m + k}", ce=host.edac_ce[2 * m + k], ue=host.edac_ue[2 * m + k])
                          for k in (0, 1)]) for m in (0, 1)]
    s = Sample(host=host.name, cluster="test", rack=host.rack, ts=ts, seq=t + 1, collector_version="synth",
               boot_id=f"boot-{host.boot}", expected_gpus=NGPU, gpus=gpus, net_ports=ports, edac=edac)
    if active:
        strength = faultmodel.Strength(MULTIPLE, interval_s, draw=lambda mean: int(rng.poisson(mean)))
        faultmodel.stage(mode, host.fault, comp, strength=strength, onset=onset)
    host.fault.lay(SampleWriter(s), active=active)
    return s
