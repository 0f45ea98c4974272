"""``fleethealth diagnose PATH...``: the offline doctor for captured artifacts.

Each path (a file or a sysfs snapshot folder) is sniffed for its format, parsed by
:mod:`parsers`, and judged by the streaming detectors' own rule set in snapshot mode
(:mod:`detectors.diagnose.engine`): one rule set, one engine, two ways of feeding it.
Exit 0 = healthy, 1 = findings, 2 = an input could not be read (the reason is printed), 3 = no evidence
(nothing in the inputs could show a fault: a vGPU scrape without memory-error fields, a log without kernel
lines). Inputs: files (gzip detected by content), ``-`` for stdin, folders (walked, each file reported),
sysfs snapshot folders; a file holding several captures is split (:mod:`parsers.split`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from detectors.diagnose.engine import combine, evaluate, load_snapshot_rules, snapshot_rules
from detectors.engine.finding import Finding
from detectors.engine.ruleset import RuleSet
from fleethealth.taxonomy import info
from parsers import Parsed, ParseError, decode_capture, parse_captures, read_source
from parsers.base import coverage


@dataclass
class Diagnosis:
    path: str
    format: str = ""
    findings: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    evidence: list[str] | None = None  # what the input could speak to; [] = no evidence (see coverage())

    @property
    def outcome(self) -> str:
        """``unreadable``, ``findings``, ``no evidence`` (nothing in it could show a fault) or ``healthy``."""
        if self.error:
            return "unreadable"
        if self.findings:
            return "findings"
        return "no evidence" if self.evidence == [] else "healthy"


MAX_WALK = 10_000  # files read from one folder


def diagnose_path(path: Path, host: str | None = None, rules: RuleSet | None = None) -> Diagnosis:
    """One input: a capture file (``-`` for stdin; gzip by content), a sysfs snapshot folder, or a
    folder of captures (walked; its files' findings together; :func:`diagnose_input` reports each)."""
    ds = diagnose_input(str(path), host, rules or snapshot_rules())
    if len(ds) == 1 and ds[0].path == str(path):
        return ds[0]
    d = Diagnosis(str(path), format="folder", evidence=[])
    for x in ds:
        if x.error:
            d.warnings.append(f"{x.path}: {x.error}")
            continue
        d.findings += x.findings
        d.evidence = sorted(set(d.evidence or []) | set(x.evidence or []))
    d.findings = combine(d.findings)
    return d


def diagnose_input(arg: str, host: str | None, rules: RuleSet, stdin: BinaryIO | None = None) -> list[Diagnosis]:
    """Every capture an argument names: one Diagnosis per file (a folder that is not a sysfs snapshot
    is walked, in name order, hidden entries skipped)."""
    p = Path(arg)
    if arg != "-" and p.is_dir():
        from parsers import sysfs_snapshot  # only for folders (start-up of a one-file diagnose)

        if sysfs_snapshot.find_sys_root(p) is not None:
            return [_diagnose_tree(p, host, rules)]
        files = sorted(f for f in p.rglob("*") if f.is_file() and not any(
            part.startswith(".") for part in f.relative_to(p).parts))
        if not files:
            return [Diagnosis(arg, error="an empty folder (no capture files, no sysfs snapshot)")]
        out = [_diagnose_file(str(f), host, rules, None) for f in files[:MAX_WALK]]
        if len(files) > MAX_WALK:
            out[-1].warnings.append(f"{len(files) - MAX_WALK} more file(s) under {arg} not read")
        return out
    return [_diagnose_file(arg, host, rules, stdin)]


def _diagnose_tree(p: Path, host: str | None, rules: RuleSet) -> Diagnosis:
    from parsers import sysfs_snapshot

    d = Diagnosis(str(p), format=sysfs_snapshot.FORMAT)
    try:
        parsed = sysfs_snapshot.parse_files(sysfs_snapshot.read_tree(p))
    except ParseError as exc:
        d.error = str(exc)
        return d
    return _finish(d, [parsed], host, rules)


def _diagnose_file(arg: str, host: str | None, rules: RuleSet, stdin: BinaryIO | None) -> Diagnosis:
    d = Diagnosis(arg)
    try:
        text = decode_capture(read_source(arg, stdin), arg)
    except ParseError as exc:
        d.error = str(exc)
        return d
    except OSError as exc:
        d.error = f"cannot read {arg}: {exc}"
        return d
    return _finish(d, parse_captures(text, arg), host, rules)


def _finish(d: Diagnosis, parts: list[Parsed], host: str | None, rules: RuleSet) -> Diagnosis:
    d.format = " + ".join(dict.fromkeys(p.format for p in parts))
    found: list[Finding] = []
    covered: set[str] = set()
    for parsed in parts:
        d.warnings += parsed.warnings
        if parsed.skipped_lines:
            d.warnings.append(f"{parsed.skipped_lines} line(s) or value(s) skipped as unparseable")
        found += evaluate(parsed, host or parsed.sample.host, rules)
        covered |= set(coverage(parsed))
    d.findings = combine(found)
    d.evidence = sorted(covered)
    return d


def to_json(d: Diagnosis, f: Finding) -> dict[str, Any]:
    ev = f.evidence[0] if f.evidence else None
    obj: dict[str, Any] = {
        "file": d.path, "format": d.format, "host": f.host, "failure_mode": f.failure_mode,
        "component": f.component, "severity": f.severity, "confidence": round(f.confidence, 3),
        "evidence": ev.line or ev.fact if ev else "", "fact": ev.fact if ev else "",
        "action": f.recommended_action, "drain": info(f.failure_mode).drain, "rule": f.detector,
    }
    if f.xid is not None:
        obj["xid"] = f.xid
        obj["nvidia_bucket"] = f.nvidia_bucket
    return obj


def render_text(d: Diagnosis, out: TextIO) -> None:
    if d.error:
        print(f"{d.path}: UNREADABLE: {d.error}", file=out)
        return
    head = f"{d.path} [{d.format}]"
    if d.outcome == "no evidence":
        print(f"{head}: no evidence (nothing in it could show a fault; not a clean bill of health)", file=out)
    elif not d.findings:
        print(f"{head}: healthy ({', '.join(d.evidence or []) or 'what it shows'})", file=out)
    for f in sorted(d.findings, key=lambda x: (x.failure_mode, x.component)):
        ev = f.evidence[0] if f.evidence else None
        print(f"{head}: {f.failure_mode} on {f.component} ({f.severity}, confidence {f.confidence:.2f})", file=out)
        if ev:
            print(f"    fact:     {ev.fact}", file=out)
            if ev.line:
                print(f"    evidence: {ev.line}", file=out)
        if f.xid is not None:
            print(f"    xid:      {f.xid} (NVIDIA bucket {f.nvidia_bucket})", file=out)
        print(f"    action:   {', '.join(f.recommended_action) or 'none'}", file=out)
    for w in d.warnings:
        print(f"    note:     {w}", file=out)


EXIT_HEALTHY, EXIT_FINDINGS, EXIT_UNREADABLE, EXIT_NO_EVIDENCE = 0, 1, 2, 3


def run(paths: list[str], *, as_json: bool = False, host: str | None = None, rules_path: str | None = None,
        out: TextIO | None = None, err: TextIO | None = None, stdin: BinaryIO | None = None) -> int:
    """Exit status: 2 when an input could not be read, else 1 when anything was found, else 3 when
    an input held no evidence (nothing in it could show a fault), else 0."""
    out = out or sys.stdout
    err = err or sys.stderr
    rules = load_snapshot_rules(rules_path)
    outcomes: set[str] = set()
    for arg in paths:
        for d in diagnose_input(arg, host, rules, stdin):
            outcomes.add(d.outcome)
            if d.error:
                print(f"fleethealth diagnose: {d.path}: {d.error}", file=err)
                continue
            if as_json:
                for f in d.findings:
                    print(json.dumps(to_json(d, f), sort_keys=True), file=out)
                if not d.findings:
                    print(json.dumps({"file": d.path, "format": d.format, "outcome": d.outcome,
                                      "evidence": d.evidence or []}, sort_keys=True), file=out)
            else:
                render_text(d, out)
    if "unreadable" in outcomes:
        return EXIT_UNREADABLE
    if "findings" in outcomes:
        return EXIT_FINDINGS
    if "no evidence" in outcomes:
        return EXIT_NO_EVIDENCE
    return EXIT_HEALTHY

