"""The two ways into the one engine, for the differential test: ``diagnose`` on a capture, and the
real collector reading the same capture (as its kernel log or its sysfs root) with its samples fed to
the streaming detector engine."""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path

from collectors.daemon import Collector, CollectorSettings
from detectors.diagnose.doctor import diagnose_path
from detectors.engine.engine import DetectorEngine
from detectors.engine.ruleset import RuleSet
from fleethealth.schema import Incident, Sample
from parsers import ParseError, load
from parsers.sysfs_snapshot import find_sys_root

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / ".." / "shared" / "corpus"
FIXTURES = REPO / "tests" / "fixtures"
STREAM_FORMATS = ("kernel-log", "sysfs-snapshot")


class _ListSink:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes]] = []

    def send_batch(self, records: list[tuple[str, bytes]]) -> int:
        self.records.extend(records)
        return len(records)

    def close(self) -> None:
        pass


def stream_kind(path: Path) -> str | None:
    """``kmsg`` / ``sysfs`` when the collector can read this capture, else None."""
    if path.is_dir():
        return "sysfs" if find_sys_root(path) is not None else None
    try:
        fmt = load(path).format
    except (ParseError, OSError, UnicodeError):
        return None
    return "kmsg" if fmt == "kernel-log" else None


def collect_once(path: Path, kind: str, work: Path) -> Sample:
    """One poll of the real collector (no NVML) with ``path`` as its kernel log or sysfs root."""
    empty = work / "empty-sys"
    empty.mkdir(exist_ok=True)
    sys_root = str(find_sys_root(path)) if kind == "sysfs" else str(empty)
    settings = CollectorSettings(host="capture", sysfs_root=sys_root, proc_root=str(work / "proc"),
                                 kmsg_path=str(path) if kind == "kmsg" else None,
                                 state_dir=str(work / "state"), fsync=False)
    c = Collector(settings, sink=_ListSink())
    try:
        return c.poll_once()
    finally:
        c.close(flush_timeout=0.5)


def stream_incidents(path: Path, kind: str, rules: RuleSet | None = None) -> list[Incident]:
    """The incidents the streaming engine opens on the collector's sample of this capture."""
    with tempfile.TemporaryDirectory(prefix="fh-diff-") as tmp:
        sample = collect_once(path, kind, Path(tmp))
    return DetectorEngine(rules or RuleSet.load()).feed(sample)


def stream_modes(path: Path, kind: str, rules: RuleSet | None = None) -> set[str]:
    """Failure modes of the open episodes after the collector's sample went through the engine."""
    return {i.failure_mode for i in stream_incidents(path, kind, rules)}


def diagnose_modes(path: Path) -> set[str]:
    d = diagnose_path(path, None)
    return {f.failure_mode for f in d.findings}


def corpus_rows() -> list[dict[str, str]]:
    manifest = CORPUS / "MANIFEST.tsv"
    if not manifest.exists():
        return []
    with manifest.open(newline="") as fh:
        return [r for r in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE) if r["label"] != "-"]


def captures() -> list[tuple[str, Path]]:
    """(name, path) of every test fixture (file or sysfs folder) and every labelled corpus capture."""
    out: list[tuple[str, Path]] = []
    for p in sorted(FIXTURES.rglob("*")):
        rel = p.relative_to(FIXTURES).as_posix()
        if any(part.startswith(".") for part in p.parts):
            continue
        if p.is_dir() and find_sys_root(p) == p / "sys" or p.is_file() and "/sys/" not in f"/{rel}" and p.suffix not in (".py", ".json", ".tsv", ".yaml"):
            out.append((f"fixtures/{rel}", p))
    for r in corpus_rows():
        out.append((f"corpus/{r['path']}", CORPUS / r["path"]))
    return out
