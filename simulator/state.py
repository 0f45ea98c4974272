"""Mutable per-host state of the simulated fleet and its rendering into contract structs.

Sub-structs that did not change since the last poll (ECC, remapped rows, NVLink arrays, ports, AER,
EDAC) are cached and reused, so a poll builds only what moved (temperature, power, utilisation).
"""

from __future__ import annotations

import msgspec

from fleethealth.schema import (
    AerDevice,
    EccCounters,
    EdacDimm,
    EdacMc,
    GpuSample,
    KernelEvent,
    NetPort,
    NvlinkCounters,
    PcieLink,
    RemappedRows,
    Sample,
    XidEvent,
    encode,
)

from .topology import (
    COLLECTOR_VERSION,
    GPU_NAME,
    GPUS_PER_HOST,
    HCA_BUSES,
    MCS_PER_HOST,
    NDR_GBPS,
    NVLINKS_PER_GPU,
    GpuSpec,
    HostSpec,
)

PORT_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
                 "port_rcv_remote_physical_errors", "port_xmit_discards", "local_link_integrity_errors",
                 "excessive_buffer_overrun_errors", "port_rcv_constraint_errors")
AER_COR = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF",
           "TOTAL_ERR_COR")
AER_FATAL = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP",
             "ECRC", "UnsupReq", "ACSViol", "TOTAL_ERR_FATAL")
AER_NONFATAL = (*AER_FATAL[:-1], "TOTAL_ERR_NONFATAL")



_TAIL_ENCODER = msgspec.json.Encoder()  # the contract's encoder settings (fleethealth.schema.encode)


class _Dyn(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """The per-poll tail of a GpuSample (same field names and order as the contract)."""

    temperature_c: float | None = None
    power_w: float | None = None
    utilization_pct: float | None = None
    clocks_event_reasons: int | None = None
    xids: list[XidEvent] = []


def _raw_list(items: list[bytes]) -> msgspec.Raw | list:
    return msgspec.Raw(b"[" + b",".join(items) + b"]") if items else []


# NVML clocks-event reason bits
CLK_GPU_IDLE = 0x1
CLK_HW_SLOWDOWN = 0x8
CLK_SW_THERMAL = 0x20
CLK_HW_THERMAL = 0x40


class GpuState:
    __slots__ = ("spec", "uuid", "ecc", "sram_thr", "remap", "replay", "width", "nvl", "nvl_active",
                 "lost", "thermal_add", "clk_fault", "xids", "dirty", "_ecc", "_remap", "_nvl", "_pcie")

    def __init__(self, spec: GpuSpec, uuid: str) -> None:
        self.spec = spec
        self.uuid = uuid
        # dram_ce_v, dram_ue_v, sram_ce_v, sram_ue_v, dram_ce_a, dram_ue_a, sram_ce_a, sram_ue_a
        self.ecc = [0] * 8
        self.sram_thr = False
        self.remap = [0, 0, False, False]  # correctable, uncorrectable, pending, failure
        self.replay = 0
        self.width = 16
        self.nvl = [[0] * NVLINKS_PER_GPU for _ in range(4)]  # crc_flit, crc_data, replay, recovery
        self.nvl_active = [True] * NVLINKS_PER_GPU
        self.lost = 0  # 0 ok, 1 present=False/GPU_IS_LOST, 2 not enumerated at all
        self.thermal_add = 0  # extra degrees from a cooling fault
        self.clk_fault = 0  # clocks-event bits forced by a fault
        self.xids: list[XidEvent] = []
        self.dirty = True
        self._pcie: dict[tuple[int, int, int], bytes] = {}

    def add_ecc(self, i: int, n: int) -> None:
        """Increment volatile counter ``i`` (0..3) and its aggregate twin."""
        self.ecc[i] += n
        self.ecc[i + 4] += n
        self.dirty = True

    def reset_volatile(self) -> None:
        """Driver reload / GPU reset / reboot: volatile ECC, NVLink and PCIe replay counters restart."""
        self.ecc[0:4] = [0, 0, 0, 0]
        self.nvl = [[0] * NVLINKS_PER_GPU for _ in range(4)]
        self.nvl_active = [True] * NVLINKS_PER_GPU
        self.replay = 0
        self.remap[2] = False
        self.dirty = True
        self._pcie.clear()

    def _refresh(self) -> None:
        e = self.ecc
        self._ecc = EccCounters(
            dram_corrected_volatile=e[0], dram_uncorrected_volatile=e[1], sram_corrected_volatile=e[2],
            sram_uncorrected_volatile=e[3], dram_corrected_aggregate=e[4], dram_uncorrected_aggregate=e[5],
            sram_corrected_aggregate=e[6], sram_uncorrected_aggregate=e[7], sram_threshold_exceeded=self.sram_thr)
        r = self.remap
        self._remap = RemappedRows(correctable=r[0], uncorrectable=r[1], pending=bool(r[2]), failure=bool(r[3]))
        n = self.nvl
        self._nvl = NvlinkCounters(active=list(self.nvl_active), crc_flit=list(n[0]), crc_data=list(n[1]),
                                   replay=list(n[2]), recovery=list(n[3]))
        self.dirty = False

    def head(self, gen: int) -> bytes:
        """The encoded GpuSample up to (not including) ``,"temperature_c"``, cached until a counter moves."""
        if self.dirty:
            self._refresh()
            self._pcie.clear()
        key = (gen, self.width, self.replay)
        head = self._pcie.get(key)
        if head is None:
            if len(self._pcie) > 8:
                self._pcie.clear()
            s = self.spec
            pcie = PcieLink(gen_current=gen, gen_max=5, width_current=self.width, width_max=16,
                            replay_counter=self.replay, replay_rollover=0)
            head = self._pcie[key] = encode(GpuSample(
                index=s.index, uuid=self.uuid, pci_bus_id=s.nvml_bus_id, name=GPU_NAME, ecc=self._ecc,
                remapped_rows=self._remap, pcie=pcie, nvlink=self._nvl))[:-1]
        return head

    def render(self, temp: int, power: float, util: int) -> bytes:
        """This GPU's JSON object, byte-identical to ``encode(GpuSample(...))``: the part before the
        temperature is cached until a counter moves; only the per-poll tail is encoded each time."""
        s = self.spec
        if self.lost:
            return encode(GpuSample(index=s.index, uuid=self.uuid, pci_bus_id=s.nvml_bus_id, name=GPU_NAME,
                                    present=False, nvml_error="GPU_IS_LOST"))
        head = self.head(5 if util > 0 else 1)  # ASPM/power saving: an idle H100 trains down to gen1
        clk = self.clk_fault | (CLK_GPU_IDLE if util == 0 else 0)
        xids = self.xids
        if xids:
            self.xids = []
        if xids:
            tail = _TAIL_ENCODER.encode(_Dyn(temperature_c=float(temp + self.thermal_add), power_w=power,
                               utilization_pct=float(util), clocks_event_reasons=clk, xids=xids))
            return head + b"," + tail[1:]
        # the common case, formatted directly: integral temperature/utilisation, power to 0.1 W
        # (float repr here equals msgspec's shortest round-trip form; a test re-encodes every line)
        return head + (f',"temperature_c":{temp + self.thermal_add}.0,"power_w":{power!r},'
                       f'"utilization_pct":{util}.0,"clocks_event_reasons":{clk}}}').encode()


# PMA PortCounters widths (IBTA vol. 1, PortCounters attribute): they saturate, they do not wrap.
SATURATES_AT = {"symbol_error": 0xFFFF, "port_rcv_errors": 0xFFFF, "link_error_recovery": 0xFF, "link_downed": 0xFF}


class PortState:
    __slots__ = ("device", "hca_pci", "counters", "state", "phys", "rate", "_port", "dirty")

    def __init__(self, device: str, hca_pci: str) -> None:
        self.device = device
        self.hca_pci = hca_pci
        self.counters = dict.fromkeys(PORT_COUNTERS, 0)
        self.state, self.phys, self.rate = "ACTIVE", "LinkUp", NDR_GBPS
        self.dirty = True

    def bump(self, name: str, n: int = 1) -> None:
        v = self.counters[name] + n
        if name in SATURATES_AT:
            v = min(v, SATURATES_AT[name])
        self.counters[name] = v
        self.dirty = True

    def set_link(self, state: str, phys: str, rate: float | None = None) -> None:
        self.state, self.phys = state, phys
        if rate is not None:
            self.rate = rate
        self.dirty = True

    def reset(self) -> None:
        self.counters = dict.fromkeys(PORT_COUNTERS, 0)
        self.dirty = True

    def render(self) -> NetPort:
        if self.dirty:
            self._port = NetPort(device=self.device, port=1, state=self.state, phys_state=self.phys,
                                 rate_gbps=self.rate, counters=dict(self.counters))
            self.dirty = False
        return self._port


class HostState:
    """Everything that changes on one host."""

    def __init__(self, spec: HostSpec, uuids: list[str], boot_id: str, boot_ts: float) -> None:
        self.spec = spec
        self.gpus = [GpuState(g, u) for g, u in zip(spec.gpus, uuids, strict=True)]
        self.ports = [PortState(d, f"0000:{b:02x}:00.0") for d, b in zip(spec.ports, HCA_BUSES, strict=True)]
        self.aer = [[dict.fromkeys(AER_COR, 0), dict.fromkeys(AER_FATAL, 0), dict.fromkeys(AER_NONFATAL, 0)]
                    for _ in range(GPUS_PER_HOST)]
        self.edac_ce = [0] * len(spec.dimms)
        self.edac_ue = [0] * len(spec.dimms)
        self.boot_id = boot_id
        self.boot_ts = boot_ts
        self.driver = ""
        self.seq = 0
        self.quiet_until = -1  # tick index before which the host sends nothing
        self._ports: msgspec.Raw | list = []
        self.events: list[KernelEvent] = []
        self.tmpl_mid = b""  # the fast path's cached Sample fragment before the first GPU (fastpath.build)
        self.aer_dirty = self.edac_dirty = True
        self._aer: msgspec.Raw | list = []
        self._edac: msgspec.Raw | list = []

    def uptime(self, ts: float) -> float:
        return max(ts - self.boot_ts, 0.5)

    def add_aer(self, g: int, severity: str, name: str, n: int = 1) -> None:
        table, total = {"corrected": (0, "TOTAL_ERR_COR"), "fatal": (1, "TOTAL_ERR_FATAL"),
                        "non-fatal": (2, "TOTAL_ERR_NONFATAL")}[severity]
        d = self.aer[g][table]
        d[name] += n
        d[total] += n
        self.aer_dirty = True

    def add_edac(self, d: int, ce: int = 0, ue: int = 0) -> None:
        self.edac_ce[d] += ce
        self.edac_ue[d] += ue
        self.edac_dirty = True

    def reboot(self, boot_id: str, ts: float, driver: str | None = None) -> None:
        """New boot: every volatile counter restarts (GPU, IB port, AER, EDAC); aggregates persist."""
        self.boot_id = boot_id
        self.boot_ts = ts
        if driver is not None:
            self.driver = driver
        for g in self.gpus:
            g.reset_volatile()
            g.lost = 0
            g.thermal_add = 0
            g.clk_fault = 0
            g.width = 16
        for p in self.ports:
            p.reset()
            p.set_link("ACTIVE", "LinkUp", NDR_GBPS)
        for a in self.aer:
            for d in a:
                for k in d:
                    d[k] = 0
        self.edac_ce = [0] * len(self.edac_ce)
        self.edac_ue = [0] * len(self.edac_ue)
        self.aer_dirty = self.edac_dirty = True

    def render_ports(self) -> msgspec.Raw | list:
        ports = self.ports
        if any(p.dirty for p in ports):
            self._ports = _raw_list([encode(p.render()) for p in ports])
        return self._ports

    def _render_aer(self) -> msgspec.Raw | list:
        """AER counters as sysfs has them, sparse: the TOTAL_* lines always, other names once non-zero."""
        if self.aer_dirty:
            self._aer = _raw_list([encode(AerDevice(
                pci_addr=g.spec.pci_addr, correctable=_sparse(a[0]), fatal=_sparse(a[1]), nonfatal=_sparse(a[2]),
                link_width_current=g.width, link_width_max=16)) for g, a in zip(self.gpus, self.aer, strict=True)])
            self.aer_dirty = False
        return self._aer

    def _render_edac(self) -> msgspec.Raw | list:
        if self.edac_dirty:
            dimms = self.spec.dimms
            mcs = []
            for mc in range(MCS_PER_HOST):
                idx = [i for i, (m, _) in enumerate(dimms) if m == mc]
                mcs.append(encode(EdacMc(
                    mc=mc, ce_count=sum(self.edac_ce[i] for i in idx), ue_count=sum(self.edac_ue[i] for i in idx),
                    ce_noinfo_count=0, ue_noinfo_count=0,
                    dimms=[EdacDimm(label=dimms[i][1], ce=self.edac_ce[i], ue=self.edac_ue[i]) for i in idx])))
            self._edac = _raw_list(mcs)
            self.edac_dirty = False
        return self._edac

    def render(self, ts: float, temps: list[int], powers: list[float], utils: list[int]) -> bytes:
        """One poll as contract bytes, equal to ``encode(Sample(...))`` (tested)."""
        self.seq += 1
        gpus = [g.render(temps[i], powers[i], utils[i]) for i, g in enumerate(self.gpus) if g.lost != 2]
        ev = self.events
        if ev:
            self.events = []
        sp = self.spec
        return encode(Sample(host=sp.name, cluster=sp.cluster, rack=sp.rack, ts=ts, seq=self.seq,
                             collector_version=COLLECTOR_VERSION, boot_id=self.boot_id, driver_version=self.driver,
                             expected_gpus=GPUS_PER_HOST, gpus=_raw_list(gpus), net_ports=self.render_ports(),  # type: ignore[arg-type]
                             aer=self._render_aer(), edac=self._render_edac(), kernel_events=ev))  # type: ignore[arg-type]


def _sparse(d: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in d.items() if v or k.startswith("TOTAL_")}
