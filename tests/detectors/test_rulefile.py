"""Rule files load, cover the vocabulary, and fail with file:line on every kind of mistake."""

from __future__ import annotations

import pytest

from detectors.engine.rulefile import RuleError, load_rule_files, parse_rules
from detectors.engine.ruleset import RuleSet
from fleethealth.taxonomy import FAULT_LABELS
from fleethealth.xid import xid_table

GOOD = """\
rules:
  - id: t.one
    kind: counter_increase
    failure_mode: gpu_dram_uce
    path: gpus[*].ecc.dram_uncorrected_volatile
    evidence: "rose by {delta}"
"""


def test_shipped_rules_load_and_every_label_has_a_rule():
    rules = RuleSet.load()
    raised = {s.failure_mode for s in rules.specs if s.kind != "xid_table"}
    for s in rules.specs:
        if s.kind == "xid_table":
            raised |= {x.failure_mode for x in xid_table().values() if x.failure_mode}
            raised |= {v for v in s.params.get("overrides", {}).values() if v}
    missing = set(FAULT_LABELS) - raised
    assert not missing, f"labels without a rule: {sorted(missing)}"


def test_rule_ids_unique_across_files(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(GOOD)
    b.write_text(GOOD)
    with pytest.raises(RuleError, match=r"b\.yaml:2: rule id 't\.one' already defined at .*a\.yaml:2"):
        load_rule_files([a, b])


@pytest.mark.parametrize(("text", "where", "what"), [
    ("rules: [\n  {id: x\n", ":3", "not valid YAML"),
    ("- a\n", ":1", "expected a mapping"),
    ("rule:\n  - {}\n", ":1", "unknown top-level key"),
    (GOOD.replace("kind: counter_increase", "kind: magic"), ":3", "kind 'magic'"),
    (GOOD.replace("gpu_dram_uce", "gpu_on_fire"), ":4", "not in the vocabulary"),
    (GOOD.replace("dram_uncorrected_volatile", "dram_uncorected"), ":5", "no field 'dram_uncorected'"),
    (GOOD + "    delta_gt: lots\n", ":7", "delta_gt must be"),
    (GOOD + "    window_s: 60\n", ":7", "unknown key 'window_s'"),
    (GOOD.replace('"rose by {delta}"', '"rose by {oops}"'), ":6", "unknown template field"),
    (GOOD.replace("    path: gpus[*].ecc.dram_uncorrected_volatile\n", ""), ":2", "needs 'path'"),
    (GOOD.replace("    evidence: \"rose by {delta}\"\n", ""), ":2", "'evidence' template is required"),
])
def test_errors_name_file_and_line(tmp_path, text, where, what):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(RuleError) as ei:
        RuleSet.load([p])
    msg = str(ei.value)
    assert msg.startswith(f"{p}{where}"), msg
    assert what in msg


def test_bad_expression_is_reported_at_its_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("rules:\n  - id: c\n    kind: condition\n    failure_mode: net_link_down\n"
                 "    evidence: x\n    expr: net_ports[*].state ~ ACTIVE\n")
    with pytest.raises(RuleError, match=r"c\.yaml:6: rule 'c': expression"):
        RuleSet.load([p])


def test_parse_rules_keeps_line_of_each_rule():
    specs = parse_rules(GOOD + GOOD.replace("t.one", "t.two").replace("rules:\n", ""), "mem.yaml")
    assert [s.where for s in specs] == ["mem.yaml:2", "mem.yaml:7"]
