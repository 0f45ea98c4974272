"""``diagnose``'s decision core: the one rule set, in snapshot mode, over one parsed capture.

:func:`evaluate` turns the capture into the contract (:mod:`detectors.diagnose.contract`, no
decisions), runs :class:`detectors.engine.ruleset.RuleSet` with ``snapshot=True`` (lifetime counters
against the rules' ``snapshot:`` thresholds; windows where the capture carries timestamps) and
combines the findings with the streaming engine's own precedence (``detectors/engine/precedence.yaml``):
a finding another one supersedes is folded into it, then one finding per (component, mode).
Several faults in one capture stay several findings.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from detectors.diagnose.contract import component_names, to_contract
from detectors.engine.engine import Precedence
from detectors.engine.finding import Finding
from detectors.engine.ruleset import RuleSet
from parsers.base import Parsed


@cache
def snapshot_rules() -> RuleSet:
    return RuleSet.load(snapshot=True)


def load_snapshot_rules(path: str | Path | None) -> RuleSet:
    """The shipped rules, or the ``*.yaml`` rule files of a folder / one rule file."""
    if not path:
        return snapshot_rules()
    p = Path(path)
    return RuleSet.load(sorted(p.glob("*.yaml")) if p.is_dir() else [p], snapshot=True)


@cache
def _precedence() -> Precedence:
    return Precedence.load()


def combine(found: list[Finding], prec: Precedence | None = None) -> list[Finding]:
    """Fold superseded findings (``supersedes``), cut never-drain actions, one per (component, mode)."""
    prec = prec or _precedence()
    modes_host = {f.failure_mode for f in found}
    modes_comp = {(f.component, f.failure_mode) for f in found}
    keep: list[Finding] = []
    for f in found:
        if any(f.failure_mode in over and key != f.failure_mode
               and (key in modes_host if scope == "host" else (f.component, key) in modes_comp)
               for key, (scope, over) in prec.supersedes.items()):
            continue
        if f.failure_mode in prec.never_drain:
            f.recommended_action = list(prec.never_drain[f.failure_mode])
        keep.append(f)
    best: dict[tuple[str, str], Finding] = {}
    for f in sorted(keep, key=lambda f: -f.confidence):
        k = (f.component, f.failure_mode)
        b = best.get(k)
        if b is None:
            best[k] = f
            continue
        # the same fault seen twice (a counter and its Xid): one finding, both facts, the Xid named
        if b.xid is None and f.xid is not None:
            b.xid, b.nvidia_bucket = f.xid, f.nvidia_bucket
        if len(b.evidence) < 8:
            b.evidence.extend(f.evidence[:1])
    return list(best.values())


def evaluate(p: Parsed, host: str | None = None, rules: RuleSet | None = None) -> list[Finding]:
    """Every rule over one parsed capture (pure)."""
    sample, facts = to_contract(p, host)
    found = combine((rules or snapshot_rules()).evaluate_snapshot(sample, facts))
    names = component_names(p)
    for f in found:
        f.component = names.get(f.component, f.component)
    return found
