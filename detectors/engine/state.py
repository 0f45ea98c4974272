"""Per-host state: counter deltas that survive resets and wraps, event windows, flapping,
persistence, staleness and fleet baselines. Pure values in, values out; time is always the
sample's timestamp, never the wall clock, so a replay behaves exactly like live traffic.

Memory is bounded per host: windows keep only non-zero increments and merge their oldest entries
past ``MAX_WINDOW_EVENTS``; per-component maps are keyed by the finite set of components a host
reports (bounded by the schema's list limits).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleethealth.datacache import cached

U32 = 1 << 32
U64 = 1 << 64
# Values that mean "at least this many": the counter stopped counting (IB PMA counters are 8/16/32
# bit and saturate; NVML and sysfs report all-ones for "unavailable" on some devices).
SATURATED = frozenset({0xFF, 0xFFFF, U32 - 1, U64 - 1})


_COUNTERS_YAML = Path(__file__).with_name("counters.yaml")


def _read_widths() -> dict[str, int]:
    import yaml  # only when fleethealth.datacache has no parsed copy

    raw = yaml.safe_load(_COUNTERS_YAML.read_text()) or {}
    widths = raw.get("widths") or {}
    bad = [k for k, v in widths.items() if not isinstance(v, int) or not 1 <= v <= 64]
    if bad:
        raise ValueError(f"detectors/engine/counters.yaml: widths must be 1..64 bits: {bad}")
    return {str(k): int(v) for k, v in widths.items()}


WIDTHS = cached("counter-widths", [_COUNTERS_YAML, Path(__file__)], _read_widths)  # counter name -> bits


def saturation(name: str) -> frozenset[int]:
    """The values at which counter ``name`` has stopped counting."""
    bits = WIDTHS.get(name)
    return frozenset({(1 << bits) - 1}) if bits is not None else SATURATED
_WRAP_NEAR = {32: U32 - (1 << 28), 64: U64 - (1 << 60)}
MAX_WINDOW_EVENTS = 256


@dataclass(slots=True)
class CounterStep:
    """The outcome of one counter observation."""

    delta: int
    note: str = ""  # "", "baseline", "reset", "wrap", "saturated"


def counter_delta(prev: int | None, new: int | None, *, epoch_changed: bool = False,
                  saturated: frozenset[int] = SATURATED) -> CounterStep:
    """How much a raw counter advanced between two observations.

    * first sight (``prev`` is None): baseline, delta 0;
    * backwards: a reset (reboot, driver reload, GPU reset, counter clear) — new baseline and the
      new value counts as the increase since the reset; except near 2^32 / 2^64 where it is a wrap
      (never across a boot or driver change: then it is always a reset);
    * a saturated value (``saturated``: by default 255, 65535, 2^32-1, 2^64-1; a named counter's
      width from detectors/engine/counters.yaml via :func:`saturation`) counts once as "at least" and then
      stays quiet.
    """
    if new is None:
        return CounterStep(0, "missing")
    if prev is None:
        return CounterStep(0, "baseline")
    if new >= prev:
        if new == prev:
            return CounterStep(0)
        return CounterStep(new - prev, "saturated" if new in saturated else "")
    if prev in saturated:
        return CounterStep(new, "reset")  # a saturated counter does not wrap: it was cleared
    if not epoch_changed:
        for bits, near in _WRAP_NEAR.items():
            if near <= prev < (1 << bits) and new < (1 << (bits - 4)):
                return CounterStep((1 << bits) - prev + new, "wrap")
    return CounterStep(new, "reset")


class EventWindow:
    """Increments with their timestamps, summed over a trailing window (sample time)."""

    __slots__ = ("events", "total")

    def __init__(self) -> None:
        self.events: deque[tuple[float, int]] = deque()
        self.total = 0

    def add(self, ts: float, n: int) -> None:
        if n <= 0:
            return
        self.events.append((ts, n))
        self.total += n
        if len(self.events) > MAX_WINDOW_EVENTS:
            (t0, a), (_, b) = self.events.popleft(), self.events.popleft()
            self.events.appendleft((t0, a + b))  # merge the two oldest: bounded, sum kept

    def sum(self, now: float, window_s: float) -> int:
        cut = now - window_s
        ev = self.events
        while ev and ev[0][0] <= cut:
            self.total -= ev.popleft()[1]
        return self.total

    def clear(self) -> None:
        self.events.clear()
        self.total = 0


class FlapCounter:
    """State changes within a trailing window."""

    __slots__ = ("last", "changes")

    def __init__(self) -> None:
        self.last: Any = None
        self.changes: deque[float] = deque(maxlen=MAX_WINDOW_EVENTS)

    def observe(self, ts: float, value: Any, window_s: float) -> int:
        if self.last is not None and value != self.last:
            self.changes.append(ts)
        self.last = value
        cut = ts - window_s
        while self.changes and self.changes[0] <= cut:
            self.changes.popleft()
        return len(self.changes)


@dataclass(slots=True)
class HostState:
    """Everything the rules remember about one host."""

    host: str
    cluster: str = "default"
    rack: str = ""
    last_seq: int = -1
    last_ts: float = 0.0
    boot_id: str = ""
    driver: str = ""
    epoch_changed: bool = False  # this sample starts a new boot / driver epoch
    interval_s: float = 0.0  # EWMA of the poll interval
    samples: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    resets: int = 0
    seq_restarts: int = 0
    # (scope, component) -> that component's rule memory (a list of slots, see detectors.engine.ruleset)
    slots: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    pos: list[list[Any]] = field(default_factory=list)  # per scope: component memory by position
    # per scope k, at 2k and 2k+1: the sample list last evaluated, any component live then
    # (see detectors.engine.codegen)
    gates: list[Any] = field(default_factory=list)
    # the decoder's base token of the last sample evaluated (see DetectorEngine.feed), and whether the
    # one being evaluated has that base: its GPUs' fields but the gauges are that sample's objects
    base: Any = None
    same: bool = False
    gpu_mems: list[Any] | None = None  # the rule memory of each GPU position, see detectors.engine.codegen
    gpu_xid: bool = False  # and whether a GPU listed an Xid then
    snapshot: bool = False  # stateless evaluation: counters count from zero
    facts: list[Any] = field(default_factory=list)  # snapshot only: parsed facts of the capture
    notes: list[str] = field(default_factory=list)  # bounded: last few state notes

    def note(self, text: str) -> None:
        self.notes.append(text)
        if len(self.notes) > 16:
            del self.notes[:-16]


class Admission:
    """Order guard, reading a sequence number with the boot id and time: drop a redelivered sample
    (same or older seq, not newer in time), note epoch changes, and take a seq that went back with
    newer time as the collector restarting its count (a lost or torn state file, a jump to 2**64-1
    and back, a reinstall): counted in ``seq_restarts``, never a reason to drop what follows."""

    DROP_DUPLICATE = "duplicate"
    DROP_STALE = "out_of_order"
    SEQ_RESTART = "seq_restart"

    @staticmethod
    def admit(st: HostState, seq: int, ts: float, boot_id: str, driver: str) -> str:
        """Return "" to process the sample, or the reason to skip it (and count it)."""
        new_epoch = bool(st.samples) and bool((boot_id and boot_id != st.boot_id) or (driver and driver != st.driver))
        if not new_epoch and st.samples and seq <= st.last_seq:
            if ts <= st.last_ts:  # not newer than what this host already said: a redelivery
                if seq == st.last_seq:
                    st.duplicates += 1
                    return Admission.DROP_DUPLICATE
                st.out_of_order += 1
                return Admission.DROP_STALE
            st.seq_restarts += 1  # newer time, seq not past the last: the count restarted
            st.note(f"seq restart at ts={ts:.0f}: {st.last_seq} -> {seq} on the same boot")
        if st.samples and ts > st.last_ts:
            gap = ts - st.last_ts
            st.interval_s = gap if st.interval_s == 0 else 0.8 * st.interval_s + 0.2 * min(gap, 10 * st.interval_s)
        st.epoch_changed = new_epoch
        if new_epoch:
            st.resets += 1
            st.note(f"epoch change at ts={ts:.0f}: boot_id {st.boot_id!r}->{boot_id!r}, "
                    f"driver {st.driver!r}->{driver!r}; counters re-baselined")
        st.last_seq, st.last_ts = seq, max(ts, st.last_ts)
        st.boot_id, st.driver = boot_id or st.boot_id, driver or st.driver
        st.samples += 1
        return ""


class FleetBaseline:
    """Per-component rates across the hosts this worker owns (a worker sees its partitions' hosts: a
    fleet sample) and their percentiles as of the last refresh.

    A refresh runs at fixed points of fleet time, not when a rule happens to ask: :meth:`advance`
    is called with every live sample's ts before it is evaluated, and the first sample whose ts
    enters a later ``refresh_s`` epoch (``ts // refresh_s``) than any before it takes a snapshot of
    the rates and the population as they are then. Between two refreshes every lookup sees the same
    snapshot, so the order in which hosts are fed between two refresh points changes nothing (the
    detect worker feeds each batch grouped by host: detectors/worker/worker.py). The population (how
    many components the rule has seen) counts the quiet ones as zeros."""

    __slots__ = ("rates", "refresh_s", "population", "epoch", "_vals", "_n", "_cache")

    def __init__(self, refresh_s: float = 60.0) -> None:
        self.rates: dict[tuple[str, str], float] = {}
        self.refresh_s = refresh_s
        self.population = 0  # components seen (counted by the rule at each one's first sight)
        self.epoch = float("-inf")
        self._vals: list[float] = []  # the snapshot: non-zero rates, sorted
        self._n = 0  # the snapshot's population (zeros implicit)
        self._cache: dict[float, float] = {}

    def set(self, host: str, component: str, rate: float) -> None:
        if rate > 0:
            self.rates[(host, component)] = rate
        else:
            self.rates.pop((host, component), None)

    def due(self) -> float:
        """The first ts that starts a new epoch (advance before it is a no-op)."""
        return (self.epoch + 1) * self.refresh_s if self.refresh_s > 0 else float("-inf")

    def advance(self, ts: float) -> None:
        """A live sample at ``ts`` is about to be evaluated: refresh if it starts a new epoch."""
        e = ts // self.refresh_s if self.refresh_s > 0 else ts
        if e > self.epoch:
            self.epoch = e
            self.refresh()

    def refresh(self) -> None:
        self._vals = sorted(self.rates.values())
        self._n = max(self.population, len(self._vals))
        self._cache.clear()

    def percentile(self, q: float) -> float:
        """Rate at percentile q of the snapshot (quiet components are zeros)."""
        v = self._cache.get(q)
        if v is None:
            vals, n = self._vals, self._n
            zeros = n - len(vals)
            idx = int(q / 100.0 * (n - 1))
            v = self._cache[q] = 0.0 if idx < zeros or not vals else vals[idx - zeros]
        return v

    def clear(self) -> None:
        self.rates.clear()
        self.population = 0
        self.epoch = float("-inf")
        self._vals, self._n = [], 0
        self._cache.clear()
