"""Timing helpers the benchmarks share (figures are printed, never asserted)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

POLL_BATCH = 2000  # records a detect worker handles between engine flushes (one poll batch)


def best_cpu(fn: Callable[[], Any], repeat: int = 3) -> float:
    """Best-of process CPU seconds of ``fn()`` (fn builds its own fresh state each call; other work
    on the machine only ever adds time)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def worker_path(packed: list[bytes], extra: list[Any]) -> Callable[[], None]:
    """What a detect worker runs per record: the incremental decoder, the engine with ``extra``
    detectors, and the engine flushed at the end of each poll batch (where batched model scoring
    hands over its findings: docs/detectors.md, "ML"). Fresh state on every call."""

    def run() -> None:
        from detectors.engine.engine import DetectorEngine
        from detectors.engine.fastdecode import IncrementalDecoder

        for d in extra:
            d.reset()
        eng, dec = DetectorEngine(extra_detectors=extra), IncrementalDecoder()
        decode = dec.decode
        for i, raw in enumerate(packed, 1):
            eng.feed(decode(raw), dec.base)  # the decoder's base, as the detect worker passes it
            if i % POLL_BATCH == 0:
                eng.flush()
        eng.flush()

    return run
