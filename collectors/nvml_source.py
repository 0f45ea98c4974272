"""The NVML source: per-GPU health counters through ``pynvml`` (nvidia-ml-py).

``NvmlSource(nvml)`` takes the NVML module as an argument: the real ``pynvml`` on a GPU host, or the
simulated NVML (:class:`simulator.nvml.SimNvml`) in tests and ``--simulate``. Both raise pynvml's own exception classes and take the
same arguments (ctypes structs by reference where the C API wants a pointer), so the handling below
is the same code path for both.

Errors are classified, never guessed (``docs/telemetry.md``, "NVML errors"):

* ``NotSupported``, ``FunctionNotFound``, ``NoPermission`` (and ``VgpuEccNotSupported``) mean *absent*:
  the field is ``None``;
* ``GPU_IS_LOST`` -- and ``UNKNOWN`` / ``GPU_NOT_FOUND`` / ``RESET_REQUIRED`` from the calls that
  identify a GPU (handle, UUID, PCI info), the way a GPU that fell off the bus answers -- mark it
  ``present=False`` with ``nvml_error`` naming the code;
* any other error from a field read (``UNKNOWN``, ``CORRUPTED_INFOROM``, ...) leaves the field ``None``
  *and* is recorded in ``GpuSample.field_errors`` (field group -> code), so "unknown" never reads
  as "absent" and rules can raise an incident on it;
* ``UNINITIALIZED`` anywhere (a driver reload) tears the NVML session down: the event set is freed,
  ``nvmlShutdown`` balances ``nvmlInit``, registrations are forgotten and the *generation* goes up;
  the next poll initialises again and registers every GPU on the new event set.

Deadlines: init + device count + event-set setup run on their own lane under ``call_timeout``
(a driver wedged in its lock must not stop the collector: the sysfs and kernel-log sources still
report, with ``nvml: unresponsive`` as a source error). Every GPU is read on its own lane under the
same deadline; a GPU whose read does not return in time is ``nvml_error="TIMEOUT"``; a lane still
stuck at the next poll is not called again (threads never pile up). Identity (index -> UUID) comes
from *this* poll's enumeration only: a GPU whose identity could not be read this poll has an empty
UUID rather than a guessed one, and while any GPU is unidentified the GPUs that did not show up are
reported ``NOT_IDENTIFIED`` (unknown) instead of ``NOT_ENUMERATED`` (gone).

Releasing NVML (``release()`` / ``resume()``): ``nvidia-smi -r`` refuses while any client holds the
GPU. The daemon calls ``release()`` while a pause file exists (``--nvml-pause-file``), which frees the
event set and shuts NVML down; polls then carry no GPU data and say so.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleethealth.schema import (
    EccCounters,
    GpuSample,
    GpuThermal,
    NvlinkCounters,
    PcieLink,
    RemappedRows,
    RetiredPages,
    XidEvent,
)
from parsers.kernel_log import normalise_pci

log = logging.getLogger(__name__)
MAX_LINKS = 32  # schema bound; NVML_NVLINK_MAX_LINKS is 36 in newer headers, 18 links on H100/H200/B200

ABSENT = ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "NO_PERMISSION", "VGPU_ECC_NOT_SUPPORTED")
LOST_ON_IDENTITY = ("GPU_IS_LOST", "UNKNOWN", "GPU_NOT_FOUND", "RESET_REQUIRED")
_FI_PCIE_REPLAY, _FI_PCIE_ROLLOVER = 94, 95
_FI_MEMORY_TEMP = 82  # NVML_FI_DEV_MEMORY_TEMP: memory (HBM) temperature, degrees C
# nvmlTemperatureThresholds_t: SHUTDOWN 0, SLOWDOWN 1, MEM_MAX 2, GPU_MAX 3 (nvml.h)
_THRESHOLDS = (("shutdown_c", 0), ("slowdown_c", 1), ("mem_max_c", 2), ("gpu_max_c", 3))
# nvmlEccSramErrorStatus_v1_t members -> EccCounters fields (docs.nvidia.com/deploy/nvml-api,
# structnvmlEccSramErrorStatus__v1__t: uncorrectable SRAM errors by kind -- parity or SEC-DED --
# volatile and aggregate, and the aggregate ones by the unit that reported them)
_SRAM_STATUS = (("volatileUncParity", "sram_uncorrected_parity_volatile"),
                ("volatileUncSecDed", "sram_uncorrected_secded_volatile"),
                ("aggregateUncParity", "sram_uncorrected_parity_aggregate"),
                ("aggregateUncSecDed", "sram_uncorrected_secded_aggregate"),
                ("aggregateUncBucketL2", "sram_uncorrected_l2_aggregate"),
                ("aggregateUncBucketSm", "sram_uncorrected_sm_aggregate"),
                ("aggregateUncBucketPcie", "sram_uncorrected_pcie_aggregate"),
                ("aggregateUncBucketMcu", "sram_uncorrected_mcu_aggregate"),
                ("aggregateUncBucketOther", "sram_uncorrected_other_aggregate"))
_NO_INSTANCE = 0xFFFFFFFF  # nvmlEventData: not a MIG instance's event
# nvmlBrandType_t -> the name nvidia-smi -q prints as "Product Brand"
BRANDS = {1: "Quadro", 2: "Tesla", 3: "NVS", 4: "GRID", 5: "GeForce", 6: "Titan", 7: "NVIDIA Virtual Applications",
          8: "NVIDIA Virtual PC", 9: "NVIDIA Virtual Compute Server", 10: "NVIDIA RTX Virtual Workstation",
          11: "NVIDIA Cloud Gaming", 12: "Quadro RTX", 13: "NVIDIA RTX", 14: "NVIDIA", 15: "GeForce RTX",
          16: "Titan RTX"}
_FI_NVL5 = (("symbol_errors", 221), ("effective_errors", 219), ("recovery_events", 215))
_ARCH_AMPERE, _ARCH_HOPPER, _ARCH_BLACKWELL = 7, 9, 10


class _Lost(Exception):
    """A GPU answered as one that is gone (GPU_IS_LOST): stop reading it."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class _Reinit(Exception):
    """NVML answered UNINITIALIZED: the driver was reloaded under us."""


@dataclass
class NvmlPoll:
    gpus: list[GpuSample]
    driver_version: str = ""
    errors: list[str] = field(default_factory=list)  # source-level problems (init failed, event set)
    device_count: int | None = None
    released: bool = False  # NVML deliberately released (GPU reset in progress)


class _Worker:
    """One call handed to a lane; ``done`` is set when it returns."""

    def __init__(self, fn: Callable[[_Worker], Any]) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.ident: tuple[str, str, str] | None = None  # (uuid, pci, name), set by the lane as soon as read
        self._fn = fn

    def run(self) -> None:
        try:
            self.result = self._fn(self)
        except BaseException as exc:  # noqa: BLE001 - handed back to the poller
            self.error = exc
        finally:
            self.done.set()


class _Lanes:
    """One long-lived daemon thread per key (GPU index, "events", "init"): starting a thread per GPU
    per poll cost a third of the poll. A lane whose call hangs stays busy; the poller skips it
    (``NvmlSource._pending``) until the call returns, so threads never pile up."""

    def __init__(self) -> None:
        self._queues: dict[Any, queue.SimpleQueue[_Worker]] = {}

    def submit(self, key: Any, fn: Callable[[_Worker], Any]) -> _Worker:
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(q,), daemon=True, name=f"nvml-{key}").start()
        w = _Worker(fn)
        q.put(w)
        return w

    @staticmethod
    def _serve(q: queue.SimpleQueue[_Worker]) -> None:
        while True:
            q.get().run()


def _hkey(handle: Any) -> int:
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
    except (ctypes.ArgumentError, TypeError):
        pass
    try:
        return int(ctypes.addressof(handle.contents))
    except (AttributeError, TypeError, ValueError):
        return id(handle)


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class NvmlSource:
    name = "nvml"

    def __init__(
        self,
        nvml: Any,
        *,
        expected_gpus: int = 0,
        call_timeout: float = 2.0,
        clock: Callable[[], float] = time.time,
        max_links: int = 18,
    ) -> None:
        self.nvml = nvml
        self.expected_gpus = expected_gpus
        self.call_timeout = call_timeout
        self.clock = clock
        self.max_links = min(max_links, MAX_LINKS, int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", MAX_LINKS)))
        self._pending: dict[Any, _Worker] = {}  # gpu index / "events" / "init" -> still-stuck worker
        self._lanes = _Lanes()
        self._known: dict[str, tuple[str, str]] = {}  # uuid -> (pci, name), every GPU seen this session
        self._events: Any = None
        self._event_error: str | None = None
        self._registered: set[tuple[int, int]] = set()  # (generation, handle key)
        self._handle_uuid: dict[int, str] = {}  # handle key -> uuid (this generation)
        self._links_seen_up: dict[str, set[int]] = {}  # uuid -> links seen active since start
        self._limits: dict[str, dict[str, float | None]] = {}  # uuid -> temperature thresholds
        self._lock = threading.Lock()
        self._inited = False
        self._released = False
        self.generation = 0  # bumps on every teardown: registrations and handles of an older one are void
        self._err_names = {
            getattr(nvml, n): n[len("NVML_ERROR_"):] for n in dir(nvml) if n.startswith("NVML_ERROR_")
        }
        self._absent = {getattr(nvml, f"NVML_ERROR_{n}", None) for n in ABSENT} - {None}
        self._last_count: int | None = None
        self._last_ident: dict[int, str] = {}  # index -> uuid of the last fully identified poll
        self.timeouts = 0
        self.stuck_skips = 0
        self.reinits = 0

    # ------------------------------------------------------------------ helpers

    def err_name(self, exc: BaseException) -> str:
        value = getattr(exc, "value", None)
        return self._err_names.get(value, type(exc).__name__)

    def _call(self, errors: dict[str, str], group: str, fn_name: str, *args: Any) -> Any:
        """One field read: absent -> None; lost -> raise _Lost; UNINITIALIZED -> raise _Reinit;
        any other NVML error -> None and ``errors[group] = CODE``."""
        nv = self.nvml
        fn = getattr(nv, fn_name, None)
        if fn is None:
            return None  # this binding has no such function: the same as FunctionNotFound
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in self._absent:
                return None
            name = self.err_name(exc)
            if name == "GPU_IS_LOST":
                raise _Lost(name) from exc
            if name == "UNINITIALIZED":
                raise _Reinit() from exc
            errors.setdefault(group, name)
            return None

    # ------------------------------------------------------------------ lifecycle

    def _setup(self, _w: _Worker) -> tuple[str, int]:
        """Init (if needed), driver version, device count, event set: run on the "init" lane."""
        nv = self.nvml
        if not self._inited:
            nv.nvmlInit()
            self._inited = True
        if self._events is None and self._event_error is None:
            try:
                self._events = nv.nvmlEventSetCreate()
            except nv.NVMLError as exc:
                self._event_error = f"NVML event set unavailable: {self.err_name(exc)}"
                log.warning("NVML event set unavailable: %s", exc)
        try:
            driver = _text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError:
            driver = ""
        return driver, int(nv.nvmlDeviceGetCount())

    def _teardown(self) -> None:
        """Free the event set, balance nvmlInit, forget registrations; a new generation begins."""
        nv = self.nvml
        with self._lock:
            events, self._events, self._event_error = self._events, None, None
            self._registered.clear()
            self._handle_uuid.clear()
            self.generation += 1
        if events is not None:
            try:
                nv.nvmlEventSetFree(events)
            except nv.NVMLError:
                pass
        if self._inited:
            self._inited = False
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass

    def release(self) -> bool:
        """Let go of NVML (event set freed, nvmlShutdown) so ``nvidia-smi -r`` / a driver reload can
        proceed. Returns True once nothing of NVML is held (no call stuck in the driver either)."""
        if not self._released:
            log.info("releasing NVML (GPU reset requested)")
            self._released = True
            self._teardown()
        return not any(not w.done.is_set() for w in self._pending.values())

    def resume(self) -> None:
        if self._released:
            log.info("resuming NVML after a GPU reset")
            self._released = False

    # ------------------------------------------------------------------ poll

    def poll(self) -> NvmlPoll:
        out = NvmlPoll(gpus=[])
        if self._released:
            out.released = True
            out.errors.append("NVML released for a GPU reset (pause file present); no GPU data")
            return out
        setup = self._run_guarded("init", self._setup)
        if setup is None:
            out.errors.append(f"NVML unresponsive: init/device count did not return within {self.call_timeout:g}s")
            return out
        if setup.error is not None:
            exc = setup.error
            out.errors.append(f"NVML unusable: {self.err_name(exc)}: {exc}")
            self._teardown()
            return out
        out.driver_version, count = setup.result
        if self._event_error:
            out.errors.append(self._event_error)
        out.device_count = count
        deadline = time.monotonic() + self.call_timeout
        workers: dict[int, _Worker] = {}
        stuck: dict[int, _Worker] = {}
        for i in range(count):
            old = self._pending.get(i)
            if old is not None and not old.done.is_set():
                stuck[i] = old  # still hung from an earlier poll: do not call again
                self.stuck_skips += 1
                continue
            self._pending.pop(i, None)
            workers[i] = self._lanes.submit(i, functools.partial(self._read_gpu, index=i, gen=self.generation))
        reinit = False
        for i in range(count):
            if i in stuck:
                out.gpus.append(self._timed_out(i, stuck[i].ident))
                continue
            w = workers[i]
            w.done.wait(max(0.0, deadline - time.monotonic()))
            if not w.done.is_set():
                self.timeouts += 1
                self._pending[i] = w
                out.gpus.append(self._timed_out(i, w.ident))
            elif isinstance(w.error, _Reinit) or (
                    isinstance(w.error, self.nvml.NVMLError) and self.err_name(w.error) == "UNINITIALIZED"):
                reinit = True
                out.gpus.append(self._timed_out(i, w.ident, "UNINITIALIZED"))
            elif w.error is not None:
                out.gpus.append(self._failed(i, w))
            else:
                out.gpus.append(w.result)
        identified = self._identify_stable(out, count)
        # after the GPU reads: they register each device for Xid events and map its handle, so an
        # event set drained in parallel could miss a GPU's first events (and did, now and then)
        self._attach_events(self._start_events(), out, deadline)
        self._add_missing(out, identified)
        if reinit:
            out.errors.append("NVML answered UNINITIALIZED (driver reloaded?): re-initialising next poll")
            self.reinits += 1
            self._teardown()
        return out

    def _identify_stable(self, out: NvmlPoll, count: int) -> bool:
        """Name the GPUs whose identity could not be read this poll -- only where that is sound:
        the device count is the one of the last poll and that poll identified every index (NVML
        orders GPUs by PCI address, so with an unchanged count index i is the same board). After a
        count change indices may have shifted: the UUID stays empty rather than name the wrong
        board. Returns whether every GPU of this poll now has an identity."""
        seen = {g.uuid for g in out.gpus if g.uuid}
        stable = count == self._last_count and len(self._last_ident) == count
        complete = True
        for g in out.gpus:
            if g.uuid:
                continue
            uuid = self._last_ident.get(g.index) if stable else None
            if uuid is not None and uuid not in seen:
                pci, name = self._known.get(uuid, ("", ""))
                g.uuid, g.pci_bus_id, g.name = uuid, pci, name
                seen.add(uuid)
            else:
                complete = False
        self._last_count = count
        self._last_ident = {g.index: g.uuid for g in out.gpus if g.uuid} if complete else {}
        return complete

    def _run_guarded(self, key: str, fn: Callable[[_Worker], Any]) -> _Worker | None:
        """Run ``fn`` on lane ``key`` under the deadline; None if it (or an earlier call) is stuck."""
        old = self._pending.get(key)
        if old is not None:
            if not old.done.is_set():
                return None
            del self._pending[key]
        w = self._lanes.submit(key, fn)
        if not w.done.wait(self.call_timeout):
            self._pending[key] = w
            return None
        return w

    def _timed_out(self, i: int, ident: tuple[str, str, str] | None, error: str = "TIMEOUT") -> GpuSample:
        uuid, pci, name = ident or ("", "", "")
        return GpuSample(index=i, uuid=uuid, pci_bus_id=pci, name=name, present=True, nvml_error=error)

    def _failed(self, i: int, w: _Worker) -> GpuSample:
        nv = self.nvml
        exc = w.error
        g = self._timed_out(i, w.ident)
        if isinstance(exc, _Lost):
            g.nvml_error, g.present = exc.code, False
        elif isinstance(exc, nv.NVMLError):  # from an identity call: lost-like codes mean not answering
            g.nvml_error = self.err_name(exc)
            g.present = g.nvml_error not in LOST_ON_IDENTITY
        else:
            g.nvml_error = f"{type(exc).__name__}: {exc}"[:256]
        return g

    def _add_missing(self, out: NvmlPoll, identified: bool) -> None:
        """GPUs seen before that did not show up in this poll's enumeration. Gone for sure
        (``NOT_ENUMERATED``, present=False) only when every GPU of this poll was identified;
        otherwise one of them may be the unidentified one: ``NOT_IDENTIFIED`` (not claimed lost)."""
        seen = {g.uuid for g in out.gpus if g.uuid}
        next_index = max((g.index for g in out.gpus), default=-1) + 1
        for uuid, (pci, name) in sorted(self._known.items()):
            if uuid not in seen:
                out.gpus.append(GpuSample(index=next_index, uuid=uuid, pci_bus_id=pci, name=name,
                                          present=not identified,
                                          nvml_error="NOT_ENUMERATED" if identified else "NOT_IDENTIFIED"))
                next_index += 1

    # ------------------------------------------------------------------ one GPU

    def _read_gpu(self, w: _Worker, index: int, gen: int) -> GpuSample:
        nv = self.nvml
        i = index
        h = nv.nvmlDeviceGetHandleByIndex(i)  # NVMLError here: identity failed (see _failed)
        uuid = _text(nv.nvmlDeviceGetUUID(h))
        pci_info = nv.nvmlDeviceGetPciInfo(h)
        pci = normalise_pci(_text(getattr(pci_info, "busId", "")))
        errors: dict[str, str] = {}
        try:
            name = _text(self._call(errors, "name", "nvmlDeviceGetName", h) or "")
            w.ident = (uuid, pci, name)
            with self._lock:
                self._known[uuid] = (pci, name)
                if gen == self.generation:
                    self._handle_uuid[_hkey(h)] = uuid
            g = GpuSample(index=i, uuid=uuid, pci_bus_id=pci, name=name)
            self._register(h, gen, errors)
            self._fill(g, h, errors)
        except _Lost as exc:
            w.ident = w.ident or (uuid, pci, "")
            raise exc
        g.field_errors = dict(sorted(errors.items())[:64])
        return g

    def _fill(self, g: GpuSample, h: Any, errors: dict[str, str]) -> None:
        nv = self.nvml
        arch = self._call(errors, "architecture", "nvmlDeviceGetArchitecture", h)
        mig = self._call(errors, "mig", "nvmlDeviceGetMigMode", h)
        if mig is not None:
            g.mig_enabled = bool(mig[0] == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1))
        g.ecc = self._ecc(h, errors)
        rr = self._call(errors, "remapped_rows", "nvmlDeviceGetRemappedRows", h)
        if rr is not None:
            g.remapped_rows = RemappedRows(correctable=rr[0], uncorrectable=rr[1], pending=bool(rr[2]),
                                           failure=bool(rr[3]))
            hist = self._call(errors, "remapper_histogram", "nvmlDeviceGetRowRemapperHistogram", h)
            if hist is not None:
                g.remapped_rows.hist_max, g.remapped_rows.hist_high = int(hist.max), int(hist.high)
                g.remapped_rows.hist_partial, g.remapped_rows.hist_low = int(hist.partial), int(hist.low)
                g.remapped_rows.hist_none = int(hist.none)
        elif arch is None or arch < _ARCH_AMPERE:
            # page retirement is the pre-Ampere mechanism; on Ampere+ (MIG, or a failed read) it is not
            # a fallback: the remap read failing is recorded, not papered over
            g.retired_pages = self._retired(h, errors)
        g.pcie = self._pcie(h, errors)
        g.nvlink = self._nvlink(h, g.uuid, arch, errors)
        t = self._temperature(h, errors)
        g.temperature_c = float(t) if t is not None else None
        g.thermal = self._thermal(h, g.uuid, errors)
        brand = self._call(errors, "brand", "nvmlDeviceGetBrand", h)
        g.brand = BRANDS.get(int(brand)) if brand is not None else None
        mode = self._call(errors, "ecc_mode", "nvmlDeviceGetEccMode", h)
        if mode is not None:
            on = getattr(nv, "NVML_FEATURE_ENABLED", 1)
            g.ecc_mode_current, g.ecc_mode_pending = mode[0] == on, mode[1] == on
        p = self._call(errors, "power", "nvmlDeviceGetPowerUsage", h)
        g.power_w = p / 1000.0 if p is not None else None
        u = self._call(errors, "utilization", "nvmlDeviceGetUtilizationRates", h)
        g.utilization_pct = float(u.gpu) if u is not None else None
        reasons = self._call(errors, "clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:
            reasons = self._call(errors, "clocks_event_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        g.clocks_event_reasons = reasons

    def _temperature(self, h: Any, errors: dict[str, str]) -> Any:
        """``nvmlDeviceGetTemperatureV`` where the driver has it; ``nvmlDeviceGetTemperature`` (deprecated,
        to be removed in CUDA 14) where it answers FunctionNotFound / NotSupported. A binding with
        neither function is the collector's problem, not the device's: recorded, never "absent"."""
        nv = self.nvml
        sensor = nv.NVML_TEMPERATURE_GPU
        has_v = getattr(nv, "nvmlDeviceGetTemperatureV", None) is not None
        if has_v:
            scratch: dict[str, str] = {}
            t = self._call(scratch, "temperature", "nvmlDeviceGetTemperatureV", h, sensor)
            if t is not None or scratch:
                errors.update({k: v for k, v in scratch.items() if k not in errors})
                return t
        if getattr(nv, "nvmlDeviceGetTemperature", None) is None:
            if not has_v:
                errors.setdefault("temperature", "BINDING_HAS_NO_TEMPERATURE_CALL")
            return None
        return self._call(errors, "temperature", "nvmlDeviceGetTemperature", h, sensor)

    def _thermal(self, h: Any, uuid: str, errors: dict[str, str]) -> GpuThermal | None:
        """The driver's thresholds for this board (read once per board and session: they are
        fixed by its VBIOS) and the memory temperature (field value 82), every poll."""
        limits = self._limits.get(uuid)
        if limits is None:
            scratch: dict[str, str] = {}
            limits = {}
            for attr, kind in _THRESHOLDS:
                v = self._call(scratch, "thresholds", "nvmlDeviceGetTemperatureThreshold", h, kind)
                # 0 is what some boards answer for a limit they do not have: not a limit of 0 C
                limits[attr] = float(v) if v else None
            errors.update({k: v for k, v in scratch.items() if k not in errors})
            if not scratch:  # a failed read is asked again next poll
                self._limits[uuid] = limits
        th = GpuThermal(**limits)
        (mem,) = self._fields(h, errors, "memory_temperature", [_FI_MEMORY_TEMP])
        th.memory_c = float(mem) if mem else None
        return th if any(getattr(th, f) is not None for f in th.__struct_fields__) else None

    def _ecc(self, h: Any, errors: dict[str, str]) -> EccCounters | None:
        nv = self.nvml
        e = EccCounters()
        locs = {"dram": nv.NVML_MEMORY_LOCATION_DRAM, "sram": nv.NVML_MEMORY_LOCATION_SRAM}
        types = {"corrected": nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                 "uncorrected": nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED}
        scopes = {"volatile": nv.NVML_VOLATILE_ECC, "aggregate": nv.NVML_AGGREGATE_ECC}
        any_value = False
        for loc, loc_id in locs.items():
            for tname, t in types.items():
                for sname, s in scopes.items():
                    v = self._call(errors, "ecc", "nvmlDeviceGetMemoryErrorCounter", h, t, s, loc_id)
                    if v is not None:
                        any_value = True
                        setattr(e, f"{loc}_{tname}_{sname}", int(v))
        if not any_value:  # no per-location counters: the totals, in their own fields
            for tname, t in types.items():
                for sname, s in scopes.items():
                    v = self._call(errors, "ecc", "nvmlDeviceGetTotalEccErrors", h, t, s)
                    if v is not None:
                        any_value = True
                        setattr(e, f"total_{tname}_{sname}", int(v))
        status_cls = getattr(nv, "c_nvmlEccSramErrorStatus_v1_t", None)
        if status_cls is not None:
            st = status_cls()
            st.version = getattr(nv, "nvmlEccSramErrorStatus_v1", 0)
            # the C API takes a pointer and pynvml adds no byref: a Structure passed as is goes by value
            if self._call(errors, "sram_status", "nvmlDeviceGetSramEccErrorStatus", h, ctypes.byref(st)) is not None:
                e.sram_threshold_exceeded = bool(st.bThresholdExceeded)
                for member, attr in _SRAM_STATUS:
                    setattr(e, attr, int(getattr(st, member)))
        return e if any_value or e.sram_threshold_exceeded is not None else None

    def _retired(self, h: Any, errors: dict[str, str]) -> RetiredPages | None:
        nv = self.nvml
        sbe = self._call(errors, "retired_pages", "nvmlDeviceGetRetiredPages", h,
                         nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        dbe = self._call(errors, "retired_pages", "nvmlDeviceGetRetiredPages", h,
                         nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pend = self._call(errors, "retired_pages", "nvmlDeviceGetRetiredPagesPendingStatus", h)
        if sbe is None and dbe is None and pend is None:
            return None
        return RetiredPages(sbe=len(sbe) if sbe is not None else None, dbe=len(dbe) if dbe is not None else None,
                            pending=bool(pend) if pend is not None else None)

    def _fields(self, h: Any, errors: dict[str, str], group: str, ids: list[Any]) -> list[int | None]:
        """nvmlDeviceGetFieldValues: one value per id (None where that field's nvmlReturn failed)."""
        vals = self._call(errors, group, "nvmlDeviceGetFieldValues", h, ids)
        if vals is None:
            return [None] * len(ids)
        out: list[int | None] = []
        for v in vals:
            if int(v.nvmlReturn) != 0:
                if int(v.nvmlReturn) not in self._absent:
                    errors.setdefault(group, self._err_names.get(int(v.nvmlReturn), str(int(v.nvmlReturn))))
                out.append(None)
                continue
            vt = int(v.valueType)
            x = v.value
            raw = {0: x.dVal, 1: x.uiVal, 2: x.ulVal, 3: x.ullVal, 4: x.sllVal, 5: x.siVal, 6: x.usVal}.get(vt, x.ullVal)
            out.append(max(0, int(raw)))
        return out

    def _pcie(self, h: Any, errors: dict[str, str]) -> PcieLink:
        replay, rollover = self._fields(h, errors, "pcie", [_FI_PCIE_REPLAY, _FI_PCIE_ROLLOVER])
        if replay is None:  # the 32-bit counter; the rollover field says how often it wrapped
            replay = self._call(errors, "pcie", "nvmlDeviceGetPcieReplayCounter", h)
        return PcieLink(
            gen_current=self._call(errors, "pcie", "nvmlDeviceGetCurrPcieLinkGeneration", h),
            gen_max=self._call(errors, "pcie", "nvmlDeviceGetMaxPcieLinkGeneration", h),
            width_current=self._call(errors, "pcie", "nvmlDeviceGetCurrPcieLinkWidth", h),
            width_max=self._call(errors, "pcie", "nvmlDeviceGetMaxPcieLinkWidth", h),
            replay_counter=replay, replay_rollover=rollover,
        )

    def _nvlink(self, h: Any, uuid: str, arch: int | None, errors: dict[str, str]) -> NvlinkCounters | None:
        """Every link index is asked (unsupported ones are skipped, not the end of the list). A link
        never seen active since the collector started is reported ``active=None`` (not wired: a
        bridgeless PCIe board, a VM, a reduced bandwidth mode), so only a link that *was* up and went
        down reads as ``False``."""
        nv = self.nvml
        kinds = [("crc_flit", nv.NVML_NVLINK_ERROR_DL_CRC_FLIT), ("replay", nv.NVML_NVLINK_ERROR_DL_REPLAY),
                 ("recovery", nv.NVML_NVLINK_ERROR_DL_RECOVERY)]
        # the data-path counter: CRC_DATA before Hopper, ECC_DATA from Hopper on (CRC_DATA answers
        # NotSupported there); both when the architecture is unknown
        if arch is None or arch < _ARCH_HOPPER:
            kinds.append(("crc_data", nv.NVML_NVLINK_ERROR_DL_CRC_DATA))
        if arch is None or arch >= _ARCH_HOPPER:
            kinds.append(("ecc_data", getattr(nv, "NVML_NVLINK_ERROR_DL_ECC_DATA", 4)))
        rows: list[tuple[int, bool | None, dict[str, int | None]]] = []
        seen_up = self._links_seen_up.setdefault(uuid, set())
        scratch: dict[str, str] = {}
        for link in range(self.max_links):
            try:
                state = nv.nvmlDeviceGetNvLinkState(h, link)
            except nv.NVMLError as exc:
                name = self.err_name(exc)
                if name == "GPU_IS_LOST":
                    raise _Lost(name) from exc
                if name == "UNINITIALIZED":
                    raise _Reinit() from exc
                if getattr(exc, "value", None) in self._absent or name == "INVALID_ARGUMENT":
                    continue  # no such link here: look at the next index, do not stop
                errors.setdefault("nvlink", name)
                state = None
            up = None if state is None else state == getattr(nv, "NVML_FEATURE_ENABLED", 1)
            if up:
                seen_up.add(link)
            active = up if (up or link in seen_up) else None
            vals = {attr: self._call(scratch, "nvlink", "nvmlDeviceGetNvLinkErrorCounter", h, link, k)
                    for attr, k in kinds}
            rows.append((link, active, vals))
        if not rows:
            return None
        if any(a is not None for _l, a, _v in rows):
            errors.update({k: v for k, v in scratch.items() if k not in errors})
        n = rows[-1][0] + 1
        c = NvlinkCounters(active=[None] * n, crc_flit=[None] * n, crc_data=[None] * n, replay=[None] * n,
                           recovery=[None] * n)
        for attr, _k in kinds:
            setattr(c, attr, [None] * n)
        for link, active, vals in rows:
            c.active[link] = active
            for attr, v in vals.items():
                getattr(c, attr)[link] = v
        if arch is not None and arch >= _ARCH_BLACKWELL:
            for attr, fid in _FI_NVL5:
                setattr(c, attr, self._fields(h, errors, "nvlink", [(fid, link) for link in range(n)]))
        return c

    # ------------------------------------------------------------------ Xid events

    def _register(self, h: Any, gen: int, errors: dict[str, str]) -> None:
        key = (gen, _hkey(h))
        if self._events is None or key in self._registered or gen != self.generation:
            return
        nv = self.nvml
        mask = nv.nvmlEventTypeXidCriticalError
        supported = self._call({}, "xid_events", "nvmlDeviceGetSupportedEventTypes", h)
        if supported is not None:
            extra = getattr(nv, "nvmlEventTypeGpuUnavailableError", 0) | getattr(nv, "nvmlEventTypeGpuRecoveryAction", 0)
            mask = (mask | extra) & int(supported) or mask
        try:
            nv.nvmlDeviceRegisterEvents(h, mask, self._events)
        except nv.NVMLError as exc:
            name = self.err_name(exc)
            if name == "GPU_IS_LOST":
                raise _Lost(name) from exc
            if getattr(exc, "value", None) not in self._absent:
                errors["xid_events"] = name  # retried next poll
                return
        self._registered.add(key)

    def _start_events(self) -> _Worker | None:
        if self._events is None:
            return None
        stuck = self._pending.get("events")
        if stuck is not None and not stuck.done.is_set():
            return None
        self._pending.pop("events", None)
        events = self._events
        return self._lanes.submit("events", lambda _w: self._drain_events(events))

    def _drain_events(self, events: Any) -> tuple[list[tuple[Any, int, int | None, int | None]], str | None]:
        """Non-blocking waits until TIMEOUT; any other error ends the drain (events already taken
        are kept) and is reported once, never spun on."""
        nv = self.nvml
        got: list[tuple[Any, int, int | None, int | None]] = []
        for _ in range(4096):
            try:
                data = nv.nvmlEventSetWait_v2(events, 0)
            except nv.NVMLError_Timeout:
                return got, None
            except nv.NVMLError as exc:
                return got, self.err_name(exc)
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                gi = int(getattr(data, "gpuInstanceId", _NO_INSTANCE))
                ci = int(getattr(data, "computeInstanceId", _NO_INSTANCE))
                got.append((data.device, int(data.eventData), None if gi == _NO_INSTANCE else min(gi, 1_000_000),
                            None if ci == _NO_INSTANCE else min(ci, 1_000_000)))
        return got, None

    def _event_uuid(self, device: Any) -> str | None:
        uuid = self._handle_uuid.get(_hkey(device))
        if uuid is None:
            try:
                uuid = _text(self.nvml.nvmlDeviceGetUUID(device))
            except Exception:  # noqa: BLE001 - an event whose GPU cannot be named is reported at host level
                return None
        return uuid

    def _attach_events(self, w: _Worker | None, out: NvmlPoll, deadline: float) -> None:
        if w is None:
            return
        w.done.wait(max(0.05, deadline - time.monotonic()))
        if not w.done.is_set():
            self._pending["events"] = w
            out.errors.append("NVML event-set wait did not return in time")
            return
        if w.error is not None:
            out.errors.append(f"NVML event set: {w.error}")
            return
        got, err = w.result
        if err is not None:
            out.errors.append(f"NVML event wait failed: {err} (every GPU's Xid events may be missed)")
        now = self.clock()
        by_uuid = {g.uuid: g for g in out.gpus if g.uuid}
        for device, xid, gi, ci in got:
            uuid = self._event_uuid(device)
            g = by_uuid.get(uuid) if uuid else None
            if g is None:
                out.errors.append(f"NVML Xid {xid} on a GPU that cannot be identified")
                continue
            if len(g.xids) < 4096:
                where = "" if gi is None else f" on MIG GPU instance {gi}" + ("" if ci is None else f" compute instance {ci}")
                g.xids.append(XidEvent(xid=min(xid, 1_000_000), ts=now, message=f"NVML Xid critical error event{where}",
                                       gpu_instance=gi, compute_instance=ci))

    def close(self) -> None:
        self._teardown()
