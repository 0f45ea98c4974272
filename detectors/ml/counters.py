"""Counter deltas the way a streaming system must take them: resets and wraps never make spikes.

Hardware counters are sent raw. Between two reads a counter may
- rise (the normal case): delta = new - old;
- stay pegged at its maximum (IB PMA counters saturate, e.g. link_downed at 255): delta = 0;
- wrap around a 32- or 64-bit limit: delta = (limit - old) + new, when that is small next to the limit;
- go backwards for any other reason (reboot, driver reload, ``perfquery -R``): the counter restarted
  from an unknown point, so the delta is 0 and the new value becomes the baseline. Counting ``new``
  instead would turn a lifetime counter read after a reload into a spike; losing at most one window
  of increments is the conservative choice (the rule engine sees the raw events anyway).
``None`` (not available) on either side gives 0.
"""

from __future__ import annotations

from collections.abc import Sequence

_WRAP_LIMITS = (1 << 32, 1 << 64)


def counter_delta(old: int | None, new: int | None) -> int:
    """Increments between two raw reads of one counter; never negative, never a reset spike."""
    if old is None or new is None:
        return 0
    if new >= old:
        return new - old
    for limit in _WRAP_LIMITS:
        if old < limit:
            wrapped = limit - old + new
            # a genuine wrap: the old value sat in the top quarter and few increments passed the limit
            if old >= limit - (limit >> 2) and wrapped < (limit >> 4):
                return wrapped
            return 0
    return 0


def deltas(old: Sequence[int | None] | None, new: Sequence[int | None]) -> list[int]:
    """Element-wise :func:`counter_delta`; a missing old snapshot (first read) gives zeros."""
    if old is None or len(old) != len(new) or old == new:
        return [0] * len(new)
    return [counter_delta(a, b) for a, b in zip(old, new, strict=True)]
