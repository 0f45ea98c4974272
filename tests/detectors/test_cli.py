"""`fleethealth detect` end to end on a JSONL bus, and a bad rule directory failing at start-up."""

from __future__ import annotations

import subprocess
import sys

import msgspec

from fleethealth.schema import decode_incident, encode
from simulator.fixtures import HostSeries

replace = msgspec.structs.replace


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "fleetcli.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_detect_on_jsonl_bus(tmp_path):
    rec = tmp_path / "t.jsonl"
    hs = HostSeries("cli-1")
    lines = []
    for k in range(8):
        def fn(s, k=k):
            if k >= 4:
                s.net_ports[1] = replace(s.net_ports[1], state="DOWN", phys_state="Disabled")
        lines.append(encode(hs.advance(fn)).decode())
    lines.insert(2, '{"host": 7}')
    rec.write_text("\n".join(lines) + "\n")
    r = _run("detect", "--bus", f"jsonl:{rec}", "--exit-when-idle", "--metrics-port", "0")
    assert r.returncode == 0, r.stderr
    assert "8 samples, 1 incidents, 1 dead letters" in r.stdout
    inc = decode_incident((tmp_path / "t.fleet.incidents.v1.jsonl").read_text().splitlines()[0])
    assert (inc.failure_mode, inc.component, inc.state) == ("net_link_down", "mlx5_1/1", "open")
    assert "$.host" in (tmp_path / "t.fleet.deadletter.v1.jsonl").read_text()


def test_bad_rules_fail_start_up_with_file_and_line(tmp_path):
    (tmp_path / "x.yaml").write_text("rules:\n  - id: x\n    kind: condition\n    failure_mode: nope\n")
    r = _run("detect", "--bus", "memory", "--rules", str(tmp_path), "--exit-when-idle", "--metrics-port", "0")
    assert r.returncode == 2
    assert f"{tmp_path / 'x.yaml'}:4: rule 'x': failure_mode 'nope'" in r.stderr


def test_help_reads_like_the_readme():
    r = _run("detect", "--help")
    assert r.returncode == 0 and "FLEETHEALTH_GROUP" in r.stdout and "fleet.deadletter.v1" in r.stdout
