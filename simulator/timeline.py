"""The simulation's schedule: one-shot events and per-tick processes, keyed by tick index."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .state import HostState

EventFn = Callable[[HostState, float], None]
StepFn = Callable[[HostState, float, int], None]  # (host, ts, ticks since the process started)


@dataclass(slots=True)
class Proc:
    host: int
    start: int
    end: int  # exclusive
    fn: StepFn


@dataclass
class Timeline:
    ticks: int
    events: dict[int, list[tuple[int, EventFn]]] = field(default_factory=dict)
    starts: dict[int, list[Proc]] = field(default_factory=dict)
    busy: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # host -> reserved windows

    def at(self, tick: int, host: int, fn: EventFn) -> None:
        if 0 <= tick < self.ticks:
            self.events.setdefault(tick, []).append((host, fn))

    def during(self, start: int, end: int, host: int, fn: StepFn) -> None:
        start = max(start, 0)
        end = min(end, self.ticks)
        if start < end:
            self.starts.setdefault(start, []).append(Proc(host, start, end, fn))

    def free(self, host: int, start: int, end: int, margin: int = 0) -> bool:
        return all(end + margin <= a or start - margin >= b for a, b in self.busy.get(host, ()))

    def reserve(self, host: int, start: int, end: int) -> None:
        self.busy.setdefault(host, []).append((start, end))
