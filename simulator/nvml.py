"""A simulated NVML with injectable faults, for hosts without a GPU (tests, ``--simulate``, demos).

:class:`SimNvml` is used where the ``pynvml`` module would be: it has the same function names,
takes the same arguments, returns values of the same shapes, and raises pynvml's own exception
classes through ``pynvml.NVMLError(code)`` (so ``except pynvml.NVMLError_GpuIsLost`` catches the
simulated error exactly as the real one). Constants, exception classes and ctypes structs are
pynvml's, looked up on demand.

Fault injection (one method per failure mode NVML can show):

========================  =======================================================================
``fall_off_bus(g)``       every call on GPU g raises GPU_IS_LOST; Xid 79 queued
``vanish(g)``             GPU g no longer enumerates (count drops), as after a driver reload
``dram_uce(g, n)``        DRAM uncorrected +n (volatile and aggregate), Xid 48 (pre-Ampere) or 94/95
``sram_uce(g, n)``        SRAM uncorrected +n, Xid 94/95; ``threshold=True`` sets the SRAM flag
``corrected(g, n, loc)``  corrected ECC +n on "dram" or "sram" (an SBE storm is a large n, Xid 92)
``remap_pending(g)``      remapped-rows pending flag (+1 uncorrectable remap)
``remap_failure(g)``      remapped-rows failure flag, Xid 64
``pcie_downtrain(g)``     current PCIe gen/width below max
``pcie_replays(g, n)``    PCIe replay counter +n
``nvlink_errors(g, l)``   NVLink CRC flit/data, replay, recovery counters +n on link l
``nvlink_down(g, l)``     NVLink l inactive, Xid 74
``thermal(g, temp)``      temperature + SW/HW thermal slowdown clocks-event reasons
``xid(g, n)``             any Xid event (GSP 119/120, hardware 62/109/140/..., app 13/31/43/45)
``hang(g, s)``            every call on GPU g blocks for s seconds (a hung driver call)
``reset_counters()``      driver reload: volatile counters to 0, flags cleared, events dropped
``not_supported(g, fn)``  a function returns NOT_SUPPORTED on GPU g (vGPU guests, old drivers)
========================  =======================================================================
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pynvml

_PASSTHROUGH = ("NVML_", "NVMLError", "nvmlClocksEventReason", "nvmlClocksThrottleReason", "nvmlEventType",
                "c_nvml", "nvmlEccSramErrorStatus")

_REASON_SW_THERMAL = pynvml.nvmlClocksEventReasonSwThermalSlowdown
_REASON_HW_THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown
_REASON_HW = pynvml.nvmlClocksEventReasonHwSlowdown
_REASON_IDLE = pynvml.nvmlClocksEventReasonGpuIdle

_ARCH = {
    # name, pcie gen max, nvlinks, row remapping (Ampere+), per-location SRAM counters
    "hopper": ("NVIDIA H100 80GB HBM3", 5, 18, True),
    "ampere": ("NVIDIA A100-SXM4-80GB", 4, 12, True),
    "volta": ("Tesla V100-SXM2-32GB", 3, 6, False),
}


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # pynvml maps the code to its subclass (NVMLError_GpuIsLost, ...)


@dataclass
class SimHandle:
    serial: int  # stable per physical device, unlike the enumeration index


@dataclass
class SimGpu:
    handle: SimHandle
    uuid: str
    bus_id: str
    name: str
    gen_max: int
    links: int
    remapping: bool
    ecc: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (type, counter, location)
    sram_threshold: bool = False
    remap: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    retired_sbe: list[int] = field(default_factory=list)
    retired_dbe: list[int] = field(default_factory=list)
    retired_pending: int = 0
    gen_cur: int = 0
    width_cur: int = 16
    width_max: int = 16
    replays: int = 0
    link_up: list[int] = field(default_factory=list)
    link_err: dict[tuple[int, int], int] = field(default_factory=dict)
    temp: float = 45.0
    power_mw: int = 250_000
    util: int = 80
    reasons: int = 0
    lost: bool = False
    enumerated: bool = True
    hang_until: float = 0.0
    unsupported: set[str] = field(default_factory=set)


@dataclass
class SimEventData:
    device: SimHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class SimPciInfo:
    busId: str
    bus: int
    device: int = 0
    domain: int = 0


@dataclass
class SimUtil:
    gpu: int
    memory: int


class SimNvml:
    """One simulated host's NVML. Thread-safe: the source reads each GPU from its own thread."""

    def __init__(self, n_gpus: int = 8, *, arch: str = "hopper", seed: int = 0, host: str = "sim",
                 driver: str = "550.54.15") -> None:
        name, gen_max, links, remapping = _ARCH[arch]
        self.arch = arch
        self.driver = driver
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._events: list[SimEventData] = []
        self._event_sets: dict[int, set[int]] = {}  # set id -> registered device serials
        self._inited = 0
        self.calls = 0
        buses = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB] + list(range(0x100, 0x100 + 56))
        self.gpus: list[SimGpu] = []
        for i in range(n_gpus):
            h = self._rng.getrandbits(64)
            uuid = f"GPU-{h >> 32:08x}-{(h >> 16) & 0xFFFF:04x}-{h & 0xFFFF:04x}-{seed & 0xFFFF:04x}-{i:012x}"
            bus = buses[i] & 0xFF
            self.gpus.append(SimGpu(
                handle=SimHandle(i), uuid=uuid, bus_id=f"00000000:{bus:02X}:00.0", name=name,
                gen_max=gen_max, gen_cur=gen_max, links=links, remapping=remapping,
                link_up=[1] * links, temp=40.0 + self._rng.random() * 10,
            ))

    # ------------------------------------------------------------------ module-like surface

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {n for n in dir(pynvml) if n.startswith(_PASSTHROUGH)})

    def __getattr__(self, name: str) -> Any:
        if name.startswith(_PASSTHROUGH):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _gpu(self, handle: SimHandle, fn: str) -> SimGpu:
        self.calls += 1
        if not self._inited:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        g = self.gpus[handle.serial]
        wait = g.hang_until - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if g.lost or not g.enumerated:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in g.unsupported:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g

    def _visible(self) -> list[SimGpu]:
        return [g for g in self.gpus if g.enumerated]

    def nvmlInit(self) -> None:
        self._inited += 1

    def nvmlShutdown(self) -> None:
        if not self._inited:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        self._inited -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        if not self._inited:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self._visible())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimHandle:
        vis = self._visible()
        if not self._inited:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        if not 0 <= index < len(vis):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        g = vis[index]
        self._gpu(g.handle, "nvmlDeviceGetHandleByIndex")  # a lost GPU fails here too, like the real one
        return g.handle

    def nvmlDeviceGetUUID(self, h: SimHandle) -> str:
        return self._gpu(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, h: SimHandle) -> str:
        return self._gpu(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, h: SimHandle) -> SimPciInfo:
        g = self._gpu(h, "nvmlDeviceGetPciInfo")
        return SimPciInfo(busId=g.bus_id, bus=int(g.bus_id.split(":")[1], 16))

    def nvmlDeviceGetMemoryErrorCounter(self, h: SimHandle, error_type: int, counter_type: int, location: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetMemoryErrorCounter")
        dram, sram = pynvml.NVML_MEMORY_LOCATION_DRAM, pynvml.NVML_MEMORY_LOCATION_SRAM
        if location not in (dram, sram, pynvml.NVML_MEMORY_LOCATION_DEVICE_MEMORY):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if location == pynvml.NVML_MEMORY_LOCATION_DEVICE_MEMORY:
            location = dram
        if not g.remapping and location in (dram, sram) and location != dram:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)  # pre-Ampere: no SRAM aggregate location
        return g.ecc.get((error_type, counter_type, location), 0)

    def nvmlDeviceGetTotalEccErrors(self, h: SimHandle, error_type: int, counter_type: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetTotalEccErrors")
        return sum(v for (t, c, _loc), v in g.ecc.items() if t == error_type and c == counter_type)

    def nvmlDeviceGetSramEccErrorStatus(self, h: SimHandle, status: Any) -> int:
        g = self._gpu(h, "nvmlDeviceGetSramEccErrorStatus")
        if not g.remapping:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        unc, agg = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC
        status.aggregateUncSecDed = g.ecc.get((unc, agg, pynvml.NVML_MEMORY_LOCATION_SRAM), 0)
        status.bThresholdExceeded = int(g.sram_threshold)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetRemappedRows(self, h: SimHandle) -> tuple[int, int, int, int]:
        g = self._gpu(h, "nvmlDeviceGetRemappedRows")
        if not g.remapping:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return (g.remap[0], g.remap[1], g.remap[2], g.remap[3])

    def nvmlDeviceGetRetiredPages(self, h: SimHandle, cause: int) -> list[int]:
        g = self._gpu(h, "nvmlDeviceGetRetiredPages")
        if g.remapping:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        dbe = cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        return list(g.retired_dbe if dbe else g.retired_sbe)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: SimHandle) -> int:
        g = self._gpu(h, "nvmlDeviceGetRetiredPagesPendingStatus")
        if g.remapping:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g.retired_pending

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: SimHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkGeneration").gen_cur

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: SimHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkGeneration").gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: SimHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkWidth").width_cur

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: SimHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkWidth").width_max

    def nvmlDeviceGetPcieReplayCounter(self, h: SimHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetPcieReplayCounter").replays

    def nvmlDeviceGetNvLinkState(self, h: SimHandle, link: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetNvLinkState")
        if not 0 <= link < g.links:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g.link_up[link]

    def nvmlDeviceGetNvLinkErrorCounter(self, h: SimHandle, link: int, counter: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetNvLinkErrorCounter")
        if not 0 <= link < g.links:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g.link_err.get((link, counter), 0)

    def nvmlDeviceGetTemperature(self, h: SimHandle, sensor: int) -> int:
        return int(self._gpu(h, "nvmlDeviceGetTemperature").temp)

    def nvmlDeviceGetPowerUsage(self, h: SimHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetUtilizationRates(self, h: SimHandle) -> SimUtil:
        g = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        return SimUtil(gpu=g.util, memory=g.util // 2)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: SimHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons").reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: SimHandle) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksThrottleReasons").reasons

    def nvmlEventSetCreate(self) -> int:
        with self._lock:
            sid = len(self._event_sets) + 1
            self._event_sets[sid] = set()
        return sid

    def nvmlEventSetFree(self, event_set: int) -> None:
        with self._lock:
            self._event_sets.pop(event_set, None)

    def nvmlDeviceRegisterEvents(self, h: SimHandle, event_types: int, event_set: int) -> None:
        self._gpu(h, "nvmlDeviceRegisterEvents")
        if event_set not in self._event_sets:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if event_types & pynvml.nvmlEventTypeXidCriticalError:
            self._event_sets[event_set].add(h.serial)

    def nvmlEventSetWait_v2(self, event_set: int, timeout_ms: int) -> SimEventData:
        with self._lock:
            regs = self._event_sets.get(event_set)
            if regs is None:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            for i, ev in enumerate(self._events):
                if ev.device.serial in regs:
                    return self._events.pop(i)
        if timeout_ms:
            time.sleep(min(timeout_ms, 50) / 1000)
        raise _err(pynvml.NVML_ERROR_TIMEOUT)

    nvmlEventSetWait = nvmlEventSetWait_v2

    # ------------------------------------------------------------------ faults

    def _queue_xid(self, gpu: int, xid: int) -> None:
        with self._lock:
            self._events.append(SimEventData(self.gpus[gpu].handle, pynvml.nvmlEventTypeXidCriticalError, xid))

    def _bump_ecc(self, gpu: int, err_type: int, loc: int, n: int) -> None:
        g = self.gpus[gpu]
        for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
            key = (err_type, counter, loc)
            g.ecc[key] = g.ecc.get(key, 0) + n

    def xid(self, gpu: int, xid: int) -> None:
        self._queue_xid(gpu, xid)

    def fall_off_bus(self, gpu: int) -> None:
        self._queue_xid(gpu, 79)
        self.gpus[gpu].lost = True

    def vanish(self, gpu: int) -> None:
        self.gpus[gpu].enumerated = False

    def dram_uce(self, gpu: int, n: int = 1, *, contained: bool = True) -> None:
        g = self.gpus[gpu]
        self._bump_ecc(gpu, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_MEMORY_LOCATION_DRAM, n)
        if g.remapping:
            g.remap[1] += n
            g.remap[2] = 1
            self._queue_xid(gpu, 94 if contained else 95)
        else:
            g.retired_dbe.extend(self._rng.getrandbits(36) for _ in range(n))
            g.retired_pending = 1
            self._queue_xid(gpu, 48)

    def sram_uce(self, gpu: int, n: int = 1, *, threshold: bool = False, contained: bool = True) -> None:
        self._bump_ecc(gpu, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_MEMORY_LOCATION_SRAM, n)
        self.gpus[gpu].sram_threshold = self.gpus[gpu].sram_threshold or threshold
        self._queue_xid(gpu, 94 if contained else 95)

    def corrected(self, gpu: int, n: int = 1, location: str = "dram") -> None:
        loc = pynvml.NVML_MEMORY_LOCATION_DRAM if location == "dram" else pynvml.NVML_MEMORY_LOCATION_SRAM
        self._bump_ecc(gpu, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, loc, n)
        g = self.gpus[gpu]
        if g.remapping and location == "dram":
            g.remap[0] += n // 1000  # a few correctable-row remaps follow a heavy SBE load

    def sbe_storm(self, gpu: int, n: int = 5000) -> None:
        self.corrected(gpu, n, "dram")
        self._queue_xid(gpu, 92)

    def remap_pending(self, gpu: int) -> None:
        g = self.gpus[gpu]
        g.remap[1] += 1
        g.remap[2] = 1

    def remap_failure(self, gpu: int) -> None:
        self.gpus[gpu].remap[3] = 1
        self._queue_xid(gpu, 64)

    def pcie_downtrain(self, gpu: int, *, gen: int | None = 1, width: int | None = None) -> None:
        g = self.gpus[gpu]
        if gen is not None:
            g.gen_cur = gen
        if width is not None:
            g.width_cur = width

    def pcie_replays(self, gpu: int, n: int = 100) -> None:
        self.gpus[gpu].replays += n

    def nvlink_errors(self, gpu: int, link: int, *, crc_flit: int = 0, crc_data: int = 0, replay: int = 0,
                      recovery: int = 0) -> None:
        g = self.gpus[gpu]
        for counter, n in ((pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, crc_flit),
                           (pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA, crc_data),
                           (pynvml.NVML_NVLINK_ERROR_DL_REPLAY, replay),
                           (pynvml.NVML_NVLINK_ERROR_DL_RECOVERY, recovery)):
            g.link_err[(link, counter)] = g.link_err.get((link, counter), 0) + n

    def nvlink_down(self, gpu: int, link: int) -> None:
        self.gpus[gpu].link_up[link] = 0
        self._queue_xid(gpu, 74)

    def thermal(self, gpu: int, temp_c: float = 92.0, *, hw: bool = True) -> None:
        g = self.gpus[gpu]
        g.temp = temp_c
        g.reasons |= _REASON_SW_THERMAL | ((_REASON_HW_THERMAL | _REASON_HW) if hw else 0)

    def hang(self, gpu: int, seconds: float) -> None:
        self.gpus[gpu].hang_until = time.monotonic() + seconds

    def not_supported(self, gpu: int, *functions: str) -> None:
        self.gpus[gpu].unsupported.update(functions)

    def reset_counters(self) -> None:
        """Driver reload: volatile ECC counters, PCIe replays and NVLink counters restart at 0."""
        with self._lock:
            self._events.clear()
        for g in self.gpus:
            for key in list(g.ecc):
                if key[1] == pynvml.NVML_VOLATILE_ECC:
                    g.ecc[key] = 0
            g.replays = 0
            g.link_err.clear()
            g.remap[2] = 0
            g.reasons = 0
            if g.enumerated:
                g.lost = False

    def tick(self) -> None:
        """Healthy background motion between polls: temperature, power, utilisation."""
        for g in self.gpus:
            if g.reasons & (_REASON_HW_THERMAL | _REASON_SW_THERMAL):
                continue
            g.temp = min(85.0, max(30.0, g.temp + self._rng.uniform(-1.0, 1.0)))
            g.power_mw = int(min(700_000, max(60_000, g.power_mw + self._rng.uniform(-20_000, 20_000))))
            g.util = self._rng.randint(0, 100)
            g.reasons = _REASON_IDLE if g.util < 5 else 0
