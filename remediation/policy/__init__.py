"""The remediation policy: failure mode x severity x Xid bucket x history -> actions, as data.

A policy is a YAML file (``remediation/policy/default.yaml`` is the shipped one) holding an
ordered list of rules; the first rule whose ``match`` holds decides. Loading validates every rule
and names file and line on any fault (unknown failure mode, unknown action, bad threshold, unknown
key). :meth:`Policy.decide` is pure: it takes an incident and its history and returns a Decision.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from fleethealth.errors import UserError
from fleethealth.schema import Incident
from fleethealth.taxonomy import ALL_LABELS
from fleethealth.xid import KNOWN_IMMEDIATE

ACTIONS = ("drain", "reset_gpu", "reboot", "ticket", "alert", "annotate", "none")
SEVERITIES = ("critical", "major", "minor", "info")
PRIORITIES = ("normal", "high", "rma")
BUCKETS = frozenset(b for b in KNOWN_IMMEDIATE if b) | {"UNSPECIFIED"}
MATCH_KEYS = ("failure_mode", "severity", "nvidia_bucket", "xid", "min_confidence", "history", "detector",
              "common_cause")
COMMON_CAUSE_ROLES = ("parent", "child", "none")
HISTORY_SCOPES = ("component", "host")
RULE_KEYS = ("name", "match", "actions", "ticket_priority", "reason", "urgency")
URGENCIES = ("fatal", "predictive")  # what a drain does to the node's jobs (remediation/jobs.py)
DEFAULT_POLICY = "remediation/policy/default.yaml"


class PolicyError(UserError):
    """A policy file that cannot be used; the message names file and line."""


@dataclass(frozen=True, slots=True)
class History:
    """What the store knows about earlier episodes on this component (pure input)."""

    prior_within: dict[float, int]  # window (days) -> earlier distinct incidents of this mode
    # window (days) -> earlier distinct incidents on the host, any component, any mode (lemon hosts)
    prior_on_host: dict[float, int] = field(default_factory=dict)
    common_cause: str = "none"  # parent | child (held behind an open common-cause incident) | none

    @staticmethod
    def none() -> History:
        return History({})


@dataclass(frozen=True, slots=True)
class HistoryMatch:
    min_prior: int
    within_days: float
    scope: str = "component"  # component: same mode on the same component; host: any episode on the host


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    line: int
    failure_modes: frozenset[str] | None
    severities: frozenset[str] | None
    buckets: frozenset[str] | None
    xids: frozenset[int] | None
    min_confidence: float
    history: HistoryMatch | None
    actions: tuple[str, ...]
    ticket_priority: str
    reason: str
    detectors: tuple[str, ...] | None = None  # prefixes of Incident.detector, e.g. "model:"
    common_cause: str | None = None  # parent | child | none
    urgency: str | None = None  # fatal | predictive; None: fatal when critical

    def matches(self, inc: Incident, hist: History) -> bool:
        if self.detectors is not None and not inc.detector.startswith(self.detectors):
            return False
        if self.failure_modes is not None and inc.failure_mode not in self.failure_modes:
            return False
        if self.severities is not None and inc.severity not in self.severities:
            return False
        if self.buckets is not None and (inc.nvidia_bucket or "UNSPECIFIED") not in self.buckets:
            return False
        if self.xids is not None and inc.xid not in self.xids:
            return False
        if inc.confidence < self.min_confidence:
            return False
        if self.common_cause is not None and hist.common_cause != self.common_cause:
            return False
        if self.history is not None:
            seen = hist.prior_on_host if self.history.scope == "host" else hist.prior_within
            return seen.get(self.history.within_days, 0) >= self.history.min_prior
        return True


@dataclass(frozen=True, slots=True)
class Decision:
    rule: str
    actions: tuple[str, ...]
    ticket_priority: str
    reason: str
    urgency: str | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    source: str
    rules: tuple[Rule, ...]

    @property
    def history_windows(self) -> frozenset[float]:
        return frozenset(r.history.within_days for r in self.rules if r.history and r.history.scope == "component")

    @property
    def host_history_windows(self) -> frozenset[float]:
        return frozenset(r.history.within_days for r in self.rules if r.history and r.history.scope == "host")

    def decide(self, inc: Incident, hist: History | None = None) -> Decision:
        hist = hist or History.none()
        for r in self.rules:
            if r.matches(inc, hist):
                why = r.reason or f"policy rule {r.name!r} ({self.source}:{r.line})"
                return Decision(r.name, r.actions, r.ticket_priority, why, r.urgency)
        return Decision("<none>", (), "normal", f"no rule in {self.source} matches this incident")


# --------------------------------------------------------------------------- loading


def _err(src: str, node: yaml.Node, msg: str) -> PolicyError:
    return PolicyError(f"{src}:{node.start_mark.line + 1}: {msg}")


def _mapping(src: str, node: yaml.Node, what: str) -> Iterator[tuple[str, yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise _err(src, node, f"{what} must be a mapping")
    seen: set[str] = set()
    for k, v in node.value:
        if not isinstance(k, yaml.ScalarNode):
            raise _err(src, k, f"{what}: keys must be plain names")
        if k.value in seen:
            raise _err(src, k, f"{what}: duplicate key {k.value!r}")
        seen.add(k.value)
        yield k.value, k, v


def _scalars(src: str, node: yaml.Node, what: str) -> list[tuple[Any, yaml.Node]]:
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    out: list[tuple[Any, yaml.Node]] = []
    for it in items:
        if not isinstance(it, yaml.ScalarNode):
            raise _err(src, it, f"{what}: expected a name or a list of names")
        out.append((yaml.safe_load(yaml.serialize(it)), it))
    return out


def _names(src: str, node: yaml.Node, what: str, allowed: Any) -> frozenset[str]:
    vals = []
    for v, n in _scalars(src, node, what):
        if str(v) not in allowed:
            raise _err(src, n, f"unknown {what} {v!r}; known: {', '.join(sorted(allowed))}")
        vals.append(str(v))
    return frozenset(vals)


def _number(src: str, node: yaml.Node, what: str, lo: float, hi: float, *, integer: bool = False) -> float:
    if not isinstance(node, yaml.ScalarNode):
        raise _err(src, node, f"{what} must be a number")
    v = yaml.safe_load(yaml.serialize(node))
    if isinstance(v, bool) or not isinstance(v, int | float) or (integer and not isinstance(v, int)):
        raise _err(src, node, f"{what} must be {'an integer' if integer else 'a number'}, not {node.value!r}")
    if not lo <= v <= hi:
        raise _err(src, node, f"bad threshold: {what} = {v} is outside [{lo}, {hi}]")
    return float(v)


def _rule(src: str, node: yaml.Node, index: int) -> Rule:
    fields: dict[str, Any] = {"name": f"rule-{index + 1}", "failure_modes": None, "severities": None,
                              "buckets": None, "xids": None, "min_confidence": 0.0, "history": None,
                              "ticket_priority": "normal", "reason": ""}
    actions: tuple[str, ...] | None = None
    for key, knode, v in _mapping(src, node, f"rule {index + 1}"):
        if key == "name" or key == "reason":
            fields[key] = str(yaml.safe_load(yaml.serialize(v)))
        elif key == "ticket_priority":
            fields[key] = next(iter(_names(src, v, "ticket priority", PRIORITIES)))
        elif key == "urgency":
            fields[key] = next(iter(_names(src, v, "urgency", URGENCIES)))
        elif key == "actions":
            actions = tuple(str(a) for a, _ in _scalars(src, v, "action"))
            for a, n in _scalars(src, v, "action"):
                if a not in ACTIONS:
                    raise _err(src, n, f"unknown action {a!r}; known: {', '.join(ACTIONS)}")
        elif key == "match":
            for mk, mknode, mv in _mapping(src, v, "match"):
                if mk == "failure_mode":
                    fields["failure_modes"] = _names(src, mv, "failure mode", ALL_LABELS)
                elif mk == "severity":
                    fields["severities"] = _names(src, mv, "severity", SEVERITIES)
                elif mk == "nvidia_bucket":
                    fields["buckets"] = _names(src, mv, "NVIDIA Xid bucket", BUCKETS)
                elif mk == "xid":
                    fields["xids"] = frozenset(int(_number(src, n, "xid", 0, 1_000_000, integer=True))
                                               for _, n in _scalars(src, mv, "xid"))
                elif mk == "min_confidence":
                    fields["min_confidence"] = _number(src, mv, "min_confidence", 0.0, 1.0)
                elif mk == "detector":
                    prefixes = tuple(str(d) for d, _ in _scalars(src, mv, "detector prefix"))
                    if not prefixes or any(not d for d in prefixes):
                        raise _err(src, mv, "detector needs one or more non-empty prefixes, e.g. 'model:'")
                    fields["detectors"] = prefixes
                elif mk == "history":
                    h = {k: n for k, _, n in _mapping(src, mv, "history")}
                    unknown = set(h) - {"min_prior", "within_days", "scope"}
                    if unknown or "min_prior" not in h or "within_days" not in h:
                        raise _err(src, mv, "history needs min_prior (int >= 1) and within_days (> 0), "
                                            "and optionally scope (component | host)")
                    scope = next(iter(_names(src, h["scope"], "history scope", HISTORY_SCOPES))) \
                        if "scope" in h else "component"
                    fields["history"] = HistoryMatch(
                        int(_number(src, h["min_prior"], "history.min_prior", 1, 1_000_000, integer=True)),
                        _number(src, h["within_days"], "history.within_days", 1e-6, 3650), scope)
                elif mk == "common_cause":
                    fields["common_cause"] = next(iter(_names(src, mv, "common_cause role", COMMON_CAUSE_ROLES)))
                else:
                    raise _err(src, mknode, f"unknown match key {mk!r}; known: {', '.join(MATCH_KEYS)}")
        else:
            raise _err(src, knode, f"unknown rule key {key!r}; known: {', '.join(RULE_KEYS)}")
    if actions is None:
        raise _err(src, node, f"rule {fields['name']!r} has no actions (use [none] to do nothing)")
    if "none" in actions and len(actions) > 1:
        raise _err(src, node, f"rule {fields['name']!r}: 'none' cannot be combined with other actions")
    return Rule(line=node.start_mark.line + 1, actions=actions, **fields)


def parse_policy(text: str, source: str) -> Policy:
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise PolicyError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if root is None:
        raise PolicyError(f"{source}: empty policy file")
    rules_node = None
    for key, knode, v in _mapping(source, root, "policy"):
        if key == "version":
            if _number(source, v, "version", 1, 1, integer=True) != 1:
                raise _err(source, v, "unsupported policy version")
        elif key == "rules":
            rules_node = v
        else:
            raise _err(source, knode, f"unknown top-level key {key!r}; known: version, rules")
    if not isinstance(rules_node, yaml.SequenceNode) or not rules_node.value:
        raise PolicyError(f"{source}: 'rules' must be a non-empty list")
    rules = tuple(_rule(source, n, i) for i, n in enumerate(rules_node.value))
    names = [r.name for r in rules]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise PolicyError(f"{source}: duplicate rule name(s) {', '.join(sorted(dupes))}")
    return Policy(source, rules)


def load_policy(path: str | Path | None = None) -> Policy:
    if path is None:
        text = resources.files("remediation.policy").joinpath("default.yaml").read_text()
        return parse_policy(text, DEFAULT_POLICY)
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise PolicyError(f"{p}: cannot read policy file: {exc.strerror or exc}") from None
    return parse_policy(text, str(p))
