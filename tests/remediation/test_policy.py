"""The policy file: the shipped default is valid and follows DESIGN.md + NVIDIA's buckets; bad
files fail with file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleethealth.taxonomy import FAULT_LABELS, MODES, FailureMode
from remediation.policy import History, PolicyError, load_policy, parse_policy
from tests.remediation.helpers import incident

DEFAULT = load_policy()


@pytest.mark.parametrize(("bucket", "mode", "expect"), [
    ("RESTART_APP", "gpu_dram_uce", ("annotate",)),  # Xid 94, contained: the app restarts
    ("RESET_GPU", "gpu_hw_error", ("drain", "reset_gpu")),  # Xid 62, 109, 140 ...
    ("CONTACT_SUPPORT", "gpu_hw_error", ("drain", "ticket")),
    ("RESTART_BM", "gpu_fell_off_bus", ("drain", "reboot", "ticket")),  # Xid 79
])
def test_nvidia_buckets_decide(bucket: str, mode: str, expect: tuple[str, ...]) -> None:
    d = DEFAULT.decide(incident(mode=mode, nvidia_bucket=bucket, xid=1))
    assert d.actions == expect
    if bucket == "CONTACT_SUPPORT":
        assert d.ticket_priority == "rma"


def test_every_fault_mode_gets_a_design_rule_not_the_catch_all() -> None:
    for label in FAULT_LABELS:
        d = DEFAULT.decide(incident(mode=label))
        assert d.rule != "unmatched", label
        info = MODES[FailureMode(label)]
        assert ("drain" in d.actions) == info.drain, (label, d.actions)


def test_second_dram_uce_within_30_days_escalates_to_rma() -> None:
    inc = incident(mode="gpu_dram_uce")
    assert DEFAULT.decide(inc, History({30.0: 0})).actions == ("drain", "reset_gpu")
    d = DEFAULT.decide(inc, History({30.0: 1}))
    assert d.actions == ("drain", "ticket") and d.ticket_priority == "rma"


@pytest.mark.parametrize("mode", ["net_link_down", "gpu_dram_uce", "pcie_fatal", "gpu_fell_off_bus"])
def test_a_model_alone_never_drains(mode: str) -> None:
    d = DEFAULT.decide(incident(mode=mode, detector="model:fault_classifier@1", confidence=0.8))
    assert d.rule == "model-only-finding" and d.actions == ("ticket",)
    assert "drain" in DEFAULT.decide(incident(mode=mode, detector="net.port-down")).actions


def test_detector_match_needs_prefixes(tmp_path: Path) -> None:
    msg = _bad(HEAD + "  - name: x\n    match: {detector: []}\n    actions: [ticket]\n", tmp_path)
    assert "policy.yaml:4" in msg and "detector needs" in msg


def test_app_error_annotates_only() -> None:
    assert DEFAULT.decide(incident(mode="app_error", severity="info")).actions == ("annotate",)


def _bad(text: str, tmp_path: Path) -> str:
    p = tmp_path / "policy.yaml"
    p.write_text(text)
    with pytest.raises(PolicyError) as ei:
        load_policy(p)
    return str(ei.value)


HEAD = "version: 1\nrules:\n"


def test_unknown_failure_mode_names_file_and_line(tmp_path: Path) -> None:
    msg = _bad(HEAD + "  - name: a\n    match: {failure_mode: gpu_on_fire}\n    actions: [drain]\n", tmp_path)
    assert msg.startswith(f"{tmp_path / 'policy.yaml'}:4:") and "unknown failure mode 'gpu_on_fire'" in msg


def test_unknown_action(tmp_path: Path) -> None:
    msg = _bad(HEAD + "  - name: a\n    match: {}\n    actions: [drain, smash]\n", tmp_path)
    assert ":5:" in msg and "unknown action 'smash'" in msg


@pytest.mark.parametrize(("match", "words"), [
    ("{min_confidence: 1.5}", "bad threshold: min_confidence = 1.5"),
    ("{history: {min_prior: 0, within_days: 30}}", "bad threshold: history.min_prior = 0"),
    ("{history: {min_prior: 1, within_days: -2}}", "bad threshold: history.within_days"),
    ("{history: {min_prior: 1}}", "history needs min_prior"),
    ("{min_confidence: high}", "min_confidence must be a number"),
    ("{nvidia_bucket: RESTART_UNIVERSE}", "unknown NVIDIA Xid bucket"),
    ("{colour: red}", "unknown match key 'colour'"),
])
def test_bad_thresholds_and_keys(tmp_path: Path, match: str, words: str) -> None:
    msg = _bad(HEAD + f"  - name: a\n    match: {match}\n    actions: [alert]\n", tmp_path)
    assert ":4:" in msg and words in msg, msg


def test_structure_errors(tmp_path: Path) -> None:
    assert "not valid YAML" in _bad("rules: [\n", tmp_path)
    assert "non-empty list" in _bad("version: 1\nrules: []\n", tmp_path)
    assert "has no actions" in _bad(HEAD + "  - name: a\n    match: {}\n", tmp_path)
    assert "duplicate rule name" in _bad(HEAD + "  - {name: a, actions: [alert]}\n  - {name: a, actions: [alert]}\n",
                                         tmp_path)
    assert "unknown top-level key 'rulez'" in _bad("rulez: []\n", tmp_path)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy(tmp_path / "nope.yaml")


def test_first_match_wins_and_no_match_is_reported() -> None:
    p = parse_policy(HEAD + "  - {name: crit, match: {severity: critical}, actions: [drain]}\n"
                            "  - {name: any-gpu, match: {failure_mode: gpu_thermal}, actions: [ticket]}\n", "t.yaml")
    assert p.decide(incident(mode="gpu_thermal", severity="critical")).rule == "crit"
    assert p.decide(incident(mode="gpu_thermal", severity="minor")).rule == "any-gpu"
    d = p.decide(incident(mode="net_link_down", severity="major"))
    assert d.actions == () and "no rule" in d.reason
