"""Alert rules as code: the committed rule file is what the code builds, promtool accepts it and its
unit tests pass, and a real Prometheus fires the rules on a real collector's exporter."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dashboards import alerts, build
from tests.dashboards.private_prometheus import PrivatePrometheus, free_port

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "dashboards" / "alerts" / alerts.RULE_FILE
UNIT_TESTS = Path(__file__).with_name("alerts_test.yaml")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing (Debian package prometheus)")


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_committed_rules_match_code(tmp_path: Path) -> None:
    assert build.stale_alerts() == [], "stale alert rules; run `fleethealth dashboards build` and commit"
    cm = tmp_path / "k8s" / "rules.yaml"
    assert build.write_alerts(tmp_path, cm) == [tmp_path / alerts.RULE_FILE, cm]
    assert build.write_alerts(tmp_path, cm) == []
    (tmp_path / alerts.RULE_FILE).write_text(RULES.read_text().replace("for: 1m", "for: 2m", 1))
    assert build.stale_alerts(tmp_path, cm) == [alerts.RULE_FILE]
    assert yaml.safe_load(yaml.safe_load(cm.read_text())["data"][alerts.RULE_FILE]) == yaml.safe_load(RULES.read_text())


def test_rules_are_well_formed() -> None:
    doc = yaml.safe_load(RULES.read_text())
    names = [r["alert"] for g in doc["groups"] for r in g["rules"]]
    assert len(names) == len(set(names)) >= 20
    for g in doc["groups"]:
        for r in g["rules"]:
            assert r["labels"]["severity"] in alerts.SEVERITIES, r["alert"]
            assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
            # every aggregated alert keeps the cluster, so one Alertmanager can route several fleets
            for by in re.findall(r"\bby \(([^)]*)\)", r["expr"]):
                assert "cluster" in [x.strip() for x in by.split(",")], f"{r['alert']}: by ({by}) drops cluster"


def test_every_metric_in_the_rules_is_exported_by_someone() -> None:
    from collectors.exporter import load_catalog
    from fleethealth import metrics_names

    known = {s.metric for s in load_catalog()}
    known |= {v for k, v in vars(metrics_names).items() if k.isupper() and isinstance(v, str)}
    for r in alerts.rules():
        for metric in re.findall(r"\b(fleethealth_[a-z0-9_]+)", r.expr):
            assert metric in known, f"{r.name}: {metric} is exported by nothing"


def test_hardware_xids_follow_the_catalog() -> None:
    hw = set(alerts.hardware_xids())
    assert {48, 63, 64, 74, 79, 94, 95, 119} - {63} <= hw  # 63 is a pending remap: its own alert path
    assert not {13, 31, 43, 45} & hw, "application Xids must not page"


@needs_promtool
def test_promtool_check_rules() -> None:
    r = _promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(alerts.rules())} rules found" in r.stdout


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    r = _promtool("test", "rules", UNIT_TESTS.name, cwd=UNIT_TESTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


@needs_promtool
def test_promtool_unit_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    """The cases can fail: a lost-GPU rule that compares with 1 instead of 0 is caught."""
    (tmp_path / "dashboards" / "alerts").mkdir(parents=True)
    (tmp_path / "tests" / "dashboards").mkdir(parents=True)
    broken = RULES.read_text().replace("(fleethealth_gpu_present) == 0", "(fleethealth_gpu_present) == 1")
    assert broken != RULES.read_text()
    (tmp_path / "dashboards" / "alerts" / alerts.RULE_FILE).write_text(broken)
    shutil.copy(UNIT_TESTS, tmp_path / "tests" / "dashboards" / UNIT_TESTS.name)
    r = _promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path / "tests" / "dashboards")
    assert r.returncode != 0
    assert "FleetHealthGpuLost" in r.stdout + r.stderr


# --------------------------------------------------------------------------- a real Prometheus


def _wait(pred, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus missing (Debian package prometheus)")
def test_real_prometheus_fires_the_rules_on_a_collector(tmp_path: Path) -> None:
    """A simulated host with a failed row remap (GPU 2) and a lost GPU (GPU 5), served by the real
    collector's exporter; a private Prometheus loads the built rules (group interval cut to 1 s)
    and scrapes it with the target label cluster=drill."""
    doc = yaml.safe_load(RULES.read_text())
    for g in doc["groups"]:
        g["interval"] = "1s"
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(doc, sort_keys=False))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    collector = subprocess.Popen(
        [str(Path(sys.executable).with_name("fleethealth")), "collect", "--simulate", "--host", "drill-h1",
         "--inject", "gpu_row_remap_failure@2", "--inject", "gpu_fell_off_bus@5", "--sink",
         f"jsonl:{tmp_path / 'samples.jsonl'}", "--interval", "1", "--exporter-port", str(port),
         "--state-dir", str(tmp_path / "state"), "--spool-dir", str(tmp_path / "spool")],
        env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "collector.log").open("wb"))
    prom = PrivatePrometheus(tmp_path / "prom", [{
        "job_name": "fleethealth-collector",
        "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": {"cluster": "drill"}}],
    }], [rules])
    try:
        prom.start()

        def states() -> dict[tuple[str, str], str]:
            return {(a["labels"]["alertname"], a["labels"].get("gpu", "")): a["state"] for a in prom.alerts()}

        _wait(lambda: states().get(("FleetHealthGpuRowRemapFailure", "2")) == "firing",
              f"the remap-failure alert (collector log: {(tmp_path / 'collector.log').read_text()[-500:]})", 60)
        got = {a["labels"]["alertname"]: a for a in prom.alerts() if a["labels"].get("gpu") == "2"}
        remap = got["FleetHealthGpuRowRemapFailure"]
        assert remap["labels"] == {"alertname": "FleetHealthGpuRowRemapFailure", "severity": "critical",
                                   "cluster": "drill", "host": "drill-h1", "gpu": "2"}
        assert remap["annotations"]["summary"] == "Row remapping failed on GPU 2 on drill-h1"
        # the lost GPU's alert waits out its `for: 1m`: pending, not firing
        _wait(lambda: states().get(("FleetHealthGpuLost", "5")) == "pending", "the lost-GPU alert pending", 30)
        s = states()
        assert s[("FleetHealthGpuLost", "5")] == "pending"
        healthy = {gpu for (_, gpu), _ in s.items()} - {"2", "5", ""}
        assert not healthy, f"alerts on healthy GPUs: {sorted(s)}"
        assert prom.get("/api/v1/rules")["data"]["groups"], "rules not loaded"
        health = {r["name"]: r["health"] for g in prom.get("/api/v1/rules")["data"]["groups"] for r in g["rules"]}
        assert set(health) == {r.name for r in alerts.rules()}
        assert set(health.values()) == {"ok"}, {k: v for k, v in health.items() if v != "ok"}
    finally:
        prom.stop()
        collector.send_signal(signal.SIGTERM)
        try:
            collector.wait(15)
        except subprocess.TimeoutExpired:
            collector.kill()
            collector.wait(5)
