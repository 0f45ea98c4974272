"""Rule files: YAML under ``detectors/engine/rules/``, read and validated with file and line in every error.

A file holds ``rules:``, a list of mappings. Every rule has ``id``, ``kind``, ``failure_mode``,
``evidence`` and optionally ``severity`` (default: the mode's), ``confidence`` (default 0.9),
``quiet_s`` (how long without a finding before the episode resolves) and ``description``.
The kind decides the other keys (see ``KINDS`` and docs/detectors.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleethealth import taxonomy
from fleethealth.datacache import cached
from fleethealth.errors import UserError
from fleethealth.taxonomy import FAULT_LABELS, MODES, Severity, parse_mode

if TYPE_CHECKING:
    import yaml


class RuleError(UserError):
    """A rule file that does not load; the message starts with ``file:line:``."""


NUM = (int, float)
# kind -> {key: (accepted types, required)}
KINDS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "counter_increase": {"path": ((str,), True), "delta_gt": (NUM, False), "first_sample": ((str,), False),
                         "when": ((str,), False)},
    "counter_rate": {"path": ((str,), True), "window_s": (NUM, True), "increase_gt": (NUM, False),
                     "rate_per_hour_gt": (NUM, False), "when": ((str,), False)},
    "condition": {"expr": ((str,), True), "for_samples": ((int,), False), "when": ((str,), False),
                  "unless": ((str,), False),
                  "edge": ((bool,), False)},
    "flapping": {"path": ((str,), True), "window_s": (NUM, True), "changes_gt": ((int,), True)},
    "presence": {"check": ((str,), True), "values": ((list,), False), "for_samples": ((int,), False)},
    "kernel_event": {"event_kind": ((str,), False), "xid_in": ((list,), False), "match": ((str,), False),
                     "severity_in": ((list,), False), "not_match": ((str,), False), "count_gt": ((int,), False),
                     "window_s": (NUM, False), "benign_details": ((list,), False),
                     "cleared_by": ((str,), False), "unless": ((str,), False), "at_most": ((int,), False),
                     "after": ((str,), False)},
    # kernel MCE / EDAC records decoded from the sample's kernel events (both paths)
    "kernel_record": {"fact": ((str,), True), "attrs": ((dict,), False), "count_gt": ((int,), False),
                      "window_s": (NUM, False), "repeats": ((str,), False), "match": ((str,), False)},
    # capture-only evidence (diagnose): a parsed Fact of one kind, its attributes, an optional test
    "fact": {"fact": ((str,), True), "attrs": ((dict,), False), "test": ((str,), False),
             "match": ((str,), False), "below_common": ((str,), False), "min_facts": ((int,), False),
             "count_gt": ((int,), False), "unless": ((str,), False)},
    "xid_table": {"overrides": ((dict,), False), "cooccur_s": (NUM, False)},
    "fleet_outlier": {"path": ((str,), True), "window_s": (NUM, True), "percentile": (NUM, False),
                      "factor": (NUM, True), "min_rate_per_hour": (NUM, True)},
    "staleness": {"intervals": (NUM, True), "min_s": (NUM, False)},
}
COMMON = {"id", "kind", "failure_mode", "severity", "confidence", "evidence", "quiet_s", "description",
          "component", "snapshot", "stream", "fold"}
# ``snapshot:`` (how diagnose reads the rule on one capture): ``false`` (not judged on a capture), or
# a mapping of this kind's keys to use instead, plus ``lifetime_gt`` (a window/rate rule judged on
# the lifetime value a capture shows) and ``confidence``.
SNAPSHOT_KEYS = {"lifetime_gt", "confidence", "for_samples", "count_gt"}
COMPONENT_NAMING = ("default", "pci")  # pci: a GPU-scope rule names the GPU's PCI address
PRESENCE_CHECKS = ("gpu_count_below_expected", "not_present", "nvml_error", "nvml_unresponsive")
_ID = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
# keys whose value is a regular expression: checked here, compiled by the engine on first use
REGEX_KEYS = ("match", "not_match", "cleared_by", "unless", "after", "repeats")


@dataclass(slots=True)
class RuleSpec:
    id: str
    kind: str
    failure_mode: str
    severity: str
    confidence: float
    evidence: str
    params: dict[str, Any]
    where: str  # "file:line" of the rule
    lines: dict[str, str] = field(default_factory=dict)  # key -> "file:line"
    quiet_s: float | None = None
    description: str = ""
    component: str = "default"
    snapshot: dict[str, Any] | None = field(default_factory=dict)  # None: skipped in snapshot mode
    stream: bool = True  # false: a capture-only rule (lifetime counters the collector does not read)
    fold: str = ""  # "all_gpus": fired on every GPU of a host at once = one host finding

    def error(self, key: str | None, msg: str) -> RuleError:
        return RuleError(f"{self.lines.get(key or '', self.where)}: rule {self.id!r}: {msg}")


def _construct(node: yaml.Node) -> Any:
    import yaml

    return yaml.constructor.SafeConstructor().construct_object(node, deep=True)  # no reader needed


def parse_rules(text: str, name: str) -> list[RuleSpec]:
    """Parse one rule file's text; ``name`` is used in error messages."""
    import yaml  # here: a start-up that finds the rules in fleethealth.datacache never imports PyYAML

    # libyaml's parser when PyYAML was built with it (same nodes and marks, ~10x faster start-up)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        root = yaml.compose(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise RuleError(f"{name}{line}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if root is None:
        raise RuleError(f"{name}:1: empty rule file (expected a mapping with 'rules:')")
    if not isinstance(root, yaml.MappingNode):
        raise RuleError(f"{name}:{root.start_mark.line + 1}: expected a mapping with 'rules:'")
    rules_node = None
    for k, v in root.value:
        key = _construct(k)
        if key == "rules":
            rules_node = v
        elif key != "version":
            raise RuleError(f"{name}:{k.start_mark.line + 1}: unknown top-level key {key!r} (expected rules, version)")
    if not isinstance(rules_node, yaml.SequenceNode):
        at = rules_node.start_mark.line + 1 if rules_node is not None else 1
        raise RuleError(f"{name}:{at}: 'rules' must be a list of rules")
    return [_parse_rule(n, name) for n in rules_node.value]


def _parse_rule(node: yaml.Node, name: str) -> RuleSpec:
    import yaml

    at = f"{name}:{node.start_mark.line + 1}"
    if not isinstance(node, yaml.MappingNode):
        raise RuleError(f"{at}: a rule must be a mapping")
    raw: dict[str, Any] = {}
    lines: dict[str, str] = {}
    for k, v in node.value:
        key = _construct(k)
        if key in raw:
            raise RuleError(f"{name}:{k.start_mark.line + 1}: key {key!r} given twice")
        raw[key] = _construct(v)
        lines[key] = f"{name}:{v.start_mark.line + 1}"
    rid = raw.get("id")
    if not isinstance(rid, str) or not _ID.match(rid):
        raise RuleError(f"{lines.get('id', at)}: rule needs an 'id' of lower-case letters, digits, . _ -")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise RuleError(f"{lines.get('kind', at)}: rule {rid!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
    mode = raw.get("failure_mode")
    if mode not in FAULT_LABELS:
        raise RuleError(f"{lines.get('failure_mode', at)}: rule {rid!r}: failure_mode {mode!r} is not in the "
                        f"vocabulary ({', '.join(FAULT_LABELS)})")
    sev = raw.get("severity", MODES[parse_mode(mode)].severity.value)
    if sev not in {s.value for s in Severity}:
        raise RuleError(f"{lines.get('severity', at)}: rule {rid!r}: severity {sev!r} is not critical|major|minor|info")
    conf = raw.get("confidence", 0.9)
    if not isinstance(conf, NUM) or isinstance(conf, bool) or not 0.0 <= conf <= 1.0:
        raise RuleError(f"{lines.get('confidence', at)}: rule {rid!r}: confidence must be a number in [0, 1]")
    ev = raw.get("evidence")
    if not isinstance(ev, str) or not ev.strip():
        raise RuleError(f"{lines.get('evidence', at)}: rule {rid!r}: 'evidence' template is required")
    naming = raw.get("component", "default")
    if naming not in COMPONENT_NAMING:
        raise RuleError(f"{lines.get('component', at)}: rule {rid!r}: component must be one of "
                        f"{', '.join(COMPONENT_NAMING)}")
    quiet = raw.get("quiet_s")
    if quiet is not None and (not isinstance(quiet, NUM) or quiet <= 0):
        raise RuleError(f"{lines.get('quiet_s', at)}: rule {rid!r}: quiet_s must be a positive number")
    snap = raw.get("snapshot", {})
    if snap is False:
        snap = None
    elif not isinstance(snap, dict) or not set(snap) <= SNAPSHOT_KEYS | set(KINDS[kind]):
        raise RuleError(f"{lines.get('snapshot', at)}: rule {rid!r}: snapshot must be false or a mapping of "
                        f"{', '.join(sorted(SNAPSHOT_KEYS))} or this kind's keys")
    schema = KINDS[kind]
    params: dict[str, Any] = {}
    for key, val in raw.items():
        if key in COMMON:
            continue
        if key not in schema:
            raise RuleError(f"{lines[key]}: rule {rid!r}: unknown key {key!r} for kind {kind} "
                            f"(allowed: {', '.join(sorted(schema))})")
        types, _ = schema[key]
        if not isinstance(val, types) or (isinstance(val, bool) and bool not in types):
            raise RuleError(f"{lines[key]}: rule {rid!r}: {key} must be {' or '.join(t.__name__ for t in types)}")
        params[key] = val
    for key, (_, required) in schema.items():
        if required and key not in params:
            raise RuleError(f"{at}: rule {rid!r}: kind {kind} needs '{key}'")
    for values in (params, snap or {}):
        for key in REGEX_KEYS:
            if isinstance(values.get(key), str) and values[key]:
                try:
                    re.compile(values[key])
                except re.error as exc:
                    raise RuleError(f"{lines.get(key, at)}: rule {rid!r}: bad regex: {exc}") from None
    return RuleSpec(rid, kind, mode, sev, float(conf), ev, params, at, lines,
                    float(quiet) if quiet is not None else None, str(raw.get("description", "")), naming, snap,
                    raw.get("stream", kind != "fact") is not False, _fold(raw, lines, at, rid))


def _fold(raw: dict[str, Any], lines: dict[str, str], at: str, rid: str) -> str:
    fold = raw.get("fold", "")
    if fold not in ("", "all_gpus"):
        raise RuleError(f"{lines.get('fold', at)}: rule {rid!r}: fold must be all_gpus")
    return str(fold)


def rules_dir() -> Path:
    return Path(__file__).with_name("rules")


def load_rule_files(paths: list[Path] | None = None) -> list[RuleSpec]:
    """Read every ``*.yaml`` (default: the shipped ``detectors/engine/rules/``); ids must be unique.
    What a set of files gave is kept in :mod:`fleethealth.datacache` (keyed by the files and by this
    module's and the vocabulary's source), so a start-up that finds it does not parse YAML."""
    files = [Path(p) for p in (sorted(rules_dir().glob("*.yaml")) if paths is None else paths)]
    return cached("rules", [*files, Path(__file__), Path(taxonomy.__file__)], lambda: _read_rule_files(files))


def _read_rule_files(paths: list[Path]) -> list[RuleSpec]:
    specs: list[RuleSpec] = []
    seen: dict[str, str] = {}
    for p in paths:
        try:
            text = Path(p).read_text(encoding="utf-8")
        except OSError as exc:
            raise RuleError(f"{p}: cannot read rule file: {exc.strerror or exc}") from None
        for s in parse_rules(text, str(p)):
            if s.id in seen:
                raise RuleError(f"{s.where}: rule id {s.id!r} already defined at {seen[s.id]}")
            seen[s.id] = s.where
            specs.append(s)
    if not specs:
        raise RuleError(f"{rules_dir()}: no rules found")
    return specs
