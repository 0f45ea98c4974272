"""Labelled fleets for training: the fleet simulator's recordings read back as samples + ground truth.

Prefers the simulator's Python API (``collectors.fleetsim.engine.simulate``); without it, shells
out to ``fleethealth simulate``. Either way the recording goes to a temporary folder and is read
back through the strict contract decoder, exactly as the detectors would see it on the bus.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
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


def simulate_fleet(seed: int, hosts: int, duration_s: float, interval_s: float, fault_rate: float,
                   window_s: float, tick: Callable[[], None] | None = None, min_per_mode: int = 0) -> Fleet:
    """Simulate one labelled fleet (``min_per_mode`` faults of every mode at least, where the
    simulator's API offers it) and return its windows and ground truth."""
    tmp = Path(tempfile.mkdtemp(prefix="fleethealth-train-"))
    try:
        out = tmp / f"seed{seed}.jsonl.gz"
        try:
            from collectors.fleetsim.engine import simulate
            from collectors.fleetsim.plan import RunSpec
        except ImportError:
            cmd = [sys.executable, "-m", "fleethealth.cli", "simulate", "--hosts", str(hosts), "--duration",
                   f"{int(duration_s)}s", "--interval", str(interval_s), "--seed", str(seed),
                   "--fault-rate", str(fault_rate), "--out", str(out), "--quiet"]
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise UserError(f"`fleethealth simulate` failed ({res.returncode}): {res.stderr[-500:]}") from None
        else:
            spec = RunSpec(hosts=hosts, duration_s=duration_s, interval_s=interval_s, seed=seed, fault_rate=fault_rate,
                           min_per_mode=min_per_mode)
            spec.check()
            simulate(spec, out)
        return read_recording(out, window_s, tick)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
