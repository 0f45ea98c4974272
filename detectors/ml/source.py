"""Labelled fleets for training: a simulator recording read back as samples + ground truth.

The recording is read through the strict contract decoder, exactly as the detectors would see it on
the bus. Producing the recording (the simulator) is the composition root's job
(``fleetcli/commands/train.py``): detectors do not import the simulator.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from detectors.ml.labels import Fault, FaultIndex
from detectors.ml.train import Fleet, windows_of
from fleethealth.bus import iter_jsonl
from fleethealth.errors import UserError
from fleethealth.schema import ContractError, decode_sample


def read_truth(path: Path) -> list[Fault]:
    """The simulator's ``*.truth.jsonl``: one fault per line (host, component, failure_mode, onset, end,
    secondary)."""
    out = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                out.append(Fault(str(r["host"]), str(r["component"]), str(r["failure_mode"]), float(r["onset"]),
                                 None if r.get("end") is None else float(r["end"]),
                                 tuple(str(m) for m in r.get("secondary") or ())))
            except (ValueError, KeyError, TypeError) as exc:
                raise UserError(f"{path}:{lineno}: bad ground-truth line: {exc}") from None
    return out


def read_recording(path: Path, window_s: float, tick: Callable[[], None] | None = None) -> Fleet:
    """Windows of a recording plus its ground truth (``<stem>.truth.jsonl`` beside it)."""
    name = path.name
    for ext in (".jsonl.gz", ".jsonl", ".gz"):
        if name.endswith(ext):
            name = name[: -len(ext)]
            break
    truth = path.with_name(f"{name}.truth.jsonl")
    if not truth.exists():
        raise UserError(f"{path}: no ground truth beside it ({truth.name})")

    def samples():  # type: ignore[no-untyped-def]
        for _lineno, raw in iter_jsonl(path):
            try:
                yield decode_sample(raw)
            except ContractError:
                continue  # a bad line is skipped, as the bus consumer does (dead-lettered there)

    fleet = windows_of(samples(), window_s, tick)
    fleet.faults = FaultIndex(read_truth(truth))
    return fleet

