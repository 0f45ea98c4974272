"""diagnose on the project's own fixtures: one healthy and one failing capture per format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detectors.diagnose.doctor import diagnose_path, run

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "parsers"

CASES = [
    ("a100-q-dbe-remap-pending.txt", {"gpu_dram_uce", "gpu_row_remap_pending"}),  # GPU 1 idle P8 gen1: no finding
    ("v100-q-old-ecc-layout-healthy.txt", set()),
    ("t4-q-x-v10-thermal.xml", {"gpu_thermal"}),
    ("table-gpu-lost.txt", {"gpu_fell_off_bus"}),
    ("nvlink-e-crc-recovery.txt", {"gpu_nvlink_error"}),
    ("nvlink-s-one-inactive.txt", {"gpu_nvlink_error"}),
    ("ibstat-port-down.txt", {"net_link_down"}),
    ("perfquery-symbol-errors.txt", {"net_link_bad_cable"}),
    ("ethtool-S-mlx5-crc.txt", {"net_link_bad_cable"}),
    ("dcgm-exporter-dbe-xid.prom", {"gpu_dram_uce"}),
    ("kernel-journal-xid48-63.log", {"gpu_dram_uce"}),
    # the Surprise Down AER is the fall's footprint: folded into it, as the stream's precedence does
    ("dmesg-T-xid79-aer.log", {"gpu_fell_off_bus"}),
    ("kmsg-raw-app-xid13.log", {"app_error"}),
    ("dmesg-iso-edac-ue.log", {"host_dram_uce"}),
    ("mcelog-internal-only.txt", set()),
    ("lspci-gpu-x8.txt", {"pcie_link_degraded"}),
    ("sysfs-ib-flap", {"net_link_bad_cable"}),
    ("sysfs-edac-healthy", set()),
]


@pytest.mark.parametrize(("name", "want"), CASES, ids=[c[0] for c in CASES])
def test_fixture_failure_modes(name: str, want: set[str]) -> None:
    d = diagnose_path(FIX / name, "gpu-node-007")
    assert d.error is None
    assert {f.failure_mode for f in d.findings} == want


def test_xid48_with_63_says_drain_and_reset() -> None:
    d = diagnose_path(FIX / "kernel-journal-xid48-63.log", None)
    (f,) = d.findings
    assert f.xid == 48 and f.nvidia_bucket == "WORKFLOW_XID_48"
    assert f.recommended_action == ["drain", "reset_gpu"]
    assert f.component == "GPU-11111111-2222-3333-4444-555555555555"  # UUID from the driver's "GPU at" line


def test_saturated_counter_reported_as_at_least(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([str(FIX / "sysfs-ib-flap")]) == 1
    out = capsys.readouterr().out
    assert "link_downed=255 is saturated" in out
    assert "port_xmit_wait" not in out  # congestion counter, not a cable error


def test_json_lines_and_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([str(FIX / "dcgm-exporter-dbe-xid.prom")], as_json=True, host="gpu-node-001") == 1
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rows and all({"failure_mode", "component", "evidence", "action", "file", "severity",
                         "confidence"} <= r.keys() for r in rows)
    xid_rows = [r for r in rows if "xid" in r]
    assert xid_rows[0]["xid"] == 95 and xid_rows[0]["nvidia_bucket"] == "RESET_GPU"
    assert run([str(FIX / "v100-q-old-ecc-layout-healthy.txt")]) == 0
    bad = tmp_path / "garbage.txt"
    bad.write_text("hello world\nnothing to see\n")
    assert run([str(bad)]) == 3  # no known format, no kernel line: no evidence (not unreadable, not healthy)
    assert "no evidence" in capsys.readouterr().out
    assert run([str(tmp_path / "missing.txt")]) == 2


def test_cli_registered() -> None:
    from fleetcli.cli import main

    assert main(["diagnose", str(FIX / "kmsg-raw-app-xid13.log")]) == 1
