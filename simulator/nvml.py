"""A simulated NVML that answers the way the driver does, for hosts without a GPU (tests, ``--simulate``).

:class:`SimNvml` is used where the ``pynvml`` module would be: the same function names and
arguments (checked against nvidia-ml-py's ``pynvml.py``), values of the same types -- device
handles are real ``c_nvmlDevice_t`` pointers, event data is a ``c_nvmlEventData_t``, field values a
``c_nvmlFieldValue_t`` array -- and pynvml's own exception classes through ``pynvml.NVMLError(code)``
(so ``except pynvml.NVMLError_GpuIsLost`` catches the simulated error exactly as the real one).

Driver behaviours, each switchable (defaults follow the real driver; tests turn them on or off):

=================================  ==================================================================
structs by reference               ``nvmlDeviceGetSramEccErrorStatus`` needs ``byref(status)``; a
                                   Structure passed as is (by value) fails ARGUMENT_VERSION_MISMATCH
per-architecture error tables      :data:`ARCH_ERRORS`: which calls answer NOT_SUPPORTED on Volta /
                                   Ampere / Hopper / Blackwell (Hopper: NVLink CRC_DATA unsupported,
                                   ECC_DATA counts data-path errors; Blackwell: NVLink5 field values)
``field_error(g, fn, code)``       one function answers any error code on GPU g (UNKNOWN,
                                   CORRUPTED_INFOROM, ...); ``not_supported(g, fn)`` the absent case
``mig(g, on)``                     MIG mode: volatile ECC, remapped rows, utilisation NOT_SUPPORTED
``idle_downclock``                 (default on) ``tick()`` drops an idle GPU's PCIe link to gen 1
32-bit replay counter              the replay counter wraps at 2**32; field 95 counts the rollovers
``fall_off_bus(g, how)``           ``how="lost"``: GPU_IS_LOST on every call; ``"unknown"``: the handle
                                   answers UNKNOWN ("Unable to determine the device handle"); the
                                   device count is unchanged until a driver reload
``hang(g, s)`` / ``hang_all(s)``   one GPU's calls block s seconds / every call (init, count, event
                                   set) blocks: the driver wedged in its lock
``driver_reload()``                every call answers UNINITIALIZED until nvmlInit; event sets are
                                   gone; volatile counters restart at 0; a lost GPU drops out
``event_wait_error(code)``         nvmlEventSetWait answers that code (e.g. GPU_IS_LOST) instead of
                                   TIMEOUT, until cleared with ``event_wait_error(None)``
``init_error(code)``               nvmlInit fails (LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED, ...)
``ecc_mode(g, cur, pending)``      ECC switched off / on, now and after the next reset
``remap_banks(g, ...)``            the row-remapper histogram (banks by spare-row availability)
``xid(g, x, gi=, ci=)``            an Xid event of one MIG instance (gpuInstanceId / computeInstanceId)
temperature limits                 per-architecture thresholds (:data:`THRESHOLDS`); memory
                                   temperature as field value 82; ``nvmlDeviceGetTemperatureV``
                                   (``not_supported``/``field_error`` it to model an older driver)
=================================  ==================================================================

Faults (one method per failure mode): ``dram_uce``, ``sram_uce``, ``corrected``, ``sbe_storm``,
``remap_pending``, ``remap_failure``, ``pcie_downtrain``, ``pcie_replays``, ``nvlink_errors``,
``nvlink_down``, ``thermal``, ``xid``, ``vanish`` (no longer enumerates), ``reset_counters``.
"""

from __future__ import annotations

import ctypes
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pynvml

_PASSTHROUGH = ("NVML_", "NVMLError", "nvmlClocksEventReason", "nvmlClocksThrottleReason", "nvmlEventType",
                "c_nvml", "nvmlEccSramErrorStatus", "struct_c_nvml")

_REASON_SW_THERMAL = pynvml.nvmlClocksEventReasonSwThermalSlowdown
_REASON_HW_THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown
_REASON_HW = pynvml.nvmlClocksEventReasonHwSlowdown
_REASON_IDLE = pynvml.nvmlClocksEventReasonGpuIdle
_NS = pynvml.NVML_ERROR_NOT_SUPPORTED
_VOLATILE, _AGGREGATE = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
_DRAM, _SRAM = pynvml.NVML_MEMORY_LOCATION_DRAM, pynvml.NVML_MEMORY_LOCATION_SRAM
_CRC_FLIT, _CRC_DATA = pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA
_REPLAY, _RECOVERY = pynvml.NVML_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY
_ECC_DATA = pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA
_FI_REPLAY, _FI_ROLLOVER = pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, pynvml.NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER
_FI_MEM_TEMP = pynvml.NVML_FI_DEV_MEMORY_TEMP
_FI_NVL5 = (pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS, pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS,
            pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS)

# name, NVML architecture, pcie gen max, nvlinks, row remapping (Ampere+)
_ARCH = {
    "blackwell": ("NVIDIA B200", pynvml.NVML_DEVICE_ARCH_BLACKWELL, 6, 18, True),
    "hopper": ("NVIDIA H100 80GB HBM3", pynvml.NVML_DEVICE_ARCH_HOPPER, 5, 18, True),
    "ampere": ("NVIDIA A100-SXM4-80GB", pynvml.NVML_DEVICE_ARCH_AMPERE, 4, 12, True),
    "volta": ("Tesla V100-SXM2-32GB", pynvml.NVML_DEVICE_ARCH_VOLTA, 3, 6, False),
}

# nvmlTemperatureThresholds_t -> C: SHUTDOWN, SLOWDOWN, MEM_MAX, GPU_MAX. A100 and H100 from real
# nvidia-smi -q captures in ../shared/corpus (GPU Shutdown / Slowdown / Max Operating / Memory Max
# Operating Temp: 92 / 89 / 85 / 95); Volta and Blackwell are the same order of values, not verified.
THRESHOLDS: dict[str, dict[int, int]] = {
    "blackwell": {0: 92, 1: 89, 2: 95, 3: 87},
    "hopper": {0: 92, 1: 89, 2: 95, 3: 85},
    "ampere": {0: 92, 1: 89, 2: 95, 3: 85},
    "volta": {0: 90, 1: 87, 2: 85, 3: 83},
}
# banks of the row remapper (nvidia-smi "Bank Remap Availability Histogram": A100 640, H100 2560)
_BANKS = {"blackwell": 2560, "hopper": 2560, "ampere": 640, "volta": 0}

# (function, argument test) -> NOT_SUPPORTED, per architecture. The argument test gets the call's
# arguments after the handle. Sources: NVML API reference (per-function "For ... or newer" notes),
# DCGM/Datadog on Hopper NVLink counters (NVIDIA/DCGM#173, DataDog/datadog-agent#55966), NVLink5
# error telemetry as field values (DCGM NvmlFieldRequiresNvLinkAggregate, dcgm-exporter#581).
ARCH_ERRORS: dict[str, list[tuple[str, Any]]] = {
    "volta": [("nvmlDeviceGetRemappedRows", None), ("nvmlDeviceGetSramEccErrorStatus", None),
              ("nvmlDeviceGetRowRemapperHistogram", None),
              ("nvmlDeviceGetMemoryErrorCounter", lambda a: a[2] == _SRAM),
              ("nvmlDeviceGetNvLinkErrorCounter", lambda a: a[1] == _ECC_DATA),
              ("field", lambda a: a[0] in _FI_NVL5)],
    "ampere": [("nvmlDeviceGetRetiredPages", None), ("nvmlDeviceGetRetiredPagesPendingStatus", None),
               ("nvmlDeviceGetNvLinkErrorCounter", lambda a: a[1] == _ECC_DATA),
               ("field", lambda a: a[0] in _FI_NVL5)],
    "hopper": [("nvmlDeviceGetRetiredPages", None), ("nvmlDeviceGetRetiredPagesPendingStatus", None),
               ("nvmlDeviceGetNvLinkErrorCounter", lambda a: a[1] == _CRC_DATA),
               ("field", lambda a: a[0] in _FI_NVL5)],
    "blackwell": [("nvmlDeviceGetRetiredPages", None), ("nvmlDeviceGetRetiredPagesPendingStatus", None),
                  ("nvmlDeviceGetNvLinkErrorCounter", lambda a: a[1] in (_CRC_DATA, _CRC_FLIT, _ECC_DATA))],
}
# under MIG (per-device handle): NVML documents these as not supported
_MIG_ERRORS: list[tuple[str, Any]] = [
    ("nvmlDeviceGetMemoryErrorCounter", lambda a: a[1] == _VOLATILE),
    ("nvmlDeviceGetRemappedRows", None), ("nvmlDeviceGetUtilizationRates", None),
    ("nvmlDeviceGetRowRemapperHistogram", None),
]


_TABLES: dict[tuple[str, bool], dict[str, list[Any]]] = {}
for _arch, _rows in ARCH_ERRORS.items():
    for _mig in (False, True):
        _t: dict[str, list[Any]] = {}
        for _fn, _test in _rows + (_MIG_ERRORS if _mig else []):
            _t.setdefault(_fn, []).append(_test)
        _TABLES[(_arch, _mig)] = _t


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # pynvml maps the code to its subclass (NVMLError_GpuIsLost, ...)


@dataclass
class SimGpu:
    serial: int
    uuid: str
    bus_id: str
    name: str
    arch: str
    gen_max: int
    links: int
    remapping: bool
    ecc: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (type, counter, location)
    sram_threshold: bool = False
    sram_parity: bool = False  # uncorrectable SRAM errors counted as parity (else SEC-DED)
    sram_unit: dict[str, int] = field(default_factory=dict)  # "L2"/"Sm"/"Pcie"/"Mcu"/"Other" -> count
    ecc_mode: list[int] = field(default_factory=lambda: [1, 1])  # current, pending (ENABLED = 1)
    banks: list[int] = field(default_factory=lambda: [0, 0, 0, 0, 0])  # max, high, partial, low, none
    mem_temp: float = 40.0
    remap: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    retired_sbe: list[int] = field(default_factory=list)
    retired_dbe: list[int] = field(default_factory=list)
    retired_pending: int = 0
    gen_cur: int = 0
    gen_trained: int = 0  # what the link trains to under load (below gen_max after a downtrain)
    width_cur: int = 16
    width_max: int = 16
    replays: int = 0  # the true count; NVML shows it modulo 2**32
    link_up: list[int] = field(default_factory=list)
    link_err: dict[tuple[int, int], int] = field(default_factory=dict)
    nvl5: dict[tuple[int, int], int] = field(default_factory=dict)  # (field id, link) -> count
    temp: float = 45.0
    power_mw: int = 250_000
    util: int = 80
    reasons: int = 0
    lost: str = ""  # "", "lost" (GPU_IS_LOST) or "unknown" (the handle answers UNKNOWN)
    enumerated: bool = True
    mig: bool = False
    hang_until: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)  # function -> error code (injected)
    handle_buf: Any = None
    handle: Any = None


@dataclass
class SimPciInfo:
    busId: bytes
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
                 driver: str = "550.54.15", idle_downclock: bool = True) -> None:
        name, _arch_id, gen_max, links, remapping = _ARCH[arch]
        self.arch = arch
        self.driver = driver
        self.idle_downclock = idle_downclock
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._events: list[tuple[int, int, int, int, int]] = []  # (serial, event type, data, gi, ci)
        self._event_sets: dict[int, set[int]] = {}  # set address -> registered device serials
        self._set_bufs: dict[int, Any] = {}
        self._inited = 0
        self._uninitialized = False  # after driver_reload(), until nvmlInit
        self._init_error: int | None = None
        self._wait_error: int | None = None
        self._hang_all_until = 0.0
        self.calls = 0
        buses = [(0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)[i % 8] + i // 8 for i in range(n_gpus)]  # as host.py
        self.gpus: list[SimGpu] = []
        self._by_addr: dict[int, SimGpu] = {}
        self._by_id: dict[int, SimGpu] = {}  # fast path: the handle objects this sim handed out
        for i in range(n_gpus):
            h = self._rng.getrandbits(64)
            uuid = f"GPU-{h >> 32:08x}-{(h >> 16) & 0xFFFF:04x}-{h & 0xFFFF:04x}-{seed & 0xFFFF:04x}-{i:012x}"
            bus = buses[i] & 0xFF
            g = SimGpu(serial=i, uuid=uuid, bus_id=f"00000000:{bus:02X}:00.0", name=name, arch=arch,
                       gen_max=gen_max, gen_cur=gen_max, gen_trained=gen_max, links=links, remapping=remapping,
                       link_up=[1] * links, temp=40.0 + self._rng.random() * 10)
            g.banks[0] = _BANKS[arch]
            g.mem_temp = g.temp + 5
            g.handle_buf = ctypes.c_uint64(i)  # a real c_nvmlDevice_t pointing at memory this object owns
            g.handle = ctypes.cast(ctypes.pointer(g.handle_buf), pynvml.c_nvmlDevice_t)
            self._by_addr[ctypes.addressof(g.handle_buf)] = g
            self._by_id[id(g.handle)] = g
            self.gpus.append(g)

    # ------------------------------------------------------------------ module-like surface

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {n for n in dir(pynvml) if n.startswith(_PASSTHROUGH)})

    def __getattr__(self, name: str) -> Any:
        if name.startswith(_PASSTHROUGH):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _enter(self) -> None:
        """Every call: count it, block while the driver is wedged, refuse while uninitialised."""
        self.calls += 1
        wait = self._hang_all_until - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if not self._inited or self._uninitialized:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)

    def _lookup(self, handle: Any) -> SimGpu:
        g = self._by_id.get(id(handle))
        if g is not None and g.handle is handle:
            return g
        try:
            addr = ctypes.cast(handle, ctypes.c_void_p).value
        except (ctypes.ArgumentError, TypeError):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None
        g = self._by_addr.get(addr or 0)
        if g is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g

    def _gpu(self, handle: Any, fn: str, *args: Any) -> SimGpu:
        self._enter()
        g = self._lookup(handle)
        wait = g.hang_until - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if g.lost or not g.enumerated:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in g.errors:
            raise _err(g.errors[fn])
        if self._unsupported(g, fn, args):
            raise _err(_NS)
        return g

    @staticmethod
    def _unsupported(g: SimGpu, fn: str, args: tuple[Any, ...]) -> bool:
        tests = _TABLES[(g.arch, g.mig)].get(fn)
        return tests is not None and any(t is None or t(args) for t in tests)

    def _visible(self) -> list[SimGpu]:
        return [g for g in self.gpus if g.enumerated]

    # ------------------------------------------------------------------ init, enumeration

    def nvmlInit(self) -> None:
        wait = self._hang_all_until - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if self._init_error is not None:
            raise _err(self._init_error)
        self._inited += 1  # NVML reference-counts init/shutdown
        self._uninitialized = False

    nvmlInit_v2 = nvmlInit

    def nvmlShutdown(self) -> None:
        if not self._inited:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        self._inited -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter()
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._enter()
        return len(self._visible())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter()
        vis = self._visible()
        if not 0 <= index < len(vis):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        g = vis[index]
        wait = g.hang_until - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if g.lost == "unknown":  # "Unable to determine the device handle for GPU ...: Unknown Error"
            raise _err(pynvml.NVML_ERROR_UNKNOWN)
        if g.lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return g.handle

    def nvmlDeviceGetUUID(self, h: Any) -> bytes:
        return self._gpu(h, "nvmlDeviceGetUUID").uuid.encode()

    def nvmlDeviceGetName(self, h: Any) -> bytes:
        return self._gpu(h, "nvmlDeviceGetName").name.encode()

    def nvmlDeviceGetPciInfo(self, h: Any) -> SimPciInfo:
        g = self._gpu(h, "nvmlDeviceGetPciInfo")
        return SimPciInfo(busId=g.bus_id.encode(), bus=int(g.bus_id.split(":")[1], 16))

    def nvmlDeviceGetArchitecture(self, h: Any) -> int:
        return _ARCH[self._gpu(h, "nvmlDeviceGetArchitecture").arch][1]

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        g = self._gpu(h, "nvmlDeviceGetMigMode")
        if not g.remapping:
            raise _err(_NS)  # MIG is Ampere+
        m = pynvml.NVML_DEVICE_MIG_ENABLE if g.mig else pynvml.NVML_DEVICE_MIG_DISABLE
        return [m, m]

    # ------------------------------------------------------------------ memory

    def nvmlDeviceGetMemoryErrorCounter(self, h: Any, error_type: int, counter_type: int, location: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetMemoryErrorCounter", error_type, counter_type, location)
        if location not in (_DRAM, _SRAM):
            raise _err(_NS)  # L1/L2/register-file/texture: the pre-Turing split
        return g.ecc.get((error_type, counter_type, location), 0)

    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter_type: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetTotalEccErrors", error_type, counter_type)
        if g.mig and counter_type == _VOLATILE:
            raise _err(_NS)
        return sum(v for (t, c, _loc), v in g.ecc.items() if t == error_type and c == counter_type)

    def nvmlDeviceGetSramEccErrorStatus(self, h: Any, status: Any) -> int:
        """The C API takes ``nvmlEccSramErrorStatus_t *``; pynvml passes the argument through, so the
        caller must give ``byref(status)``. A Structure given as is travels by value: the driver reads
        an unrelated pointer and answers ARGUMENT_VERSION_MISMATCH, the struct stays untouched."""
        g = self._gpu(h, "nvmlDeviceGetSramEccErrorStatus")
        st = getattr(status, "_obj", None)  # what ctypes.byref() points at
        if st is None and isinstance(status, ctypes._Pointer):
            st = status.contents
        if not isinstance(st, pynvml.c_nvmlEccSramErrorStatus_v1_t) or st.version != pynvml.nvmlEccSramErrorStatus_v1:
            raise _err(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        unc = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        kind = "Parity" if g.sram_parity else "SecDed"
        setattr(st, f"aggregateUnc{kind}", g.ecc.get((unc, _AGGREGATE, _SRAM), 0))
        setattr(st, f"volatileUnc{kind}", g.ecc.get((unc, _VOLATILE, _SRAM), 0))
        st.aggregateCor = g.ecc.get((pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, _AGGREGATE, _SRAM), 0)
        st.volatileCor = g.ecc.get((pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, _VOLATILE, _SRAM), 0)
        for unit, n in g.sram_unit.items():
            setattr(st, f"aggregateUncBucket{unit}", n)
        st.bThresholdExceeded = int(g.sram_threshold)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        g = self._gpu(h, "nvmlDeviceGetRemappedRows")
        if not g.remapping:
            raise _err(_NS)
        return (g.remap[0], g.remap[1], g.remap[2], g.remap[3])

    def nvmlDeviceGetRowRemapperHistogram(self, h: Any) -> Any:
        g = self._gpu(h, "nvmlDeviceGetRowRemapperHistogram")
        v = pynvml.c_nvmlRowRemapperHistogramValues()
        v.max, v.high, v.partial, v.low, v.none = g.banks
        return v

    def nvmlDeviceGetBrand(self, h: Any) -> int:
        g = self._gpu(h, "nvmlDeviceGetBrand")
        return pynvml.NVML_BRAND_TESLA if g.arch == "volta" else pynvml.NVML_BRAND_NVIDIA  # as nvidia-smi shows them

    def nvmlDeviceGetEccMode(self, h: Any) -> list[int]:
        return list(self._gpu(h, "nvmlDeviceGetEccMode").ecc_mode)

    def nvmlDeviceGetRetiredPages(self, h: Any, cause: int) -> list[int]:
        g = self._gpu(h, "nvmlDeviceGetRetiredPages")
        dbe = cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        return list(g.retired_dbe if dbe else g.retired_sbe)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending

    # ------------------------------------------------------------------ PCIe, NVLink, field values

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkGeneration").gen_cur

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkGeneration").gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkWidth").width_cur

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkWidth").width_max

    def nvmlDeviceGetPcieReplayCounter(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetPcieReplayCounter").replays & 0xFFFFFFFF  # c_uint: wraps

    def nvmlDeviceGetNvLinkState(self, h: Any, link: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetNvLinkState", link)
        if not 0 <= link < g.links:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if g.link_up[link] < 0:
            raise _err(_NS)
        return g.link_up[link]

    def nvmlDeviceGetNvLinkErrorCounter(self, h: Any, link: int, counter: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetNvLinkErrorCounter", link, counter)
        if not 0 <= link < g.links:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g.link_err.get((link, counter), 0)

    def nvmlDeviceGetFieldValues(self, h: Any, field_ids: list[Any]) -> Any:
        """Like pynvml: ids or (id, scopeId) pairs in, a ``c_nvmlFieldValue_t`` array out; each entry
        carries its own ``nvmlReturn`` (the call itself succeeds)."""
        g = self._gpu(h, "nvmlDeviceGetFieldValues")
        arr = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
            v = arr[i]
            v.fieldId, v.scopeId, v.timestamp = fid, scope, int(time.time() * 1e6)
            v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            if self._unsupported(g, "field", (fid, scope)):
                v.nvmlReturn = _NS
            elif fid == _FI_REPLAY:
                v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                v.value.uiVal = g.replays & 0xFFFFFFFF
            elif fid == _FI_ROLLOVER:
                v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                v.value.uiVal = g.replays >> 32
            elif fid == _FI_MEM_TEMP:
                v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                v.value.uiVal = int(g.mem_temp)
            elif fid in _FI_NVL5 and 0 <= scope < g.links:
                v.value.ullVal = g.nvl5.get((fid, scope), 0)
            else:
                v.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
        return arr

    # ------------------------------------------------------------------ gauges

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return int(self._gpu(h, "nvmlDeviceGetTemperature").temp)

    def nvmlDeviceGetTemperatureV(self, h: Any, sensor: int, version: int = pynvml.nvmlTemperature_v1) -> int:
        if version != pynvml.nvmlTemperature_v1:
            raise _err(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return int(self._gpu(h, "nvmlDeviceGetTemperatureV").temp)

    def nvmlDeviceGetTemperatureThreshold(self, h: Any, threshold: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetTemperatureThreshold", threshold)
        t = THRESHOLDS[g.arch].get(threshold)
        if t is None:
            raise _err(_NS)  # acoustic / GPS thresholds: not on these boards
        return t

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> SimUtil:
        g = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        return SimUtil(gpu=g.util, memory=g.util // 2)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons").reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksThrottleReasons").reasons

    # ------------------------------------------------------------------ events

    def nvmlEventSetCreate(self) -> Any:
        self._enter()
        buf = ctypes.c_uint64(0)
        with self._lock:
            addr = ctypes.addressof(buf)
            self._set_bufs[addr] = buf
            self._event_sets[addr] = set()
        return ctypes.cast(ctypes.pointer(buf), pynvml.c_nvmlEventSet_t)

    def _set_addr(self, event_set: Any) -> int:
        try:
            return int(ctypes.cast(event_set, ctypes.c_void_p).value or 0)
        except (ctypes.ArgumentError, TypeError):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None

    def nvmlEventSetFree(self, event_set: Any) -> None:
        addr = self._set_addr(event_set)
        with self._lock:
            if self._event_sets.pop(addr, None) is None:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._set_bufs.pop(addr, None)

    def nvmlDeviceGetSupportedEventTypes(self, h: Any) -> int:
        self._gpu(h, "nvmlDeviceGetSupportedEventTypes")
        return int(pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeSingleBitEccError
                   | pynvml.nvmlEventTypeDoubleBitEccError)

    def nvmlDeviceRegisterEvents(self, h: Any, event_types: int, event_set: Any) -> None:
        g = self._gpu(h, "nvmlDeviceRegisterEvents")
        addr = self._set_addr(event_set)
        with self._lock:
            if addr not in self._event_sets:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if event_types & ~self.nvmlDeviceGetSupportedEventTypes(h):
                raise _err(_NS)  # asking for a type the GPU does not support fails the whole call
            if event_types & pynvml.nvmlEventTypeXidCriticalError:
                self._event_sets[addr].add(g.serial)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self._enter()
        addr = self._set_addr(event_set)
        with self._lock:
            regs = self._event_sets.get(addr)
            if regs is None:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if self._wait_error is not None:
                raise _err(self._wait_error)
            for i, (serial, etype, data, gi, ci) in enumerate(self._events):
                if serial in regs:
                    del self._events[i]
                    ev = pynvml.c_nvmlEventData_t()
                    ev.device = self.gpus[serial].handle
                    ev.eventType, ev.eventData = etype, data
                    ev.gpuInstanceId, ev.computeInstanceId = gi, ci
                    return ev
        if timeout_ms:
            time.sleep(min(timeout_ms, 50) / 1000)
        raise _err(pynvml.NVML_ERROR_TIMEOUT)

    nvmlEventSetWait = nvmlEventSetWait_v2

    def registered(self) -> dict[int, set[int]]:
        """Event sets alive -> GPU serials registered on each (for tests)."""
        with self._lock:
            return {k: set(v) for k, v in self._event_sets.items()}

    # ------------------------------------------------------------------ driver behaviours

    def field_error(self, gpu: int, function: str, code: int | None) -> None:
        """``function`` answers ``code`` on GPU ``gpu`` (None clears it)."""
        if code is None:
            self.gpus[gpu].errors.pop(function, None)
        else:
            self.gpus[gpu].errors[function] = code

    def not_supported(self, gpu: int, *functions: str) -> None:
        for fn in functions:
            self.field_error(gpu, fn, _NS)

    def mig(self, gpu: int, on: bool = True) -> None:
        self.gpus[gpu].mig = on

    def hang(self, gpu: int, seconds: float) -> None:
        self.gpus[gpu].hang_until = time.monotonic() + seconds

    def hang_all(self, seconds: float) -> None:
        self._hang_all_until = time.monotonic() + seconds

    def event_wait_error(self, code: int | None) -> None:
        self._wait_error = code

    def init_error(self, code: int | None) -> None:
        self._init_error = code

    def driver_reload(self) -> None:
        """The driver module was reloaded under a running client: every call answers UNINITIALIZED
        until nvmlInit; event sets are gone; volatile counters restart; lost GPUs drop out."""
        self._uninitialized = True
        self._inited = 0
        with self._lock:
            self._event_sets.clear()
            self._set_bufs.clear()
        for g in self.gpus:
            if g.lost:
                g.enumerated = False
        self.reset_counters()

    # ------------------------------------------------------------------ faults

    def _queue_xid(self, gpu: int, xid: int, gi: int = 0xFFFFFFFF, ci: int = 0xFFFFFFFF) -> None:
        with self._lock:
            self._events.append((gpu, int(pynvml.nvmlEventTypeXidCriticalError), xid, gi, ci))

    def _bump_ecc(self, gpu: int, err_type: int, loc: int, n: int) -> None:
        g = self.gpus[gpu]
        for counter in (_VOLATILE, _AGGREGATE):
            key = (err_type, counter, loc)
            g.ecc[key] = g.ecc.get(key, 0) + n

    def xid(self, gpu: int, xid: int, *, gi: int | None = None, ci: int | None = None) -> None:
        """An Xid event; ``gi``/``ci``: the MIG GPU / compute instance it belongs to (GPU-wide:
        0xFFFFFFFF, what the driver puts there outside MIG)."""
        self._queue_xid(gpu, xid, 0xFFFFFFFF if gi is None else gi, 0xFFFFFFFF if ci is None else ci)

    def ecc_mode(self, gpu: int, current: bool, pending: bool | None = None) -> None:
        """ECC on/off now, and after the next reset (``nvidia-smi -e 0`` sets pending only)."""
        self.gpus[gpu].ecc_mode = [int(current), int(current if pending is None else pending)]

    def remap_banks(self, gpu: int, *, high: int = 0, partial: int = 0, low: int = 0, none: int = 0) -> None:
        """Banks that used up some (high, partial), most (low) or all (none) of their spare rows."""
        g = self.gpus[gpu]
        total = _BANKS[g.arch]
        g.banks = [max(0, total - high - partial - low - none), high, partial, low, none]

    def hbm_temperature(self, gpu: int, temp_c: float) -> None:
        self.gpus[gpu].mem_temp = temp_c

    def fall_off_bus(self, gpu: int, how: str = "lost") -> None:
        """Xid 79; then every call answers GPU_IS_LOST (``how="lost"``) or the handle UNKNOWN."""
        self._queue_xid(gpu, 79)
        self.lose(gpu, how)

    def lose(self, gpu: int, how: str = "lost") -> None:
        """Every call answers GPU_IS_LOST (``how="lost"``) or the handle UNKNOWN; no Xid."""
        self.gpus[gpu].lost = how

    def ecc_errors(self, gpu: int, n: int, *, location: str = "dram", corrected: bool = True) -> None:
        """``n`` ECC errors on the volatile and aggregate counters only (no Xid, no remap)."""
        kind = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED if corrected else pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        self._bump_ecc(gpu, kind, _DRAM if location == "dram" else _SRAM, n)

    def remap_rows(self, gpu: int, *, pending: bool | None = None, failure: bool | None = None) -> None:
        """Set the remapped-rows pending / failure flags (a pending remap also counts one row)."""
        g = self.gpus[gpu]
        if pending is not None:
            g.remap[2] = int(pending)
            g.remap[1] += int(pending)
        if failure is not None:
            g.remap[3] = int(failure)

    def vanish(self, gpu: int) -> None:
        self.gpus[gpu].enumerated = False

    def dram_uce(self, gpu: int, n: int = 1, *, contained: bool = True) -> None:
        g = self.gpus[gpu]
        self._bump_ecc(gpu, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, _DRAM, n)
        if g.remapping:
            g.remap[1] += n
            g.remap[2] = 1
            self._queue_xid(gpu, 94 if contained else 95)
        else:
            g.retired_dbe.extend(self._rng.getrandbits(36) for _ in range(n))
            g.retired_pending = 1
            self._queue_xid(gpu, 48)

    def sram_uce(self, gpu: int, n: int = 1, *, threshold: bool = False, contained: bool = True,
                 unit: str = "Other", parity: bool = False) -> None:
        """``unit``: the SRAM bucket that reported it (L2, Sm, Pcie, Mcu, Other); ``parity``: a parity
        error rather than a SEC-DED one."""
        self._bump_ecc(gpu, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, _SRAM, n)
        g = self.gpus[gpu]
        g.sram_threshold = g.sram_threshold or threshold
        g.sram_parity = parity
        g.sram_unit[unit] = g.sram_unit.get(unit, 0) + n
        self._queue_xid(gpu, 94 if contained else 95)

    def corrected(self, gpu: int, n: int = 1, location: str = "dram") -> None:
        loc = _DRAM if location == "dram" else _SRAM
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
            g.gen_cur = g.gen_trained = gen
        if width is not None:
            g.width_cur = width

    def pcie_replays(self, gpu: int, n: int = 100) -> None:
        self.gpus[gpu].replays += n

    def nvlink_errors(self, gpu: int, link: int, *, crc_flit: int = 0, crc_data: int = 0, replay: int = 0,
                      recovery: int = 0) -> None:
        """Link errors as this architecture counts them: data-path errors are CRC_DATA before
        Hopper, ECC_DATA on Hopper, and NVLink5 field counters (symbol / effective errors,
        recovery events) on Blackwell."""
        g = self.gpus[gpu]
        if g.arch == "blackwell":
            for fid, n in zip(_FI_NVL5, (crc_flit + crc_data, crc_data, recovery), strict=True):
                g.nvl5[(fid, link)] = g.nvl5.get((fid, link), 0) + n
        data_counter = _ECC_DATA if g.arch == "hopper" else _CRC_DATA
        for counter, n in ((_CRC_FLIT, crc_flit), (data_counter, crc_data), (_REPLAY, replay),
                           (_RECOVERY, recovery)):
            g.link_err[(link, counter)] = g.link_err.get((link, counter), 0) + n

    def nvlink_down(self, gpu: int, link: int) -> None:
        self.gpus[gpu].link_up[link] = 0
        self._queue_xid(gpu, 74)

    def link_unsupported(self, gpu: int, *links: int) -> None:
        """These link indices answer NOT_SUPPORTED (links need not be contiguous from 0)."""
        for link in links:
            self.gpus[gpu].link_up[link] = -1

    def no_nvlink_bridge(self, gpu: int) -> None:
        """A PCIe board without NVLink bridges: every link reads inactive from the start, no Xid."""
        g = self.gpus[gpu]
        g.link_up = [0] * g.links

    def thermal(self, gpu: int, temp_c: float = 92.0, *, hw: bool = True) -> None:
        g = self.gpus[gpu]
        g.temp = temp_c
        g.reasons |= _REASON_SW_THERMAL | ((_REASON_HW_THERMAL | _REASON_HW) if hw else 0)

    def reset_counters(self) -> None:
        """Driver reload: volatile ECC counters, PCIe replays and NVLink counters restart at 0."""
        with self._lock:
            self._events.clear()
        for g in self.gpus:
            for key in list(g.ecc):
                if key[1] == _VOLATILE:
                    g.ecc[key] = 0
            g.replays = 0
            g.link_err.clear()
            g.nvl5.clear()
            g.remap[2] = 0
            g.reasons = 0
            if g.enumerated:
                g.lost = ""

    def tick(self) -> None:
        """Healthy background motion between polls: temperature, power, utilisation; an idle GPU's
        link drops to gen 1 (power saving, not a fault) when ``idle_downclock`` is on."""
        for g in self.gpus:
            if g.reasons & (_REASON_HW_THERMAL | _REASON_SW_THERMAL):
                continue
            g.temp = min(85.0, max(30.0, g.temp + self._rng.uniform(-1.0, 1.0)))
            g.mem_temp = min(85.0, max(30.0, g.temp + 5.0))
            g.power_mw = int(min(700_000, max(60_000, g.power_mw + self._rng.uniform(-20_000, 20_000))))
            g.util = self._rng.randint(0, 100)
            g.reasons = _REASON_IDLE if g.util < 5 else 0
            g.gen_cur = 1 if (self.idle_downclock and g.util < 5) else g.gen_trained

    def idle(self, gpu: int) -> None:
        """GPU ``gpu`` goes idle now (utilisation 0; link at gen 1 with ``idle_downclock``)."""
        g = self.gpus[gpu]
        g.util, g.reasons = 0, _REASON_IDLE
        if self.idle_downclock:
            g.gen_cur = 1
