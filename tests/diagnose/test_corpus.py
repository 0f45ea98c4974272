"""Every labelled capture of the shared real-capture corpus through both paths: ``diagnose``, and
(where the collector can read it) the real collector plus the streaming engine. Misses not listed
in ``corpus_misses.yaml`` (each with its reason) fail, and so does a listed one that now passes.
Without the corpus (a fresh clone) the test skips, unless FLEETHEALTH_REQUIRE_CORPUS=1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from detectors.diagnose.doctor import diagnose_path
from detectors.engine.ruleset import RuleSet
from tests.diagnose.streampath import CORPUS, corpus_rows, stream_kind, stream_modes

MISSES = yaml.safe_load((Path(__file__).resolve().parent / "corpus_misses.yaml").read_text())


def _want(label: str) -> set[str]:
    return set() if label == "healthy" else set(label.split(","))


def _rows() -> list[dict[str, str]]:
    rows = corpus_rows()
    if not rows:
        if os.environ.get("FLEETHEALTH_REQUIRE_CORPUS") == "1":
            pytest.fail(f"shared corpus not found at {CORPUS}")
        pytest.skip(f"shared corpus not found at {CORPUS}")
    return rows


def _check(path_name: str, results: list[tuple[str, set[str], set[str], str]]) -> None:
    known = MISSES.get(path_name) or {}
    wrong, fixed = [], []
    for name, got, want, err in results:
        ok = got == want and not err
        if not ok and name not in known:
            wrong.append(f"{name}: got {sorted(got)} want {sorted(want)} {err}")
        elif ok and name in known:
            fixed.append(f"{name}: now right; remove it from corpus_misses.yaml [{path_name}]")
    right = sum(1 for _, got, want, err in results if got == want and not err)
    print(f"corpus [{path_name}]: {right} of {len(results)} labels matched")
    assert not wrong and not fixed, "\n".join(wrong + fixed)


def test_corpus_labels_diagnose() -> None:
    results = []
    for r in _rows():
        d = diagnose_path(CORPUS / r["path"])
        results.append((r["path"], {f.failure_mode for f in d.findings}, _want(r["label"]), d.error or ""))
    _check("diagnose", results)


def test_corpus_labels_stream() -> None:
    rules = RuleSet.load()
    results = []
    for r in _rows():
        kind = stream_kind(CORPUS / r["path"])
        if kind is not None:
            results.append((r["path"], stream_modes(CORPUS / r["path"], kind, rules), _want(r["label"]), ""))
    assert len(results) >= 20
    _check("stream", results)
