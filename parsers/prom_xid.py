"""The one place dcgm-exporter's Xid series become Xid events (pure; the caller saves the state).

``DCGM_FI_DEV_XID_ERRORS`` is not a counter: it holds the **last** Xid the GPU reported and keeps
it until the next one; it goes back to 0 only when the exporter / host engine restarts
(dcgm-exporter#190, #500). :class:`XidGaugeTracker` remembers the last value per GPU and reads it so:

* a change to a non-zero value N is one new Xid N event, stamped with the scrape's time (the error
  happened between the previous scrape and this one);
* the same value again is **not** a new event: the gauge cannot tell "no new Xid" from "Xid N
  again". A repeat of the same Xid between two scrapes is therefore invisible from this series —
  only the window count (below), the kernel log or NVML's event set can see it;
* a change to 0 is a restart of the exporter, not an event; a later N (even the old value) is new;
* the first scrape of a GPU with no saved state that already shows N != 0 yields one event whose
  message says the time is unknown (the Xid happened some time before that scrape). Saving the
  state (:meth:`to_json` / :meth:`from_json`) keeps a collector restart from raising it again.

``DCGM_FI_DEV_XID_ERRORS_ACTIVE{xid="N"}`` (the exporter's ``--xid-count-window-size``) is Xid N's
count in a sliding window: a rise of k is k events (at most :data:`MAX_PER_READ`); a fall is Xids
ageing out. One Xid ageing out while another of the same number arrives between two scrapes
leaves the count unchanged and is missed. When a GPU has window series, they are the source and the
last-value gauge only updates its state (no double counting of one Xid seen through both).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fleethealth.schema import XidEvent
from parsers.prom_map import Parts, XidReading, gpu_key

MAX_PER_READ = 16  # events one window-count rise may yield
MAX_GPUS = 4096  # tracked GPU keys (per tracker); the least recently seen go first


class XidGaugeTracker:
    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._window: dict[str, dict[int, int]] = {}
        self._seen: dict[str, float] = {}
        self.events = 0  # events emitted (a figure for logs and tests)

    def observe(self, gpu: str, readings: Iterable[XidReading], ts: float) -> list[XidEvent]:
        """The new Xid events one scrape's readings for one GPU imply."""
        rs = list(readings)
        if not rs:
            return []
        out: list[XidEvent] = []
        windowed = [r for r in rs if r.mode == "window"]
        uses_window = bool(windowed) or gpu in self._window  # an empty window is a count of 0
        for r in rs:
            if r.mode != "last":
                continue
            prev = self._last.get(gpu)
            self._last[gpu] = r.xid
            if uses_window or r.xid == 0 or r.xid == prev:
                continue
            if prev is None:
                msg = (f"DCGM_FI_DEV_XID_ERRORS already {r.xid} at the first scrape of this GPU: Xid {r.xid} "
                       "happened before it (time unknown)")
            else:
                msg = f"DCGM_FI_DEV_XID_ERRORS changed {prev} -> {r.xid} since the previous scrape (last-Xid gauge)"
            out.append(XidEvent(xid=r.xid, ts=ts, message=msg))
        if uses_window:
            old = self._window.get(gpu, {})
            new = {r.xid: r.count for r in windowed}
            for xid, n in sorted(new.items()):
                rise = n - old.get(xid, 0)
                for _ in range(min(max(rise, 0), MAX_PER_READ)):
                    out.append(XidEvent(xid=xid, ts=ts, message=(
                        f"DCGM_FI_DEV_XID_ERRORS_ACTIVE xid={xid} rose {old.get(xid, 0)} -> {n} in the exporter's "
                        "window")))
            self._window[gpu] = {x: n for x, n in new.items() if n > 0}  # {} = known, all quiet
        self._touch(gpu, ts)
        self.events += len(out)
        return out

    def apply(self, parts: Parts, ts: float) -> int:
        """Attach the events of one scrape to its GPUs (``gpus[].xids``); return how many."""
        by_gpu: dict[str, list[XidReading]] = {}
        for r in parts.xids:
            by_gpu.setdefault(r.gpu, []).append(r)
        n = 0
        for g in parts.gpus:
            evs = self.observe(gpu_key(g), by_gpu.get(gpu_key(g), ()), ts)
            if evs:
                g.xids = [*g.xids, *evs][-4096:]
                n += len(evs)
        return n

    def _touch(self, gpu: str, ts: float) -> None:
        self._seen.pop(gpu, None)
        self._seen[gpu] = ts
        while len(self._seen) > MAX_GPUS:
            old = next(iter(self._seen))
            self._seen.pop(old)
            self._last.pop(old, None)
            self._window.pop(old, None)

    # ------------------------------------------------------------------ state

    def to_json(self) -> dict[str, Any]:
        gpus: dict[str, Any] = {}
        for k, ts in self._seen.items():
            w = self._window.get(k)
            gpus[k] = {"last": self._last.get(k), "ts": ts,
                       "window": None if w is None else {str(x): n for x, n in w.items()}}
        return {"v": 1, "gpus": gpus}

    @classmethod
    def from_json(cls, obj: Any) -> XidGaugeTracker:
        """State saved by :meth:`to_json`; anything malformed starts empty (never raises)."""
        t = cls()
        try:
            if not isinstance(obj, dict) or obj.get("v") != 1:
                return t
            for k, d in obj["gpus"].items():
                if d.get("last") is not None:
                    t._last[str(k)] = int(d["last"])
                if d.get("window") is not None:
                    t._window[str(k)] = {int(x): int(n) for x, n in d["window"].items()}
                t._seen[str(k)] = float(d.get("ts") or 0.0)
        except (AttributeError, KeyError, TypeError, ValueError):
            return cls()
        return t
