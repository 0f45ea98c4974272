"""A loaded, compiled set of rules: ``RuleSet.load()`` reads ``detectors/engine/rules/*.yaml``.

``evaluate(state, sample, out)`` runs every rule of every scope on one sample;
``evaluate_snapshot(sample)`` runs them statelessly (counters as deltas from zero, window and
fleet rules skipped) for ``fleethealth diagnose``.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from detectors.engine.codegen import MEM0, compile_ruleset, read_every_sample, semi_gated
from detectors.engine.compiled import (
    ConditionRule,
    CounterGroup,
    CounterRule,
    Evaluator,
    FactRule,
    FlappingRule,
    KernelEventRule,
    KernelRecordRule,
    PresenceRule,
    check_template,
)
from detectors.engine.finding import Finding
from detectors.engine.paths import SCOPES, iter_scope
from detectors.engine.rulefile import RuleSpec, load_rule_files
from detectors.engine.state import FleetBaseline, HostState
from detectors.engine.xidrule import XidTableRule
from fleethealth.schema import Sample

_SIMPLE = {"condition": ConditionRule, "flapping": FlappingRule, "presence": PresenceRule,
           "kernel_event": KernelEventRule, "xid_table": XidTableRule, "fact": FactRule,
           "kernel_record": KernelRecordRule}
_COUNTER = ("counter_increase", "counter_rate", "fleet_outlier")
STATELESS_SKIP = ("counter_rate", "fleet_outlier", "flapping", "staleness")


def snapshot_view(spec: RuleSpec) -> RuleSpec | None:
    """The rule as ``diagnose`` applies it to one capture, or None when a capture cannot show it.

    A capture is one look: persistence (``for_samples``) is one sample unless the rule's
    ``snapshot:`` says otherwise; a rate or fleet rule is judged on the lifetime value against its
    ``snapshot: lifetime_gt`` (no such key: not judged); flapping and staleness need a stream."""
    if spec.snapshot is None or spec.kind in ("flapping", "staleness"):
        return None
    ov = dict(spec.snapshot)
    conf = float(ov.pop("confidence", spec.confidence))
    lifetime = ov.pop("lifetime_gt", None)
    params = dict(spec.params)
    kind, evidence = spec.kind, spec.evidence
    if kind in ("counter_rate", "fleet_outlier"):
        if lifetime is None:
            return None
        kind = "counter_increase"
        params = {"path": spec.params["path"], "delta_gt": lifetime}
        if "when" in spec.params:
            params["when"] = spec.params["when"]
        evidence = f"{spec.params['path']} = {{value}} since the counter last reset (lifetime limit {lifetime})"
    elif kind in ("condition", "presence"):
        params["for_samples"] = 1
    params.update(ov)
    return RuleSpec(spec.id, kind, spec.failure_mode, spec.severity, conf, evidence, params, spec.where,
                    spec.lines, spec.quiet_s, spec.description, spec.component, spec.snapshot, spec.stream,
                    spec.fold)


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
            if snapshot:
                view = snapshot_view(spec)
                if view is None:
                    continue
                spec = view
            elif spec.kind == "fact" or not spec.stream:
                continue  # capture-only evidence: a stream carries no facts
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
            evaluators[ev.scope].append(ev)
        for (scope, group), rules in groups.items():
            g = CounterGroup(scope, group, 0, rules, dict_keys[(scope, group)])
            evaluators[scope].insert(0, g)  # counters first: Xid refinements read fresh state
        # slots of the rules a quiet sample reads first: a component's memory touches fewer cache lines
        for scope, evs in evaluators.items():
            for hot in (True, False):
                for ev in evs:
                    if read_every_sample(ev) != hot:
                        continue
                    ev.slot = slots[scope]
                    if not isinstance(ev, CounterGroup):
                        slots[scope] += ev.nslots + semi_gated(ev)  # (+1: codegen's "expression held")
                        continue
                    slots[scope] += 1
                    for r in ev.rules:
                        r.slot = slots[scope]
                        slots[scope] += r.nslots
        self.nslots = dict(slots)
        self.scopes: list[tuple[str, list[Evaluator], int]] = [
            (s, evaluators[s], self.nslots.get(s, MEM0)) for s in SCOPES if evaluators.get(s)
        ]
        # rules whose finding on every GPU of a host at once is one host-level fault (the PSU's
        # power brake on all eight GPUs is one event, not eight GPU faults): ``fold: all_gpus``
        self.fold_all = frozenset(s.id for s in specs if s.fold == "all_gpus")
        # the generated evaluator folds them itself (no wrapper call per sample)
        self.generated = compile_ruleset(self.scopes, (_fold_all_gpus, self.fold_all) if self.fold_all else None)
        self.evaluate = self.generated

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
        if self.fold_all:
            _fold_all_gpus(sample, out, 0, self.fold_all)

    def evaluate_snapshot(self, sample: Sample, facts: list[Any] | None = None) -> list[Finding]:
        """One capture, statelessly: counters count from zero; ``facts`` (parsed observations the
        contract has no field for) feed the ``fact`` rules."""
        st = HostState(sample.host)
        st.snapshot = True
        st.facts = list(facts or [])
        out: list[Finding] = []
        self.evaluate(st, sample, out)
        return out

    def reset(self) -> None:
        """Forget fleet-level memory (baselines, populations); per-host memory lives in HostState."""
        for b in self.baselines.values():
            b.clear()

    def advance_baselines(self, ts: float) -> float:
        """A live sample at ``ts`` is next: refresh the fleet baselines whose epoch it starts
        (:class:`FleetBaseline`). Returns the ts before which the next call is a no-op."""
        due = float("inf")
        for b in self.baselines.values():
            b.advance(ts)
            due = min(due, b.due())
        return due

    def modes(self) -> set[str]:
        return {s.failure_mode for s in self.specs}


def _fold_all_gpus(sample: Sample, out: list[Finding], start: int, rule_ids: frozenset[str]) -> None:
    """A ``fold: all_gpus`` rule that fired on every present GPU (two or more) in this sample: one
    finding on the host instead, naming the GPUs in its evidence."""
    gpus = sum(1 for g in sample.gpus if g.present)
    if gpus < 2:
        return
    for rid in rule_ids:
        mine = [f for f in out[start:] if f.detector == rid]
        if len({f.component for f in mine}) < gpus:
            continue
        first = mine[0]
        first.evidence[0].fact += f" (on all {gpus} GPUs: one host-level cause)"
        first.component = "host"
        out[start:] = [f for f in out[start:] if f.detector != rid or f is first]


def evaluate_snapshot(sample: Sample, rules: RuleSet | None = None, facts: list[Any] | None = None) -> list[Finding]:
    """Stateless evaluation of one sample (for ``diagnose``): counters count from zero."""
    global _SNAPSHOT
    if rules is None:
        if _SNAPSHOT is None:
            _SNAPSHOT = RuleSet.load(snapshot=True)
        rules = _SNAPSHOT
    return rules.evaluate_snapshot(sample, facts)


_SNAPSHOT: Any = None
