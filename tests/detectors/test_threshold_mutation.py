"""Threshold mutation: the scorecard must be able to tell a right threshold from a wrong one.

Every counter threshold of the loaded rule set (``increase_gt``, ``rate_per_hour_gt``,
``min_rate_per_hour``, a non-zero ``delta_gt``) is scaled by k and the shipped ``hard-cases`` set is
scored again. Its faults are sized against the field's own operating limits (simulator/limits.py,
not the rules) and about a quarter of them sit under 3x the limit; healthy parts run steady noise
at 0.35-0.55x the limit. So x0.3 must flag healthy hosts and x3 must miss marginal faults, while x1
passes. A rule set that still passes at x0.3 or x3 is not being measured by the scorecard.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from detectors.engine.engine import DetectorEngine
from detectors.engine.rulefile import load_rule_files
from detectors.engine.ruleset import RuleSet
from detectors.scoring.scoring import load_truth, meets_quality_bar, run_recording, score
from fleethealth.recordings import truth_path

DATA = Path(__file__).resolve().parents[2] / "replay_data"
HARD = DATA / "hard-cases-24h.jsonl.gz"
KEYS = ("increase_gt", "rate_per_hour_gt", "min_rate_per_hour", "delta_gt")


def scaled_rules(k: float) -> tuple[RuleSet, int]:
    specs = copy.deepcopy(load_rule_files())
    n = 0
    for s in specs:
        for key in KEYS:
            v = s.params.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                s.params[key] = v * k
                n += 1
    return RuleSet(specs), n


def card_at(k: float) -> dict:
    rules, n = scaled_rules(k)
    assert n >= 12, f"only {n} counter thresholds found to scale: the rule keys changed"
    res = run_recording(HARD, engine=DetectorEngine(rules=rules))
    return score(load_truth(truth_path(HARD)), res.incidents, res.hosts, host_ts=res.host_ts)


@pytest.fixture(scope="module")
def cards() -> dict[float, dict]:
    assert HARD.exists(), f"{HARD} is a shipped dataset (replay_data/build.sh makes it)"
    return {k: card_at(k) for k in (0.3, 1.0, 3.0)}


@pytest.mark.slow
def test_unscaled_rules_pass_the_hard_cases(cards):
    assert meets_quality_bar(cards[1.0]) == [], cards[1.0]["false_positive_examples"]


@pytest.mark.slow
def test_thresholds_at_a_third_flag_healthy_parts(cards):
    bad = meets_quality_bar(cards[0.3])
    assert bad, "x0.3 thresholds still pass: the benign noise is not near the limits"
    fps = {k: sum(r["false_positives"] for r in c["modes"].values()) + c["healthy_hosts_with_incidents"]
           for k, c in cards.items()}
    assert fps[0.3] > fps[1.0], fps


@pytest.mark.slow
def test_thresholds_at_three_times_miss_marginal_faults(cards):
    bad = meets_quality_bar(cards[3.0])
    assert bad, "x3 thresholds still pass: no fault sits near the limit"
    recall = {m: r["recall"] for m, r in cards[3.0]["modes"].items() if r["drain_worthy"]}
    assert min(recall.values()) < 0.95, recall
