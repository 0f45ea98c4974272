"""The replay scorecard: run a recording through the detector engine and grade the incidents
against the ground truth beside it (``<stem>.truth.jsonl``, written by ``fleethealth simulate``).

Matching (one detection = one incident episode, taken at its ``open``):
* a detection matches a fault when host and failure mode agree, its ``first_seen`` lies in
  [onset - slack_s, end + grace_s], and, where both name a component (not "host"), the components
  agree (PCI addresses compared normalised);
* a detection of a mode the truth lists as the fault's ``secondary`` (a GPU falling off the bus
  also raises AER fatal) is *explained*: correct for precision, not counted toward that mode's recall;
* a predictive mode (a correctable-error storm) on the component of a later uncorrectable fault,
  within that fault's ramp before its onset (``fleethealth.taxonomy.PRECURSORS``), is *explained*
  as its precursor (the simulator's truth says the CE ramp is that fault's evidence);
* everything else is a false positive.

Per failure mode: precision = correct detections / detections, recall = faults matched by at
least one detection / faults (support), F1, and the median detection delay (first matching
first_seen minus onset, seconds). ``healthy_hosts_with_incidents`` counts hosts with no fault in
the truth that got any incident, and separately a drain-worthy one (``..._drain``).
"""

from __future__ import annotations

import bisect
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detectors.engine.paths import norm_pci
from fleethealth.bus import BusError, iter_jsonl
from fleethealth.errors import UserError
from fleethealth.recordings import read_truth, truth_path
from fleethealth.schema import ContractError, Incident, decode_sample
from fleethealth.taxonomy import DRAIN_WORTHY, FAULT_LABELS, PRECURSORS

SLACK_S = 120.0
GRACE_S = 900.0


@dataclass(slots=True)
class TruthFault:
    id: str
    host: str
    component: str
    mode: str
    onset: float
    end: float
    secondary: tuple[str, ...] = ()


@dataclass(slots=True)
class Detection:
    id: str
    host: str
    component: str
    mode: str
    first_seen: float
    detector: str
    matched: str = ""  # fault id
    verdict: str = "fp"  # tp | secondary | fp


@dataclass
class DetectionRun:
    incidents: list[Incident] = field(default_factory=list)
    hosts: set[str] = field(default_factory=set)
    samples: int = 0
    invalid: int = 0
    first_ts: float = 0.0
    last_ts: float = 0.0
    stats: dict[str, int] = field(default_factory=dict)
    host_ts: dict[str, list[float]] = field(default_factory=dict)  # sample times per host (sorted)


def truth_faults(rows: list[dict[str, Any]]) -> list[TruthFault]:
    """Ground-truth rows (:func:`fleethealth.recordings.read_truth`) as scoring's faults."""
    try:
        return [TruthFault(str(r["id"]), str(r["host"]), r.get("component") or "host", str(r["failure_mode"]),
                           float(r["onset"]), float(r["end"]), tuple(r.get("secondary") or ())) for r in rows]
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"bad ground-truth row for scoring (needs id, host, failure_mode, onset, end): {exc}") from None


def load_truth(path: Path) -> list[TruthFault]:
    """The faults of a ``*.truth.jsonl`` (the recording's: :func:`fleethealth.recordings.truth_path`)."""
    return truth_faults(read_truth(path))


def run_recording(path: Path, engine: Any = None, progress: Callable[[int], None] | None = None) -> DetectionRun:
    """Feed every sample of a recording to the engine (bad lines counted, skipped) and return incidents."""
    if engine is None:
        from detectors.engine.engine import DetectorEngine

        engine = DetectorEngine()
    res = DetectionRun()
    try:
        for _, raw in iter_jsonl(path):
            try:
                s = decode_sample(raw)
            except ContractError:
                res.invalid += 1
                continue
            res.samples += 1
            res.hosts.add(s.host)
            res.host_ts.setdefault(s.host, []).append(s.ts)
            if not res.first_ts:
                res.first_ts = s.ts
            res.last_ts = max(res.last_ts, s.ts)
            res.incidents.extend(engine.feed(s))
            if progress is not None and res.samples % 1000 == 0:
                progress(1000)
    except BusError as exc:
        raise UserError(str(exc)) from None
    if res.last_ts:
        res.incidents.extend(engine.tick(res.last_ts))
    res.stats = dict(engine.stats)
    return res


def _same_component(a: str, b: str) -> bool:
    if not a or not b or a == "host" or b == "host":
        return True
    if a == b:
        return True
    if ":" in a and ":" in b and "." in a and "." in b:
        return norm_pci(a) == norm_pci(b)
    return a.lower() == b.lower()


def _precursor_of(d: Detection, f: TruthFault) -> bool:
    """Whether ``d`` is the correctable-error ramp before fault ``f`` (fleethealth.taxonomy.PRECURSORS)."""
    p = PRECURSORS.get(f.mode)
    return (p is not None and p.storm == d.mode and f.onset - p.ramp_s <= d.first_seen <= f.end
            and _same_component(d.component, f.component))


def detections_of(incidents: Iterable[Incident]) -> list[Detection]:
    seen: dict[str, Detection] = {}
    for inc in incidents:
        if inc.id not in seen:
            seen[inc.id] = Detection(inc.id, inc.host, inc.component, inc.failure_mode, inc.first_seen, inc.detector)
    return sorted(seen.values(), key=lambda d: (d.first_seen, d.host, d.id))


def observable(f: TruthFault, host_ts: dict[str, list[float]] | None) -> bool:
    """Did the host send any sample while the fault lasted? (A fault whose whole window falls in a
    telemetry gap, e.g. cut short by the end of the recording during a repair reboot, cannot be
    seen by any detector; it is reported as unobservable, not scored.)"""
    if host_ts is None or f.mode == "host_unreachable":
        return True
    ts = host_ts.get(f.host, [])
    i = bisect.bisect_left(ts, f.onset)
    return i < len(ts) and ts[i] <= f.end


def score(truth: list[TruthFault], incidents: Iterable[Incident], hosts: Iterable[str] = (), *,
          slack_s: float = SLACK_S, grace_s: float = GRACE_S,
          host_ts: dict[str, list[float]] | None = None) -> dict[str, Any]:
    unobservable = [f for f in truth if not observable(f, host_ts)]
    hidden = {f.id for f in unobservable}
    dets = detections_of(incidents)
    by_host: dict[str, list[TruthFault]] = defaultdict(list)
    for f in truth:
        by_host[f.host].append(f)
    found: dict[str, float] = {}  # fault id -> earliest matching first_seen
    for d in dets:
        cands = [f for f in by_host.get(d.host, ()) if f.onset - slack_s <= d.first_seen <= f.end + grace_s
                 and _same_component(d.component, f.component)]
        prim = [f for f in cands if f.mode == d.mode]
        if prim:
            f = min(prim, key=lambda f: abs(d.first_seen - f.onset))
            d.verdict, d.matched = "tp", f.id
            found[f.id] = min(found.get(f.id, d.first_seen), d.first_seen)
            continue
        sec = [f for f in cands if d.mode in f.secondary]
        if sec:
            d.verdict, d.matched = "secondary", sec[0].id
            continue
        pre = [f for f in by_host.get(d.host, ()) if _precursor_of(d, f)]
        if pre:
            d.verdict, d.matched = "precursor", pre[0].id
    modes: dict[str, dict[str, Any]] = {}
    for m in FAULT_LABELS:
        faults = [f for f in truth if f.mode == m and f.id not in hidden]
        md = [d for d in dets if d.mode == m]
        if not faults and not md:
            continue
        good = sum(1 for d in md if d.verdict != "fp")
        hit = [f for f in faults if f.id in found]
        prec = good / len(md) if md else (1.0 if not faults else 0.0)
        rec = len(hit) / len(faults) if faults else 1.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        delays = [max(0.0, found[f.id] - f.onset) for f in hit]
        modes[m] = {"precision": round(prec, 4), "recall": round(rec, 4), "f1": round(f1, 4),
                    "support": len(faults), "detections": len(md), "false_positives": len(md) - good,
                    "median_delay_s": round(statistics.median(delays), 1) if delays else None,
                    "drain_worthy": m in {x.value for x in DRAIN_WORTHY}}
    faulty = {f.host for f in truth}
    healthy = set(hosts) - faulty
    any_inc = {d.host for d in dets if d.host in healthy}
    drain_inc = {d.host for d in dets if d.host in healthy and d.mode in {x.value for x in DRAIN_WORTHY}}
    fps = [{"host": d.host, "component": d.component, "failure_mode": d.mode, "first_seen": d.first_seen,
            "detector": d.detector} for d in dets if d.verdict == "fp"]
    return {
        "modes": modes,
        "healthy_hosts": len(healthy),
        "healthy_hosts_with_incidents": len(any_inc),
        "healthy_hosts_with_drain_incidents": len(drain_inc),
        "faults": len(truth),
        "detections": len(dets),
        "unobservable_faults": [{"id": f.id, "host": f.host, "failure_mode": f.mode} for f in unobservable],
        "false_positive_examples": fps[:50],
        "_detections": dets,
    }


def meets_quality_bar(card: dict[str, Any], recall: float = 0.95, precision: float = 0.98) -> list[str]:
    """Issue 5's bar: every drain-worthy mode with support meets recall and precision; no incident
    on a healthy host. Returns the failures (empty = pass)."""
    bad = []
    for m, r in card["modes"].items():
        if not r["drain_worthy"]:
            continue
        if r["support"] and r["recall"] < recall:
            bad.append(f"{m}: recall {r['recall']} < {recall}")
        if r["detections"] and r["precision"] < precision:
            bad.append(f"{m}: precision {r['precision']} < {precision}")
    if card["healthy_hosts_with_incidents"]:
        bad.append(f"{card['healthy_hosts_with_incidents']} healthy host(s) got incidents")
    return bad


def format_scorecard(card: dict[str, Any]) -> str:
    lines = [f"{'failure mode':<24} {'prec':>6} {'recall':>6} {'f1':>6} {'support':>7} {'dets':>5} "
             f"{'FP':>4} {'median delay s':>14}"]
    for m, r in card["modes"].items():
        d = "-" if r["median_delay_s"] is None else f"{r['median_delay_s']:.0f}"
        lines.append(f"{m + (' *' if r['drain_worthy'] else ''):<24} {r['precision']:>6.3f} {r['recall']:>6.3f} "
                     f"{r['f1']:>6.3f} {r['support']:>7} {r['detections']:>5} {r['false_positives']:>4} {d:>14}")
    lines.append("(* drain-worthy)")
    if card.get("unobservable_faults"):
        lines.append(f"unobservable faults (no telemetry from the host during the fault; not scored): "
                     f"{len(card['unobservable_faults'])}")
    lines.append(f"healthy hosts: {card['healthy_hosts']}; with any incident: {card['healthy_hosts_with_incidents']}; "
                 f"with a drain-worthy incident: {card['healthy_hosts_with_drain_incidents']}")
    bad = meets_quality_bar(card)
    lines.append("quality bar (recall >= 0.95, precision >= 0.98 per drain-worthy mode; no incident on a healthy "
                 "host): " + ("PASS" if not bad else "FAIL: " + "; ".join(bad)))
    return "\n".join(lines)


def public(card: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in card.items() if not k.startswith("_")}


def score_replay(path: Path | str, args: Any = None, engine: Any = None) -> int:
    """``fleethealth replay PATH --score [--json] [--report DIR]``: print the scorecard; exit 0 when
    the quality bar holds, 1 when it does not."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such recording")
    truth = load_truth(truth_path(path))
    quiet = bool(getattr(args, "quiet", False))
    bar = None
    if not quiet and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(unit=" samples", file=sys.stderr, desc="scoring")
    try:
        res = run_recording(path, engine, progress=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    card = score(truth, res.incidents, res.hosts, host_ts=res.host_ts)
    card["samples"], card["invalid_samples"], card["recording"] = res.samples, res.invalid, str(path)
    report = getattr(args, "report", None)
    if report:
        from detectors.scoring.report import ReportData, write_report

        card["report"] = str(write_report(ReportData(
            command="replay --score", source=str(path), samples=res.samples, hosts=len(res.hosts),
            first_ts=res.first_ts, last_ts=res.last_ts, incidents=res.incidents, invalid=res.invalid, card=card,
            faults=truth), Path(report)))
    if getattr(args, "json", False):
        print(json.dumps(public(card), sort_keys=True, default=str))
    else:
        print(format_scorecard(card))
        if report:
            print(f"report: {card['report']}")
    return 1 if meets_quality_bar(card) else 0
