"""Load and validate ``detectors/diagnose_rules.yaml``: every error names file and line."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from fleethealth.errors import UserError

# the schema: section -> key -> expected type (list/dict of str->int are checked item by item)
SCHEMA: dict[str, dict[str, Any]] = {
    "pcie": {"busy_pstates": [str], "width_confidence": float, "gen_confidence": float, "replay_min": int,
             "aer_dll_corrected_min": int, "aer_benign_nonfatal": [str], "sticky_uncorrectable_bits": [str],
             "sticky_confidence": float},
    "gpu": {"thermal_margin_c": float, "nvlink_replay_min": int, "nvlink_recovery_min": int},
    "net": {"cable_thresholds": {str: int}, "counter_bits": {str: int}, "down_phys_states": [str],
            "speed_below_fabric_confidence": float},
    "host_dram": {"ce_counter_min": int, "ce_log_min": int},
}


class RulesError(UserError):
    """The diagnose rules file is malformed; the message names file and line."""


@dataclass(frozen=True)
class DiagnoseRules:
    pcie: dict[str, Any]
    gpu: dict[str, Any]
    net: dict[str, Any]
    host_dram: dict[str, Any]


def _check(node: yaml.Node, want: Any, where: str, name: str) -> Any:
    line = node.start_mark.line + 1
    if isinstance(want, list):
        if not isinstance(node, yaml.SequenceNode):
            raise RulesError(f"{where}:{line}: {name} must be a list")
        return [_check(n, want[0], where, f"{name}[]") for n in node.value]
    if isinstance(want, dict):
        if not isinstance(node, yaml.MappingNode):
            raise RulesError(f"{where}:{line}: {name} must be a mapping")
        return {_check(k, str, where, f"{name} key"): _check(v, int, where, f"{name}.{k.value}") for k, v in node.value}
    if not isinstance(node, yaml.ScalarNode):
        raise RulesError(f"{where}:{line}: {name} must be a {want.__name__}")
    try:
        value = yaml.safe_load(node.value) if node.tag != "tag:yaml.org,2002:str" else node.value
    except yaml.YAMLError:
        value = node.value
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if want is str:
        value = str(node.value)
    if not isinstance(value, want) or isinstance(value, bool):
        raise RulesError(f"{where}:{line}: {name} must be a {want.__name__}, got {node.value!r}")
    if isinstance(value, int | float) and value < 0:
        raise RulesError(f"{where}:{line}: {name} must not be negative")
    if name.endswith("confidence") and not 0.0 <= value <= 1.0:
        raise RulesError(f"{where}:{line}: {name} must be within 0..1")
    return value


def parse_rules(text: str, where: str) -> DiagnoseRules:
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise RulesError(f"{where}{line}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(root, yaml.MappingNode):
        raise RulesError(f"{where}:1: the top level must be a mapping of sections")
    out: dict[str, dict[str, Any]] = {}
    for knode, vnode in root.value:
        section = knode.value
        if section not in SCHEMA:
            raise RulesError(f"{where}:{knode.start_mark.line + 1}: unknown section {section!r}; "
                             f"known: {', '.join(SCHEMA)}")
        if not isinstance(vnode, yaml.MappingNode):
            raise RulesError(f"{where}:{vnode.start_mark.line + 1}: section {section!r} must be a mapping")
        vals: dict[str, Any] = {}
        for k, v in vnode.value:
            if k.value not in SCHEMA[section]:
                raise RulesError(f"{where}:{k.start_mark.line + 1}: unknown key {section}.{k.value}")
            vals[k.value] = _check(v, SCHEMA[section][k.value], where, f"{section}.{k.value}")
        missing = set(SCHEMA[section]) - set(vals)
        if missing:
            raise RulesError(f"{where}:{knode.start_mark.line + 1}: section {section!r} lacks {', '.join(sorted(missing))}")
        out[section] = vals
    missing_sections = set(SCHEMA) - set(out)
    if missing_sections:
        raise RulesError(f"{where}: missing sections {', '.join(sorted(missing_sections))}")
    return DiagnoseRules(**out)


def load_rules(path: Path | None = None) -> DiagnoseRules:
    if path is None:
        return default_rules()
    return parse_rules(path.read_text(), str(path))


@cache
def default_rules() -> DiagnoseRules:
    text = resources.files("detectors").joinpath("diagnose_rules.yaml").read_text()
    return parse_rules(text, "detectors/diagnose_rules.yaml")
