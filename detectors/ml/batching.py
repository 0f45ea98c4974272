"""What both ML detectors share: windows buffered across hosts and scored in batches, and streaks
(how many windows in a row a host's component has shown something).

A detector built on :class:`WindowBatcher` defines ``score_batch(windows) -> findings``. It buffers
each window its feature stream closes and scores the buffer when ``batch_windows`` wait, when
sample time has moved ``batch_s`` past the oldest, or on :meth:`WindowBatcher.flush` (the engine
calls it at the end of each poll batch). sklearn and numpy cost per call, not per row, which is
why the batches are across hosts (docs/detectors.md, "ML"). Through the engine the detectors are
fed as one :class:`detectors.ml.MLSuite`, which only buffers: the engine flushes it at fixed
points of fleet time instead (:meth:`detectors.engine.engine.DetectorEngine.advance_epoch`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from detectors.engine.finding import Finding
from detectors.ml.features import FeatureStream, WindowFeatures
from fleethealth.schema import Sample


def _window_key(w: WindowFeatures) -> tuple[float, str]:
    return w.ts, w.host


class WindowBatcher:
    def __init__(self, stream: FeatureStream, batch_windows: int, batch_s: float) -> None:
        self.stream = stream
        self.batch_windows = batch_windows
        self.batch_s = batch_s
        self.pending: list[WindowFeatures] = []
        self.streak: dict[str, dict[Hashable, int]] = {}  # host -> key -> windows in a row
        self._oldest = self._now = 0.0

    def score_batch(self, ws: list[WindowFeatures]) -> list[Finding]:
        raise NotImplementedError

    def feed(self, sample: Sample) -> list[Finding]:
        return self.take(self.stream.feed(sample), sample.ts)

    def take(self, w: WindowFeatures | None, ts: float) -> list[Finding]:
        """Buffer a window the (shared) feature stream closed (None: the sample closed none) and
        score the batch when it is due; ``ts`` is the sample's time."""
        if ts > self._now:
            self._now = ts
        if w is not None:
            if not self.pending:
                self._oldest = w.ts
            self.pending.append(w)
        if self.pending and (len(self.pending) >= self.batch_windows or self._now - self._oldest >= self.batch_s):
            return self.flush()
        return []

    def flush(self) -> list[Finding]:
        """Score the buffered windows, taken in (window end, host) order: the arrival order of
        different hosts' windows changes nothing (a host's own windows keep their order, their
        ends rise); findings in that order."""
        batch, self.pending = self.pending, []
        if not batch:
            return []
        batch.sort(key=_window_key)
        return self.score_batch(batch)

    def score_window(self, w: WindowFeatures) -> list[Finding]:
        """One window, scored now (training's evaluation feeds windows in order this way)."""
        return self.score_batch([w])

    def reset(self) -> None:
        self.stream.reset()
        self.pending.clear()
        self.streak.clear()
        self._oldest = self._now = 0.0

    def forget_host(self, host: str) -> None:
        """Drop the host silently (its partition moved to another worker): feature state, streaks,
        and its windows still waiting for a batch."""
        self.stream.forget_host(host)
        self.streak.pop(host, None)
        self.pending = [w for w in self.pending if w.host != host]

    def advance(self, host: str, keys: Iterable[Hashable]) -> dict[Hashable, int]:
        """The host's next window shows ``keys``: how many windows in a row each has now been seen
        (a key missing from this window starts again from zero). Call once per window, in order."""
        prev = self.streak.get(host)
        now = {k: (prev.get(k, 0) if prev else 0) + 1 for k in keys}
        if now:
            self.streak[host] = now
        elif prev is not None:
            del self.streak[host]
        return now
