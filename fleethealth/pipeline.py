"""The whole pipeline in one process (``fleethealth run``, ``make demo``): composition root."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    return None  # `run` is added when the pipeline lands
