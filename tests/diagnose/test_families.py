"""Issue 14's kernel-log event families, each a rule of the one rule set, each through both paths
(``diagnose`` on the capture, and the real collector reading it as its kernel log into the
streaming engine), with the evidence line kept. Traps stay healthy. The fixtures in
tests/fixtures/families/ are written for this project in the formats the field produces."""

from __future__ import annotations

from pathlib import Path

import pytest

from detectors.diagnose.doctor import diagnose_path
from tests.diagnose.streampath import stream_incidents, stream_kind

FAM = Path(__file__).resolve().parents[1] / "fixtures" / "families"

# fixture -> (failure modes, a text the evidence line must hold; "" for a healthy trap)
CASES = {
    "sxid-fatal-dmesg-T.log": ({"gpu_nvlink_error"}, "SXid (PCI:0000:87:00.0): 24007, Fatal"),
    "sxid-nonfatal-raw.log": ({"gpu_nvlink_error"}, "20034, Non-fatal"),
    "ghes-fatal-memory-journal.log": ({"host_dram_uce"}, "section_type: memory error"),
    "ghes-corrected-repeats-syslog.log": ({"host_dram_ce_storm"}, "section_type: memory error"),
    "ghes-corrected-single-syslog-healthy.log": (set(), ""),  # one corrected error is healthy
    "mlx5-link-flap-dmesg.log": ({"net_link_bad_cable"}, "ibp193s0: Link down"),
    "mlx5-link-down-stays-down-dmesg.log": ({"net_link_down"}, "enp65s0f1np1: Link down"),
    "mlx5-probe-unused-port-link-down-healthy.log": (set(), ""),  # never up: a port without a cable
    "mlx5-pcie-bandwidth-slot-limited-healthy.log": (set(), ""),  # the slot's width, not a fault
    "mlx5-module-cable-error-dmesg.log": ({"net_link_bad_cable"}, "Cable error"),
    "networkd-carrier-flap-syslog.log": ({"net_link_bad_cable"}, "Lost carrier"),
    "networkd-forged-carrier-by-user-healthy.log": (set(), ""),  # other programs' lines are not the kernel's
    "gsp-heartbeat-no-xid-dmesg.log": ({"gpu_gsp_error"}, "GPU3 _kgsp"),
    "rminit-failed-dmesg.log": ({"gpu_fell_off_bus"}, "RmInitAdapter failed!"),
    "nvidia-probe-failed-dmesg.log": ({"gpu_fell_off_bus"}, "probe of 0000:c3:00.0 failed"),
    "mce-processor-context-corrupt-not-dram.log": (set(), ""),  # a CPU's own error, not a DIMM
    # a corrected DRAM machine check (AMD UMC, by IPID) logged again and again: a storm
    "mce-amd-umc-corrected-repeating.log": ({"host_dram_ce_storm"}, "Bank 16: dc2041000000011b"),
    "mce-amd-umc-corrected-once-at-boot-healthy.log": (set(), ""),
    "benign-error-strings-other-drivers-healthy.log": (set(), ""),
}


# tool captures the collector does not read: through diagnose only (capture.yaml's fact rules)
TOOL_CASES = {
    "dcgmi-diag-r3-memory-faulty.txt": ({("gpu5", "gpu_dram_uce")}, "Fail - GPU: 5"),
    "dcgmi-diag-r2-pcie-fail-replays.txt": ({("gpu1", "pcie_link_degraded")}, "Fail - GPU: 1"),
    # the run could not use the GPU (another process held it): inconclusive, not a memory fault
    "dcgmi-diag-r2-memory-fail-gpu-busy-inconclusive.txt": (set(), ""),
}


def test_every_family_fixture_has_a_case() -> None:
    assert {p.name for p in FAM.iterdir() if p.is_file()} == set(CASES)
    assert {p.name for p in (FAM / "tools").iterdir()} == set(TOOL_CASES)


@pytest.mark.parametrize("name", sorted(TOOL_CASES))
def test_tool_family_through_diagnose(name: str) -> None:
    want, text = TOOL_CASES[name]
    d = diagnose_path(FAM / "tools" / name)
    assert d.error is None and d.format == "dcgmi-diag"
    assert {(f.component, f.failure_mode) for f in d.findings} == want
    assert all(text in f.evidence[0].line for f in d.findings)


@pytest.mark.parametrize("name", sorted(CASES))
def test_family_through_diagnose(name: str) -> None:
    modes, text = CASES[name]
    d = diagnose_path(FAM / name)
    assert d.error is None
    assert {f.failure_mode for f in d.findings} == modes
    for f in d.findings:
        assert text in f.evidence[0].line, f"{f.detector}: evidence line lost: {f.evidence[0].line!r}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_family_through_the_collector_and_the_stream(name: str) -> None:
    modes, text = CASES[name]
    assert stream_kind(FAM / name) == "kmsg"
    incidents = stream_incidents(FAM / name, "kmsg")
    assert {i.failure_mode for i in incidents} == modes
    for i in incidents:
        assert any(text in e.line for e in i.evidence), f"{i.detector}: evidence line lost"
