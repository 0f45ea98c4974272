"""Counter deltas for the ML features: the engine's :func:`detectors.engine.state.counter_delta`,
with one policy of the feature path on top.

The engine's function decides what a step is (a rise, a 32/64-bit wrap, a counter pegged at its
width from ``detectors/engine/counters.yaml``, a reset, a first read). The features differ in one
place: after a **reset** (a counter going backwards that is not a wrap: driver reload, GPU reset,
``perfquery -R``) the engine counts the new value as the increase since the reset, where a feature
window counts 0 and takes the new value as its baseline. A window's rate is a mean over one
minute or so; a lifetime counter read again after a reload would make it a spike the models were
never trained on (a reboot, a ``boot_id`` change, re-baselines the host without a window anyway).
``None`` (not available) on either side gives 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from detectors.engine.state import SATURATED, counter_delta


def increment(old: int | None, new: int | None, saturated: frozenset[int] = SATURATED) -> int:
    """Increments between two raw reads of one counter; never negative, never a reset spike."""
    step = counter_delta(old, new, saturated=saturated)
    return 0 if step.note == "reset" else step.delta


def deltas(old: Sequence[int | None] | None, new: Sequence[int | None],
           saturated: Sequence[frozenset[int]] | None = None) -> list[int]:
    """Element-wise :func:`increment`; a missing old snapshot (first read) gives zeros.
    ``saturated``: per element, the values at which that counter stops (``state.saturation(name)``);
    by default every element saturates at 2^8/16/32/64 - 1."""
    if old is None or len(old) != len(new) or old == new:
        return [0] * len(new)
    if saturated is None:
        return [increment(a, b) for a, b in zip(old, new, strict=True)]
    return [increment(a, b, s) for a, b, s in zip(old, new, saturated, strict=True)]
