"""``fleethealth diagnose PATH...``: the offline doctor for captured artifacts.

Each path (a file or a sysfs snapshot folder) is sniffed for its format, parsed by
:mod:`collectors.parsers`, and evaluated by the snapshot rules (thresholds in
``detectors/diagnose_rules.yaml``, Xid semantics from NVIDIA's catalog in ``fleethealth.xid``).
Exit 0 = healthy, 1 = findings, 2 = an input could not be read or parsed (the reason is printed).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from collectors.parsers import Parsed, ParseError, load
from detectors.diagnose_gpu import evaluate_gpus, evaluate_xids, make
from detectors.diagnose_host import evaluate_dram, evaluate_facts, evaluate_net, evaluate_pcie
from detectors.diagnose_rules import DiagnoseRules, default_rules, load_rules
from detectors.finding import Finding
from fleethealth.cliutil import flag
from fleethealth.taxonomy import info


@dataclass
class Diagnosis:
    path: str
    format: str = ""
    findings: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None


def evaluate(p: Parsed, host: str = "unknown", rules: DiagnoseRules | None = None) -> list[Finding]:
    """All snapshot rules over one parsed capture (pure)."""
    rules = rules or default_rules()
    found = evaluate_gpus(p, host, rules) + evaluate_pcie(p, host, rules) + evaluate_net(p, host, rules)
    found += evaluate_dram(p, host, rules) + evaluate_facts(p, host)
    found += evaluate_xids(_xid_events(p), host)
    found += _fell_off_lines(p, host)
    return _consolidate(found)


def _xid_events(p: Parsed) -> list[tuple[str, int, str]]:
    uuid = {f.component: f.attrs["uuid"] for f in p.facts if f.kind == "gpu_uuid"}
    events: list[tuple[str, int, str]] = []
    for ev in p.sample.kernel_events:
        if ev.kind == "xid" and ev.xid is not None:
            events.append((uuid.get(ev.pci_addr or "", ev.pci_addr or "gpu"), ev.xid, ev.line))
    for f in p.facts:
        if f.kind == "xid_caused_by":
            events.append((uuid.get(f.component, f.component or "gpu"), f.attrs["cause"], f.line))
        elif f.kind == "xid_metric":
            events.append((f.component, f.attrs["xid"], f.line))
    return events


def _fell_off_lines(p: Parsed, host: str) -> list[Finding]:
    return [make(host, ev.pci_addr or "gpu", "gpu_fell_off_bus", "fallen_off_bus",
                 "the driver reports the GPU has fallen off the bus", ev.line)
            for ev in p.sample.kernel_events if ev.kind == "fell_off_bus"]


def _consolidate(found: list[Finding]) -> list[Finding]:
    """One finding per (component, failure mode), the most confident; a PCIe Surprise Down on a host
    whose GPU fell off the bus is that event's footprint, not a separate fault."""
    fell = any(f.failure_mode == "gpu_fell_off_bus" for f in found)
    best: dict[tuple[str, str], Finding] = {}
    for f in found:
        if fell and f.failure_mode == "pcie_fatal" and f.detector.endswith(":surprise_down"):
            continue
        key = (f.component, f.failure_mode)
        if key not in best or f.confidence > best[key].confidence:
            best[key] = f
    return list(best.values())


def diagnose_path(path: Path, host: str | None, rules: DiagnoseRules) -> Diagnosis:
    d = Diagnosis(str(path))
    try:
        parsed = load(path)
    except ParseError as exc:
        d.error = str(exc)
        return d
    except (OSError, UnicodeError) as exc:
        d.error = f"cannot read {path}: {exc}"
        return d
    d.format = parsed.format
    d.warnings = list(parsed.warnings)
    if parsed.skipped_lines:
        d.warnings.append(f"{parsed.skipped_lines} line(s) or value(s) skipped as unparseable")
    d.findings = evaluate(parsed, host or parsed.sample.host, rules)
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
    if not d.findings:
        print(f"{head}: healthy", file=out)
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


def run(paths: list[str], *, as_json: bool = False, host: str | None = None, rules_path: str | None = None,
        out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    rules = load_rules(Path(rules_path)) if rules_path else default_rules()
    worst = 0
    for p in paths:
        d = diagnose_path(Path(p), host, rules)
        if d.error:
            print(f"fleethealth diagnose: {d.path}: {d.error}", file=err)
            worst = 2
            continue
        if as_json:
            for f in d.findings:
                print(json.dumps(to_json(d, f), sort_keys=True), file=out)
        else:
            render_text(d, out)
        if d.findings and worst == 0:
            worst = 1
    return worst


def _handler(args: Any) -> int:
    return run(args.paths, as_json=args.json, host=args.host, rules_path=args.rules)


def register_diagnose(sub: Any) -> None:
    p = sub.add_parser(
        "diagnose", help="offline doctor for captured tool output and logs",
        description="Read captured artifacts (nvidia-smi -q / -q -x / table, nvidia-smi nvlink, dcgmi, "
                    "dcgm-exporter scrapes, kernel logs, mcelog / ras-mc-ctl, ibstat / ibstatus / perfquery / "
                    "ibqueryerrors / ibnetdiscover, ethtool, lspci -vvv, sysfs snapshot folders), detect each "
                    "format from its content, and print every finding: failure mode, component, evidence "
                    "line, NVIDIA's bucket where a Xid is involved, recommended action. "
                    "Exit 0 healthy, 1 findings, 2 unreadable input.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="capture files or sysfs snapshot folders")
    flag(p, "--json", action="store_true", help="one JSON object per finding per line")
    flag(p, "--host", metavar="NAME", help="host name to put in findings (default: unknown)")
    flag(p, "--rules", metavar="FILE", env="FLEETHEALTH_DIAGNOSE_RULES",
         help="thresholds file (default: the shipped detectors/diagnose_rules.yaml)")
    p.set_defaults(func=_handler)
