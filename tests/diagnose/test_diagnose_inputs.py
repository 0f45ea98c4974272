"""diagnose's inputs: stdin, gzip by content, folders walked, several captures in one file, text in
no known format read for kernel lines, and "no evidence" as its own outcome (exit 3)."""

from __future__ import annotations

import gzip
import io
import json
import shutil
from pathlib import Path

import pytest

from detectors.diagnose.doctor import EXIT_NO_EVIDENCE, diagnose_input, run
from detectors.diagnose.engine import snapshot_rules
from parsers import parse_captures
from parsers.split import split_captures

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "parsers"
XID79 = b"[  812.117215] NVRM: Xid (PCI:0000:3b:00): 79, pid=2211, name=python3, GPU has fallen off the bus.\n"


def modes(d) -> set[str]:
    return {f.failure_mode for f in d.findings}


def test_stdin(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["-"], stdin=io.BytesIO(XID79)) == 1
    assert "gpu_fell_off_bus" in capsys.readouterr().out


def test_gzip_is_detected_by_content_not_name(tmp_path: Path) -> None:
    f = tmp_path / "capture.txt"  # no .gz in the name
    f.write_bytes(gzip.compress(XID79))
    [d] = diagnose_input(str(f), None, snapshot_rules())
    assert modes(d) == {"gpu_fell_off_bus"} and not d.error
    bad = tmp_path / "broken.gz"
    bad.write_bytes(b"\x1f\x8b" + b"\x00garbage")
    assert run([str(bad)]) == 2


def test_folder_is_walked_and_each_file_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a").mkdir()
    shutil.copy(FIX / "v100-q-old-ecc-layout-healthy.txt", tmp_path / "a" / "nvsmi.txt")
    (tmp_path / "b.log").write_bytes(XID79)
    (tmp_path / "notes.txt").write_text("nothing here\n")
    (tmp_path / ".hidden").write_bytes(XID79)
    ds = diagnose_input(str(tmp_path), None, snapshot_rules())
    assert [Path(d.path).name for d in ds] == ["nvsmi.txt", "b.log", "notes.txt"]
    assert [d.outcome for d in ds] == ["healthy", "findings", "no evidence"]
    assert run([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "nvsmi.txt" in out and "b.log" in out and "notes.txt" in out


def test_a_sysfs_snapshot_folder_is_one_input() -> None:
    [d] = diagnose_input(str(FIX / "sysfs-ib-flap"), None, snapshot_rules())
    assert d.format == "sysfs-snapshot" and not d.error


def test_pasted_session_is_split_into_its_captures() -> None:
    text = (FIX / "session-ibstat-dmesg-ethtool-grep.txt").read_text()
    parts = split_captures(text)
    assert [(p.title.split()[0] if p.title else "", p.hint) for p in parts] == [
        ("", None), ("ibstat", "ibstat"), ("dmesg", "kernel-log"), ("ethtool", "ethtool-stats")]
    parsed = parse_captures(text)
    assert [p.format for p in parsed][1:] == ["ibstat", "kernel-log", "ethtool-stats"]
    eth = parsed[3].sample.net_ports[0]
    assert eth.device == "enp83s0f0np0" and eth.counters == {"rx_crc_errors_phy": 0, "rx_symbol_err_phy": 0,
                                                              "rx_discards_phy": 12}
    [d] = diagnose_input(str(FIX / "session-ibstat-dmesg-ethtool-grep.txt"), None, snapshot_rules())
    assert {"net_link_down", "gpu_fell_off_bus"} <= modes(d)


def test_bug_report_sections_are_split() -> None:
    text = (FIX / "bundle-bug-report-style.log").read_text()
    assert len(split_captures(text)) == 5
    [d] = diagnose_input(str(FIX / "bundle-bug-report-style.log"), None, snapshot_rules())
    assert "pcie_fatal" in modes(d) and "kernel-log" in d.format


def test_unknown_format_falls_back_to_the_line_reader(tmp_path: Path) -> None:
    f = tmp_path / "grep-n.txt"
    f.write_text("matches of grep -n in the node's dmesg dump:\n"
                 "1700[  812.117215] NVRM: Xid (PCI:0000:3b:00): 79, pid=2211, GPU has fallen off the bus.\n")
    [d] = diagnose_input(str(f), None, snapshot_rules())
    assert not d.error and d.format == "kernel-log (fallback)" and modes(d) == {"gpu_fell_off_bus"}


def test_no_evidence_is_not_healthy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scrape = tmp_path / "vgpu.prom"  # a vGPU guest: clocks and utilisation, no memory-error or Xid series
    scrape.write_text('DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-00000000",modelName="GRID A100-10C"} 1410\n'
                      'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-00000000",modelName="GRID A100-10C"} 0\n')
    assert run([str(scrape)]) == EXIT_NO_EVIDENCE == 3
    assert "no evidence" in capsys.readouterr().out
    assert run([str(scrape)], as_json=True) == 3
    row = json.loads(capsys.readouterr().out)
    assert row["outcome"] == "no evidence" and row["evidence"] == []
    assert run([str(FIX / "v100-q-old-ecc-layout-healthy.txt")]) == 0
    assert run([str(FIX / "v100-q-old-ecc-layout-healthy.txt"), str(scrape)]) == 3


def test_binary_and_missing_are_unreadable(tmp_path: Path) -> None:
    b = tmp_path / "core"
    b.write_bytes(b"\x7fELF\x00\x00\x01")
    assert run([str(b)]) == 2
    assert run([str(tmp_path / "missing")]) == 2
    (tmp_path / "empty").mkdir()
    assert run([str(tmp_path / "empty")]) == 2


def test_other_programs_lines_are_not_read_by_diagnose_either(tmp_path: Path) -> None:
    """security review F7 on the offline path: the decoded facts (MCE records, AER headers) must come
    from kernel lines only, like the events."""
    f = tmp_path / "messages"
    f.write_text(
        "Mar  5 10:11:13 gpu-node-007 sudo: alice : user NOT in sudoers ; COMMAND=/bin/echo mce: [Hardware Error]: "
        "CPU 0: Machine Check: 0 Bank 5: be00000000800400\n"
        "Mar  5 10:11:13 gpu-node-007 myjob[9]: EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0\n"
        "Mar  5 10:11:14 gpu-node-007 logger: nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), "
        "type=Transaction Layer, (Requester ID)\n"
        "Mar  5 10:11:15 gpu-node-007 sshd[4242]: Invalid user NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off\n"
        "Mar  5 10:11:16 gpu-node-007 kernel: usb 1-1: new high-speed USB device number 2 using xhci_hcd\n")
    [d] = diagnose_input(str(f), None, snapshot_rules())
    assert d.findings == [] and d.outcome == "healthy"
    assert any("other programs" in w for w in d.warnings)
