"""The NVML source: per-GPU health counters through ``pynvml`` (nvidia-ml-py).

``NvmlSource(nvml)`` takes the NVML module as an argument: the real ``pynvml`` on a GPU host, or a
:class:`simulator.nvml.SimNvml` in tests and ``--simulate``. Both raise pynvml's own
exception classes, so the handling below is the same code path for both.

Errors are facts, not crashes: ``NVMLError_NotSupported`` (and NoPermission, FunctionNotFound)
leaves a field ``None``; ``NVMLError_GpuIsLost`` marks the GPU ``present=False,
nvml_error="GPU_IS_LOST"``. Every GPU is read in its own worker thread under a deadline
(``call_timeout``): a GPU whose read does not return in time is reported ``nvml_error="TIMEOUT"``
while the others are read normally. A worker that is still stuck at the next poll is not
duplicated: that GPU is reported ``TIMEOUT`` again without a new call, so hung calls never pile up
(at most one outstanding thread per GPU, plus one for the event set).
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fleethealth.schema import (
    EccCounters,
    GpuSample,
    NvlinkCounters,
    PcieLink,
    RemappedRows,
    RetiredPages,
    XidEvent,
)
from parsers.kernel_log import normalise_pci

log = logging.getLogger(__name__)
MAX_LINKS = 32  # schema bound; NVML_NVLINK_MAX_LINKS is 18 (Hopper) .. 36 in newer headers


@dataclass
class NvmlPoll:
    gpus: list[GpuSample]
    driver_version: str = ""
    errors: list[str] = field(default_factory=list)  # source-level problems (init failed, event set)
    device_count: int | None = None


class _Worker:
    """One call handed to a lane; ``done`` is set when it returns."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self._fn = fn

    def run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the poller
            self.error = exc
        finally:
            self.done.set()


class _Lanes:
    """One long-lived daemon thread per GPU (and one for the event set): starting a thread per GPU
    per poll cost a third of the poll. A lane whose call hangs stays busy; the poller skips it
    (``NvmlSource._pending``) until the call returns, so threads never pile up."""

    def __init__(self) -> None:
        self._queues: dict[Any, queue.SimpleQueue[_Worker]] = {}

    def submit(self, key: Any, fn: Callable[[], Any]) -> _Worker:
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
        self.max_links = min(max_links, MAX_LINKS)
        self._pending: dict[Any, _Worker] = {}  # gpu index (or "events") -> stuck worker
        self._lanes = _Lanes()
        self._known: dict[str, tuple[int, str, str]] = {}  # uuid -> (index, pci, name) seen before
        self._events: Any = None
        self._registered: set[int] = set()
        self._handle_index: dict[int, int] = {}
        self._inited = False
        self._err_names = {
            getattr(nvml, n): n[len("NVML_ERROR_"):] for n in dir(nvml) if n.startswith("NVML_ERROR_")
        }
        self.timeouts = 0
        self.stuck_skips = 0

    # ------------------------------------------------------------------ helpers

    def err_name(self, exc: BaseException) -> str:
        value = getattr(exc, "value", None)
        return self._err_names.get(value, type(exc).__name__)

    def _opt(self, fn_name: str, *args: Any) -> Any:
        """Call an NVML function; unsupported -> None. GPU_IS_LOST propagates."""
        nv = self.nvml
        fn = getattr(nv, fn_name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except nv.NVMLError_GpuIsLost:
            raise
        except nv.NVMLError:
            return None

    def _init(self) -> None:
        if not self._inited:
            self.nvml.nvmlInit()
            self._inited = True
            try:
                self._events = self.nvml.nvmlEventSetCreate()
            except self.nvml.NVMLError as exc:
                log.warning("NVML event set unavailable: %s", exc)
                self._events = None

    # ------------------------------------------------------------------ poll

    def poll(self) -> NvmlPoll:
        nv = self.nvml
        out = NvmlPoll(gpus=[])
        try:
            self._init()
            out.driver_version = _text(self._opt("nvmlSystemGetDriverVersion") or "")
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            out.errors.append(f"NVML unusable: {self.err_name(exc)}: {exc}")
            self._inited = False
            return out
        out.device_count = count
        deadline = time.monotonic() + self.call_timeout
        workers: dict[int, _Worker | None] = {}
        for i in range(count):
            stuck = self._pending.get(i)
            if stuck is not None and not stuck.done.is_set():
                workers[i] = None  # still hung from an earlier poll: do not call again
                self.stuck_skips += 1
                continue
            self._pending.pop(i, None)
            workers[i] = self._lanes.submit(i, partial(self._read_gpu, i))
        for i, w in workers.items():
            if w is None:
                out.gpus.append(self._timed_out(i))
                continue
            w.done.wait(max(0.0, deadline - time.monotonic()))
            if not w.done.is_set():
                self.timeouts += 1
                self._pending[i] = w
                out.gpus.append(self._timed_out(i))
            elif w.error is not None:
                out.gpus.append(self._failed(i, w.error))
            else:
                out.gpus.append(w.result)
        # after the GPU reads: they register each device for Xid events and map its handle, so an
        # event set drained in parallel could miss a GPU's first events (and did, now and then)
        self._attach_events(self._start_events(), out, deadline)
        self._add_missing(out)
        return out

    def _timed_out(self, i: int) -> GpuSample:
        uuid, pci, name = next(((u, p, n) for u, (ix, p, n) in self._known.items() if ix == i), ("", "", ""))
        return GpuSample(index=i, uuid=uuid, pci_bus_id=pci, name=name, present=True, nvml_error="TIMEOUT")

    def _failed(self, i: int, exc: BaseException) -> GpuSample:
        nv = self.nvml
        g = self._timed_out(i)
        if isinstance(exc, nv.NVMLError):
            g.nvml_error = self.err_name(exc)
            g.present = not isinstance(exc, nv.NVMLError_GpuIsLost)
        else:
            g.nvml_error = f"{type(exc).__name__}: {exc}"[:256]
        return g

    def _add_missing(self, out: NvmlPoll) -> None:
        """GPUs seen before that no longer enumerate (fell off the bus, then a driver reload)."""
        seen = {g.uuid for g in out.gpus if g.uuid}
        next_index = max((g.index for g in out.gpus), default=-1) + 1
        for uuid, (_ix, pci, name) in sorted(self._known.items(), key=lambda kv: kv[1][0]):
            if uuid not in seen:
                out.gpus.append(GpuSample(index=next_index, uuid=uuid, pci_bus_id=pci, name=name,
                                          present=False, nvml_error="NOT_ENUMERATED"))
                next_index += 1

    # ------------------------------------------------------------------ one GPU

    def _read_gpu(self, i: int) -> GpuSample:
        nv = self.nvml
        h = nv.nvmlDeviceGetHandleByIndex(i)
        uuid = _text(nv.nvmlDeviceGetUUID(h))
        pci_info = nv.nvmlDeviceGetPciInfo(h)
        pci = normalise_pci(_text(getattr(pci_info, "busId", "")))
        name = _text(self._opt("nvmlDeviceGetName", h) or "")
        self._known[uuid] = (i, pci, name)
        self._handle_index[_hkey(h)] = i
        self._register(h)
        g = GpuSample(index=i, uuid=uuid, pci_bus_id=pci, name=name)
        g.ecc = self._ecc(h)
        rr = self._opt("nvmlDeviceGetRemappedRows", h)
        if rr is not None:
            g.remapped_rows = RemappedRows(correctable=rr[0], uncorrectable=rr[1], pending=bool(rr[2]),
                                           failure=bool(rr[3]))
        else:
            g.retired_pages = self._retired(h)
        g.pcie = PcieLink(
            gen_current=self._opt("nvmlDeviceGetCurrPcieLinkGeneration", h),
            gen_max=self._opt("nvmlDeviceGetMaxPcieLinkGeneration", h),
            width_current=self._opt("nvmlDeviceGetCurrPcieLinkWidth", h),
            width_max=self._opt("nvmlDeviceGetMaxPcieLinkWidth", h),
            replay_counter=self._opt("nvmlDeviceGetPcieReplayCounter", h),
        )
        g.nvlink = self._nvlink(h)
        t = self._opt("nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU)
        g.temperature_c = float(t) if t is not None else None
        p = self._opt("nvmlDeviceGetPowerUsage", h)
        g.power_w = p / 1000.0 if p is not None else None
        u = self._opt("nvmlDeviceGetUtilizationRates", h)
        g.utilization_pct = float(u.gpu) if u is not None else None
        reasons = self._opt("nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:
            reasons = self._opt("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        g.clocks_event_reasons = reasons
        return g

    def _ecc(self, h: Any) -> EccCounters | None:
        nv = self.nvml
        e = EccCounters()
        locs = {"dram": (nv.NVML_MEMORY_LOCATION_DRAM, nv.NVML_MEMORY_LOCATION_DEVICE_MEMORY),
                "sram": (nv.NVML_MEMORY_LOCATION_SRAM,)}
        types = {"corrected": nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                 "uncorrected": nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED}
        scopes = {"volatile": nv.NVML_VOLATILE_ECC, "aggregate": nv.NVML_AGGREGATE_ECC}
        any_value = False
        for loc, loc_ids in locs.items():
            for tname, t in types.items():
                for sname, s in scopes.items():
                    v = None
                    for loc_id in loc_ids:  # DRAM on Ampere+, DEVICE_MEMORY before
                        v = self._opt("nvmlDeviceGetMemoryErrorCounter", h, t, s, loc_id)
                        if v is not None:
                            break
                    if v is not None:
                        any_value = True
                        setattr(e, f"{loc}_{tname}_{sname}", int(v))
        if not any_value:  # no per-location counters: the totals are the best we have
            for tname, t in types.items():
                for sname, s in scopes.items():
                    v = self._opt("nvmlDeviceGetTotalEccErrors", h, t, s)
                    if v is not None:
                        any_value = True
                        setattr(e, f"dram_{tname}_{sname}", int(v))
        status_cls = getattr(nv, "c_nvmlEccSramErrorStatus_v1_t", None)
        if status_cls is not None:
            st = status_cls()
            st.version = getattr(nv, "nvmlEccSramErrorStatus_v1", 0)
            if self._opt("nvmlDeviceGetSramEccErrorStatus", h, st) is not None:
                e.sram_threshold_exceeded = bool(st.bThresholdExceeded)
        return e if any_value or e.sram_threshold_exceeded is not None else None

    def _retired(self, h: Any) -> RetiredPages | None:
        nv = self.nvml
        sbe = self._opt("nvmlDeviceGetRetiredPages", h, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        dbe = self._opt("nvmlDeviceGetRetiredPages", h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pend = self._opt("nvmlDeviceGetRetiredPagesPendingStatus", h)
        if sbe is None and dbe is None and pend is None:
            return None
        return RetiredPages(sbe=len(sbe) if sbe is not None else None, dbe=len(dbe) if dbe is not None else None,
                            pending=bool(pend) if pend is not None else None)

    def _nvlink(self, h: Any) -> NvlinkCounters | None:
        nv = self.nvml
        c = NvlinkCounters(active=[], crc_flit=[], crc_data=[], replay=[], recovery=[])
        kinds = (("crc_flit", nv.NVML_NVLINK_ERROR_DL_CRC_FLIT), ("crc_data", nv.NVML_NVLINK_ERROR_DL_CRC_DATA),
                 ("replay", nv.NVML_NVLINK_ERROR_DL_REPLAY), ("recovery", nv.NVML_NVLINK_ERROR_DL_RECOVERY))
        for link in range(self.max_links):
            try:
                state = nv.nvmlDeviceGetNvLinkState(h, link)
            except nv.NVMLError_GpuIsLost:
                raise
            except (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument):
                break  # no such link (or no NVLink at all)
            except nv.NVMLError:
                state = None
            c.active.append(bool(state) if state is not None else None)
            for attr, k in kinds:
                getattr(c, attr).append(self._opt("nvmlDeviceGetNvLinkErrorCounter", h, link, k))
        return c if c.active else None

    # ------------------------------------------------------------------ Xid events

    def _register(self, h: Any) -> None:
        key = _hkey(h)
        if self._events is None or key in self._registered:
            return
        nv = self.nvml
        try:
            nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._events)
        except nv.NVMLError_GpuIsLost:
            raise
        except nv.NVMLError as exc:
            log.info("Xid events not available for a GPU: %s", exc)
        self._registered.add(key)

    def _start_events(self) -> _Worker | None:
        if self._events is None:
            return None
        stuck = self._pending.get("events")
        if stuck is not None and not stuck.done.is_set():
            return None
        self._pending.pop("events", None)
        return self._lanes.submit("events", self._drain_events)

    def _drain_events(self) -> list[tuple[int, int]]:
        nv = self.nvml
        got: list[tuple[int, int]] = []
        for _ in range(4096):
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError_Timeout:
                break
            except nv.NVMLError_GpuIsLost:
                continue
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                got.append((self._handle_index.get(_hkey(data.device), -1), int(data.eventData)))
        return got

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
        now = self.clock()
        by_index = {g.index: g for g in out.gpus}
        for idx, xid in w.result:
            g = by_index.get(idx)
            if g is not None and len(g.xids) < 4096:
                g.xids.append(XidEvent(xid=min(xid, 1_000_000), ts=now, message="NVML Xid critical error event"))

    def close(self) -> None:
        nv = self.nvml
        if self._events is not None:
            try:
                nv.nvmlEventSetFree(self._events)
            except nv.NVMLError:
                pass
        if self._inited:
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass
            self._inited = False
