"""Recordings on disk: a telemetry file (``NAME.jsonl.gz`` / ``NAME.jsonl``) and the files the
simulator and the buses write beside it, named by its stem: ``NAME.truth.jsonl`` (ground truth),
``NAME.meta.json``, ``NAME.<topic>.jsonl``. The one place that knows these names, and the one
reader of ground truth (each part turns the rows into its own fault type)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleethealth.errors import UserError

SUFFIXES = (".jsonl.gz", ".jsonl", ".gz")
TRUTH_KEYS = ("host", "failure_mode", "onset")  # every ground-truth row has these


def stem(path: Path) -> str:
    """``fleet.jsonl.gz`` -> ``fleet`` (the name without the recording suffix)."""
    name = path.name
    for ext in SUFFIXES:
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def side_path(recording: Path, suffix: str) -> Path:
    """``fleet.jsonl.gz`` -> ``fleet.<suffix>`` beside it."""
    return recording.with_name(f"{stem(recording)}.{suffix}")


def truth_path(recording: Path) -> Path:
    return side_path(recording, "truth.jsonl")


def meta_path(recording: Path) -> Path:
    return side_path(recording, "meta.json")


def read_truth(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``*.truth.jsonl`` (one fault a line: id, host, component, failure_mode, onset,
    end, secondary). A missing file or a bad line is a :class:`UserError` naming file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no ground truth (expected <stem>.truth.jsonl beside the recording)") from None
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
            missing = [k for k in TRUTH_KEYS if k not in row]
            if missing:
                raise ValueError(f"missing {', '.join(missing)}")
            float(row["onset"])
            if row.get("end") is not None:
                float(row["end"])
        except (ValueError, TypeError) as exc:
            raise UserError(f"{path}:{n}: bad ground-truth line: {exc}") from None
        rows.append(row)
    return rows
