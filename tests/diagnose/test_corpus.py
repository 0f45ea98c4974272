"""diagnose over every labelled file of the shared real-capture corpus (skips when absent)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from detectors.diagnose import diagnose_path
from detectors.diagnose_rules import default_rules

CORPUS = Path(__file__).resolve().parents[2] / ".." / "shared" / "corpus"
# Deliberate disagreement: a `dcgmi diag` table that only shows "Denylist | Pass" cannot reveal that
# NVLink is down (the label comes from a companion capture); no general rule can get it from this file.
KNOWN_DISAGREEMENTS = {"other/dcgmi-diag-r2-header-pass-despite-nvlink-down.txt"}


def _rows() -> list[dict[str, str]]:
    manifest = CORPUS / "MANIFEST.tsv"
    if not manifest.exists():
        return []
    with manifest.open(newline="") as fh:
        return [r for r in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE) if r["label"] != "-"]


def test_corpus_labels() -> None:
    rows = _rows()
    if not rows:
        pytest.skip(f"shared corpus not found at {CORPUS}")
    wrong = []
    for r in rows:
        d = diagnose_path(CORPUS / r["path"], None, default_rules())
        got = {f.failure_mode for f in d.findings}
        want = set() if r["label"] == "healthy" else set(r["label"].split(","))
        if (got != want or d.error) and r["path"] not in KNOWN_DISAGREEMENTS:
            wrong.append(f"{r['path']}: got {sorted(got)} want {sorted(want)} {d.error or ''}")
    print(f"corpus: {len(rows) - len(wrong) - len(KNOWN_DISAGREEMENTS)} of {len(rows)} labels matched")
    assert not wrong, "\n".join(wrong)
