"""A loaded, compiled set of rules: ``RuleSet.load()`` reads ``detectors/rules/*.yaml``.

``evaluate(state, sample, out)`` runs every rule of every scope on one sample;
``evaluate_snapshot(sample)`` runs them statelessly (counters as deltas from zero, window and
fleet rules skipped) for ``fleethealth diagnose``.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from detectors.codegen import MEM0, compile_ruleset
from detectors.compiled import (
    ConditionRule,
    CounterGroup,
    CounterRule,
    Evaluator,
    FlappingRule,
    KernelEventRule,
    PresenceRule,
    check_template,
)
from detectors.finding import Finding
from detectors.paths import SCOPES, iter_scope
from detectors.rulefile import RuleSpec, load_rule_files
from detectors.state import FleetBaseline, HostState
from detectors.xidrule import XidTableRule
from fleethealth.schema import Sample

_SIMPLE = {"condition": ConditionRule, "flapping": FlappingRule, "presence": PresenceRule,
           "kernel_event": KernelEventRule, "xid_table": XidTableRule}
_COUNTER = ("counter_increase", "counter_rate", "fleet_outlier")
STATELESS_SKIP = ("counter_rate", "fleet_outlier", "flapping", "staleness")


class RuleSet:
    def __init__(self, specs: list[RuleSpec], *, snapshot: bool = False) -> None:
        self.specs = specs
        self.snapshot = snapshot
        self.staleness: RuleSpec | None = None
        self.baselines: dict[str, FleetBaseline] = {}
        self.by_id: dict[str, RuleSpec] = {s.id: s for s in specs}
        slots: dict[str, int] = defaultdict(lambda: MEM0)
        evaluators: dict[str, list[Evaluator]] = defaultdict(list)
        groups: dict[tuple[str, str], list[CounterRule]] = defaultdict(list)
        dict_keys: dict[tuple[str, str], list[str] | None] = {}
        for spec in specs:
            check_template(spec)
            if spec.kind == "staleness":
                if self.staleness is not None:
                    raise spec.error("kind", f"only one staleness rule allowed (first at {self.staleness.where})")
                self.staleness = spec
                continue
            if snapshot and spec.kind in STATELESS_SKIP:
                continue
            if spec.kind in _COUNTER:
                base = None
                if spec.kind == "fleet_outlier":
                    base = self.baselines[spec.id] = FleetBaseline()
                r = CounterRule(spec, 0, base)
                key = (r.scope, r.path.group)
                groups[key].append(r)
                if r.path.is_dict_key:
                    dict_keys.setdefault(key, [])
                    ks = dict_keys[key]
                    if ks is not None and r.path.chain[-1] != "#total":
                        ks.append(r.path.chain[-1])
                    else:
                        dict_keys[key] = None  # #total reads the whole dict: compare it whole
                else:
                    dict_keys[key] = None
                continue
            ev = _SIMPLE[spec.kind](spec, 0)
            ev.slot = slots[ev.scope]
            slots[ev.scope] += ev.nslots
            evaluators[ev.scope].append(ev)
        for (scope, group), rules in groups.items():
            g = CounterGroup(scope, group, slots[scope], rules, dict_keys[(scope, group)])
            slots[scope] += 1
            for r in rules:
                r.slot = slots[scope]
                slots[scope] += r.nslots
            evaluators[scope].insert(0, g)  # counters first: Xid refinements read fresh state
        self.nslots = dict(slots)
        self.scopes: list[tuple[str, list[Evaluator], int]] = [
            (s, evaluators[s], self.nslots.get(s, MEM0)) for s in SCOPES if evaluators.get(s)
        ]
        self.evaluate = compile_ruleset(self.scopes)

    @classmethod
    def load(cls, paths: list[Path] | None = None, *, snapshot: bool = False) -> RuleSet:
        return cls(load_rule_files(paths), snapshot=snapshot)

    def evaluate_interpreted(self, st: HostState, sample: Sample, out: list[Finding]) -> None:
        """Reference path: one method call per rule per component (codegen must agree with it)."""
        slots = st.slots
        for scope, evs, n in self.scopes:
            for comp, elem, _ in iter_scope(sample, scope):
                key = (scope, comp)
                mem = slots.get(key)
                if mem is None:
                    if len(slots) >= 4096:  # bounded per host: a collector inventing components
                        continue
                    mem = slots[key] = [None] * n
                    mem[0] = comp
                for ev in evs:
                    ev.check(mem, st, comp, elem, sample, out)

    def evaluate_snapshot(self, sample: Sample) -> list[Finding]:
        st = HostState(sample.host)
        st.snapshot = True
        out: list[Finding] = []
        self.evaluate(st, sample, out)
        return out

    def reset(self) -> None:
        """Forget fleet-level memory (baselines, populations); per-host memory lives in HostState."""
        for b in self.baselines.values():
            b.rates.clear()
        for _, evs, _ in self.scopes:
            for ev in evs:
                for r in getattr(ev, "rules", [ev]):
                    if hasattr(r, "population"):
                        r.population = 0

    def modes(self) -> set[str]:
        return {s.failure_mode for s in self.specs}


def evaluate_snapshot(sample: Sample, rules: RuleSet | None = None) -> list[Finding]:
    """Stateless evaluation of one sample (for ``diagnose``): counters count from zero."""
    global _SNAPSHOT
    if rules is None:
        if _SNAPSHOT is None:
            _SNAPSHOT = RuleSet.load(snapshot=True)
        rules = _SNAPSHOT
    return rules.evaluate_snapshot(sample)


_SNAPSHOT: Any = None
