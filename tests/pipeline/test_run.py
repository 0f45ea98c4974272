"""`fleethealth run` end to end on a small simulated fleet: real simulator, detector engine,
remediation worker (dry-run) with a real SQLite ticket store, HTML report."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from fleetcli.pipeline import RunOptions, run

ROOT = Path(__file__).resolve().parents[2]
SIM = dict(simulate=True, hosts=12, duration="1h", interval=10.0, fault_rate=3000.0, seed=3, quiet=True)


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("run")
    res = run(RunOptions(**SIM, report=tmp / "report", tickets=f"sqlite:{tmp / 'state.sqlite'}"))
    return res, tmp


def test_run_finds_the_injected_faults_and_writes_the_report(result) -> None:
    res, tmp = result
    s = res.summary
    assert s.hosts == 12
    assert s.samples > 12 * 300  # one sample per host per 10 s over an hour, a few lost in transit
    modes = {i.failure_mode for i in res.incidents}
    assert modes, "a fleet with faults injected produced no incidents"
    html = (tmp / "report" / "index.html").read_text()
    assert res.report_path == tmp / "report" / "index.html"
    for mode in modes:
        assert mode in html
    assert "Scorecard" in html and "dry-run (nothing drained)" in html


def test_dry_run_records_actions_but_drains_nothing(result) -> None:
    res, tmp = result
    kinds = Counter((a.kind, a.outcome) for a in res.actions)
    assert res.actions, "remediation recorded no actions for the incidents"
    assert not [a for a in res.actions if a.outcome == "done" and a.kind in ("drain", "reset_gpu", "reboot_request")]
    assert any(o == "dry_run" for _, o in kinds), kinds
    with sqlite3.connect(tmp / "state.sqlite") as conn:  # the audit table holds the same decisions
        audited = conn.execute("SELECT COUNT(*) FROM audit").fetchone()[0]
    assert audited == len(res.actions)
    states = Counter(res.summary.host_states.values())
    assert states["healthy"] + states["suspect"] + states["drained"] + states["in_repair"] == 12


def test_dry_run_guards_trip_and_would_drain_equals_the_audits_dry_run_drains(result) -> None:
    """12 simulated hosts: the cap is 1 node at a time (10 %, min 1), evaluated on the simulated fleet's
    own node list, as it would be live; held-back drains are 'queued', never counted as would-drain."""
    res, tmp = result
    would = [a for a in res.actions if a.kind == "drain" and a.outcome == "dry_run" and "step" not in a.details]
    with sqlite3.connect(tmp / "state.sqlite") as conn:
        audit = conn.execute("SELECT kind, outcome, host FROM audit ORDER BY seq").fetchall()
    assert len(would) == sum(1 for k, o, _ in audit if k == "drain" and o == "dry_run")
    assert any(k == "drain" and o == "queued" for k, o, _ in audit), "a 3000x fault rate must trip the cap"
    held, peak = set(), 0
    for k, o, host in audit:  # would-be drained nodes at each point of the run
        if k == "drain" and o == "dry_run":
            held.add(host)
        elif k == "resume" and o == "dry_run":
            held.discard(host)
        peak = max(peak, len(held))
    assert peak == 1
    opened = Counter(a.id.split("|ticket|")[1].split("#")[0] for a in res.actions if a.kind == "ticket_opened")
    assert opened and max(opened.values()) == 1  # one 'would open' per host/component, then 'would update'


def test_run_honours_config_guards(tmp_path: Path) -> None:
    cfg = tmp_path / "fleet.toml"
    cfg.write_text("[guards]\nkill_switch = true\n")
    res = run(RunOptions(**SIM, config=str(cfg)))
    drains = [a for a in res.actions if a.kind == "drain"]
    assert drains and all(a.outcome == "refused" and "kill switch" in a.reason for a in drains)
    cfg.write_text("[guards]\nmax_incident_age_s = inf\n")
    with pytest.raises(ValueError, match=r"fleet.toml: \[guards\].max_incident_age_s"):
        run(RunOptions(simulate=True, hosts=6, duration="20m", quiet=True, config=str(cfg)))


def test_run_is_deterministic_for_a_seed(result) -> None:
    res, _ = result
    again = run(RunOptions(**SIM))
    key = lambda r: sorted((i.id, i.failure_mode, i.state) for i in r.incidents)  # noqa: E731
    assert key(again) == key(res)


def test_cli_prints_summary_and_report(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fleetcli.cli", "run", "--simulate", "--hosts", "4", "--duration", "20m",
         "--fault-rate", "3000", "--seed", "1", "--score", "--report", str(tmp_path / "r"), "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "fleethealth run: " in out.stdout and "samples from 4 hosts" in out.stdout
    assert "recall" in out.stdout and "quality bar" in out.stdout, out.stdout  # the scorecard
    assert (tmp_path / "r" / "index.html").exists()


def test_cli_rejects_two_inputs(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "fleetcli.cli", "run", "--simulate", "--replay", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "exactly one of" in out.stderr


def test_scorecard_comes_from_the_detectors_scoring_code(result) -> None:
    res = run(RunOptions(**SIM, score=True))
    card = res.summary.scorecard
    assert card is not None and res.summary.scorecard_text
    assert card["faults"] > 0 and card["detections"] > 0
    detected = {i.failure_mode for i in res.incidents}
    assert detected & set(card["modes"]), "the scorecard scores the modes the run detected"


def test_with_models_a_drain_always_has_a_rule_behind_it() -> None:
    res = run(RunOptions(**SIM, with_models=True))
    spoke: dict[str, set[str]] = {}
    for i in res.incidents:
        spoke.setdefault(i.id, set()).add("model" if i.detector.startswith("model:") else "rule")
    # the models score windows in batches, so on faults the rules also see they join the rules'
    # episodes (their evidence is added) rather than open their own
    from_models = [i for i in res.incidents
                   if any(e.fact.startswith(("classifier p(", "peer-comparison anomaly")) for e in i.evidence)]
    assert from_models, "the shipped models raised nothing at 3000x faults"
    drained = {a.incident_id for a in res.actions if a.kind in ("drain", "reset_gpu", "reboot_request")}
    assert drained
    assert all("rule" in spoke[i] for i in drained), "a drain answered an episode no rule ever raised"


def test_scored_report_carries_the_scorecard(tmp_path: Path) -> None:
    """The run's report is the one report (tests/report): scorecard, confusion matrix, the timeline
    with the ground-truth faults, and the remediation section."""
    res = run(RunOptions(**SIM, score=True, report=tmp_path / "rep"))
    assert res.summary.scorecard is not None
    html = (tmp_path / "rep" / "index.html").read_text()
    for anchor in ("id='scorecard'", "id='confusion'", "id='timeline'", "id='remediation'", 'class="fault"'):
        assert anchor in html, anchor
    assert "data:image/png" not in html  # inline SVG and HTML tables, no plots


def test_a_fleet_with_no_fault_is_scored_and_reported(tmp_path: Path) -> None:
    """No fault is ground truth too (the driver roll-out set): the scorecard counts every host as
    healthy, and the report draws a timeline with nothing to label (it used to fail on the legend)."""
    res = run(RunOptions(simulate=True, hosts=6, duration="20m", interval=10.0, fault_rate=0.0, seed=5, quiet=True,
                         score=True, report=tmp_path / "rep"))
    card = res.summary.scorecard
    assert card is not None and card["faults"] == 0 and card["healthy_hosts"] == 6
    assert (tmp_path / "rep" / "index.html").stat().st_size > 1000
