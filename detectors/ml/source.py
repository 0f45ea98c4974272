"""Labelled fleets for training: a simulator recording read back as samples + ground truth.

The recording is read through the strict contract decoder, exactly as the detectors would see it on
the bus. Producing the recording (the simulator) is the composition root's job
(``fleetcli/commands/train.py``): detectors do not import the simulator.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from detectors.ml.labels import Fault, FaultIndex
from detectors.ml.train import Fleet, windows_of
from fleethealth.bus import iter_jsonl
from fleethealth.errors import UserError
from fleethealth.recordings import read_truth, truth_path
from fleethealth.schema import ContractError, decode_sample


def read_faults(path: Path) -> list[Fault]:
    """The simulator's ``*.truth.jsonl`` (:func:`fleethealth.recordings.read_truth`) as training faults."""
    return [Fault(str(r["host"]), str(r.get("component") or "host"), str(r["failure_mode"]), float(r["onset"]),
                  None if r.get("end") is None else float(r["end"]), tuple(str(m) for m in r.get("secondary") or ()))
            for r in read_truth(path)]


def read_recording(path: Path, window_s: float, tick: Callable[[], None] | None = None) -> Fleet:
    """Windows of a recording plus its ground truth (``<stem>.truth.jsonl`` beside it)."""
    truth = truth_path(path)
    if not truth.exists():
        raise UserError(f"{path}: no ground truth beside it ({truth.name})")

    def samples():  # type: ignore[no-untyped-def]
        for _lineno, raw in iter_jsonl(path):
            try:
                yield decode_sample(raw)
            except ContractError:
                continue  # a bad line is skipped, as the bus consumer does (dead-lettered there)

    fleet = windows_of(samples(), window_s, tick)
    fleet.faults = FaultIndex(read_faults(truth))
    return fleet

