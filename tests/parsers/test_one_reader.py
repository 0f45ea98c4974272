"""One kernel-line reader: the collector's follower (reading a capture as its kernel log) and diagnose's
kernel-log parser give the same events for every kernel-log fixture and shared-corpus capture."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.kernel_follow import KernelLogFollower
from parsers import kernel

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / ".." / "shared" / "corpus"
OWN = sorted((ROOT / "fixtures" / "kernel-lines").iterdir()) + sorted(
    p for p in (ROOT / "fixtures" / "parsers").iterdir() if p.suffix == ".log")
SHARED = sorted(p for d in ("kernel-xid", "kernel-aer", "edac", "other") if (CORPUS / d).is_dir()
                for p in (CORPUS / d).iterdir() if p.is_file())


def _key(evs):
    return [(e.kind, e.xid, e.pci_addr, e.severity, e.message, round(e.ts, 6)) for e in evs]


@pytest.mark.parametrize("path", OWN + SHARED, ids=lambda p: p.name)
def test_follower_and_diagnose_read_the_same_events(path: Path, tmp_path: Path) -> None:
    f = KernelLogFollower(path, state_path=tmp_path / "pos.json")
    streamed = f.poll()
    f.close()
    text = path.read_text(errors="replace")
    if not text.endswith("\n"):  # the follower leaves a last line without its newline for the next poll
        text = text[: text.rfind("\n") + 1]
    parsed = kernel.parse(text, lenient=True).sample.kernel_events
    assert _key(streamed) == _key(parsed)
