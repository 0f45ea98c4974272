"""What the ML detectors add over the rules, on a labelled recording: the ML value report.

    .venv/bin/python scripts/ml_value.py RECORDING [--models DIR]

For every ground-truth fault: the first rule incident and the first finding of each model on the
fault's component, from its onset (less 5 minutes of clock slack) to 15 minutes after its end; for
a fault that may have a precursor (a corrected-error ramp before a UCE or a row-remap failure:
``fleethealth.taxonomy.PRECURSORS``) from that many hours before its onset — that ramp is the
warning we want. A finding outside every such span is "on no faulty component". Prints the rules' incidents and,
per model, its findings that fall on no faulty component (and their share: one minus precision by
finding), then per failure mode: faults found, faults only the model found, faults it found
earlier than the rules and the lead (median and range). docs/detectors.md ("What the models add") quotes its figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

SLACK_S = 300.0
WINDOW_AFTER_S = 900.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recording", type=Path)
    ap.add_argument("--models", type=Path, default=None, help="model folder (default: the shipped models)")
    args = ap.parse_args(argv)

    from detectors.engine.engine import DetectorEngine
    from detectors.ml import load_ml_detectors
    from detectors.scoring.scoring import _same_component, load_truth
    from fleethealth.bus import iter_jsonl
    from fleethealth.recordings import truth_path
    from fleethealth.schema import decode_sample
    from fleethealth.taxonomy import PRECURSORS

    models = load_ml_detectors(args.models)
    if not models:
        print("no models found", file=sys.stderr)
        return 2
    engine = DetectorEngine()
    incidents: list = []
    found: dict[str, list] = {str(m.name): [] for m in models}
    for _, raw in iter_jsonl(args.recording):
        s = decode_sample(raw)
        incidents += engine.feed(s)
        for m in models:
            found[str(m.name)] += m.feed(s)
    for m in models:
        found[str(m.name)] += m.flush()
    truth = load_truth(truth_path(args.recording))

    def near(host: str, comp: str, ts: float, t) -> bool:  # type: ignore[no-untyped-def]
        return (host == t.host and _same_component(comp, t.component)
                and t.onset - (PRECURSORS[t.mode].ramp_s if t.mode in PRECURSORS else SLACK_S) <= ts <= t.end + WINDOW_AFTER_S)

    def first(ts_items: list[tuple[str, str, float]], t) -> float | None:  # type: ignore[no-untyped-def]
        hits = [ts for h, c, ts in ts_items if near(h, c, ts, t)]
        return min(hits) if hits else None

    rule_ts = [(i.host, i.component, i.first_seen) for i in incidents]
    rules_first = {t.id: first(rule_ts, t) for t in truth}
    rules_off = sum(1 for h, c, ts in rule_ts if not any(near(h, c, ts, t) for t in truth))
    print(f"{args.recording.name}: {len(truth)} faults; the rules find {sum(v is not None for v in rules_first.values())}"
          f" with {len(rule_ts)} incidents, {rules_off} on no faulty component{_share(rules_off, len(rule_ts))}")
    for name, items in found.items():
        its = [(f.host, f.component, f.ts) for f in items]
        off = sum(1 for h, c, ts in its if not any(near(h, c, ts, t) for t in truth))
        print(f"{name}: {len(items)} findings, {off} on no faulty component{_share(off, len(items))}")
        for mode in sorted({t.mode for t in truth}):
            faults = [t for t in truth if t.mode == mode]
            mine = {t.id: first(its, t) for t in faults}
            hit = [t for t in faults if mine[t.id] is not None]
            only = [t for t in hit if rules_first[t.id] is None]
            leads = [rules_first[t.id] - mine[t.id] for t in hit if rules_first[t.id] is not None
                     and mine[t.id] < rules_first[t.id]]  # type: ignore[operator]
            lead = (f", lead median {statistics.median(leads):.0f} s ({min(leads):.0f}-{max(leads):.0f} s)"
                    if leads else "")
            print(f"  {mode}: {len(faults)} faults, model found {len(hit)}, only the model {len(only)}, "
                  f"earlier than the rules {len(leads)}{lead}")
    return 0


def _share(part: int, whole: int) -> str:
    return f" ({100.0 * part / whole:.1f} %)" if whole else ""


if __name__ == "__main__":
    sys.exit(main())
