"""Kernel-log parsing on every prefix format, and the follower's position, rotation and limits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from collectors.kernel_follow import KernelLogFollower
from parsers.kernel_log import KernelLineParser, normalise_pci, parse_kernel_line

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "collectors" / "kmsg"
CORPUS = Path(__file__).resolve().parents[2] / ".." / "shared" / "corpus"
BOOT = 1_717_000_000.0


def events(name: str, **kw):
    p = KernelLineParser(boot_time=BOOT, year_hint=2024, **kw)
    return [e for e in (p.feed(line) for line in (FIX / name).read_text().splitlines()) if e]


def test_xid_79_with_pid_in_dmesg_format():
    ev = parse_kernel_line("[  812.117215] NVRM: Xid (PCI:0000:3b:00): 79, pid=2211, GPU has fallen off the bus.",
                           boot_time=BOOT)
    assert ev is not None
    assert (ev.kind, ev.xid, ev.pci_addr, ev.pid) == ("xid", 79, "0000:3b:00.0", 2211)
    assert ev.message == "GPU has fallen off the bus."
    assert ev.ts == pytest.approx(BOOT + 812.117215)


def test_xid_unknown_pid_and_name():
    ev = parse_kernel_line("NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp "
                           "Exception on (GPC 8, TPC 5, SM 0): Out Of Range Address", default_ts=5.0)
    assert ev and ev.xid == 13 and ev.pid is None and ev.message.startswith("Graphics SM Warp")
    assert ev.ts == 5.0


def test_dmesg_fixture_kinds_and_multiline_fell_off_bus():
    evs = events("dmesg.log")
    kinds = [e.kind for e in evs]
    assert kinds == ["xid", "fell_off_bus", "xid", "xid", "aer", "aer", "aer", "edac", "mce", "other"]
    fell = evs[1]
    assert fell.pci_addr == "0000:3b:00.0" and fell.severity == "fatal"
    aer = evs[4:7]
    assert {e.pci_addr for e in aer} == {"0000:00:02.0"}
    assert [e.severity for e in aer] == ["fatal", "fatal", "fatal"]  # the detail line inherits the header's
    assert evs[7].severity == "uncorrected"
    assert evs[-1].kind == "other" and "Xid" in evs[-1].line  # truncated line kept as evidence


def test_kmsg_raw_records_use_boot_time():
    evs = events("kmsg-raw.log")
    assert [e.kind for e in evs] == ["xid", "aer"]
    assert evs[0].ts == pytest.approx(BOOT + 812.117215)
    assert evs[1].severity == "corrected" and evs[1].pci_addr == "0000:00:1c.0"


def test_dmesg_T_iso_syslog_and_journal_formats():
    t = events("dmesg-T.log")
    assert [(e.kind, e.xid) for e in t] == [("edac", None), ("xid", 94)]
    assert t[0].severity == "corrected"
    iso = events("iso.log")
    assert [(e.kind, e.xid) for e in iso] == [("xid", 119), ("aer", None)]
    assert iso[0].ts == pytest.approx(1709633472.123456)
    syslog = events("syslog.log")
    assert [(e.kind, e.xid) for e in syslog] == [("aer", None), ("xid", 74), ("edac", None)]
    assert syslog[0].severity == "corrected" and syslog[1].pid == 555
    assert syslog[2].ts == pytest.approx(1709633474.0)


@pytest.mark.parametrize("line", [
    "", "\x00\x01garbage", "NVRM: Xid (PCI:", "[ 12.3] NVRM: Xid (PCI:0000:3b:00): ", "6,1,2,-;",
    "[Mon Xyz 99 99:99:99 2024] EDAC MC0: 1 CE memory read error on x", "x" * 100_000,
    "фев 12 00:48:02 kernel: pcieport 0000:00:1c.5: AER: Corrected error received: 0000:00:1c.5",
])
def test_bad_lines_never_raise(line):
    ev = parse_kernel_line(line)
    assert ev is None or ev.kind in ("other", "aer", "edac", "xid")


def test_interleaved_line_is_other_not_misparsed():
    # two writers interleaved mid-line: the Xid number is gone, so nothing may be invented
    ev = parse_kernel_line("[ 5.0] NVRM: Xid (PCI:0000:3b[ 5.1] usb 1-1: new device")
    assert ev is not None and ev.kind == "other" and ev.xid is None


def test_normalise_pci():
    assert normalise_pci("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalise_pci("PCI:0000:3b:00") == "0000:3b:00.0"
    assert normalise_pci("3b:00.1") == "0000:3b:00.1"


def test_healthy_lines_give_nothing():
    lines = ["[ 1.0] EDAC MC0: Giving out device to module i10nm_edac",
             "[ 2.0] mlx5_core 0000:0c:00.0: Port module event: module 0, Cable plugged",
             "[ 3.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15"]
    assert [parse_kernel_line(x) for x in lines] == [None, None, None]


@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus not present on this machine")
def test_corpus_xid_files_parse():
    for f in sorted((CORPUS / "kernel-xid").glob("xid*.log")):
        p = KernelLineParser()
        evs = [e for e in (p.feed(x) for x in f.read_text(errors="replace").splitlines()) if e]
        assert any(e.kind == "xid" for e in evs), f.name
    p = KernelLineParser()
    evs = [e for e in (p.feed(x) for x in (CORPUS / "kernel-xid" / "h100-node-boot-dmesg-healthy.log")
                                   .read_text(errors="replace").splitlines()) if e]
    # 2381 lines of healthy boot noise: only the family lines the rules read by text (link up/down at boot,
    # PCIe bandwidth of each NIC), never an Xid / AER / EDAC / MCE event
    assert {e.kind for e in evs} <= {"other"}


# --------------------------------------------------------------------------- follower

XID = "[  1.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
AER = "[  2.000000] pcieport 0000:00:02.0: AER: Corrected error received: 0000:00:02.0\n"


def test_follower_keeps_position_across_restarts(tmp_path):
    log, state = tmp_path / "kern.log", tmp_path / "pos.json"
    log.write_text(XID)
    f = KernelLogFollower(log, state_path=state, boot_time=BOOT)
    assert [e.xid for e in f.poll()] == [79]
    f.close()
    with open(log, "a") as fh:
        fh.write(AER)
    f2 = KernelLogFollower(log, state_path=state, boot_time=BOOT)
    assert [e.kind for e in f2.poll()] == ["aer"]  # not the Xid again
    assert f2.poll() == []


def test_follower_half_written_line_waits_for_newline(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(XID[:30])
    f = KernelLogFollower(log, state_path=tmp_path / "p.json")
    assert f.poll() == []
    with open(log, "a") as fh:
        fh.write(XID[30:])
    assert [e.xid for e in f.poll()] == [79]


def test_follower_survives_rotation_and_truncation(tmp_path):
    log, state = tmp_path / "kern.log", tmp_path / "pos.json"
    log.write_text(XID)
    f = KernelLogFollower(log, state_path=state)
    assert len(f.poll()) == 1
    with open(log, "a") as fh:
        fh.write(AER)  # written just before rotation: must not be lost
    os.rename(log, tmp_path / "kern.log.1")
    log.write_text(XID)
    got = f.poll()
    assert [e.kind for e in got] == ["aer", "xid"] and f.rotations == 1
    with open(log, "w") as fh:  # copytruncate
        fh.write(AER)
    assert [e.kind for e in f.poll()] == ["aer"]


def test_follower_rotated_while_stopped_reads_rest_of_old_file(tmp_path):
    log, state = tmp_path / "kern.log", tmp_path / "pos.json"
    log.write_text(XID)
    f = KernelLogFollower(log, state_path=state)
    f.poll()
    f.close()
    with open(log, "a") as fh:
        fh.write(AER)
    os.rename(log, tmp_path / "kern.log.1")
    log.write_text(XID)
    f2 = KernelLogFollower(log, state_path=state)
    assert [e.kind for e in f2.poll()] == ["aer", "xid"]


def test_follower_bounds_line_length(tmp_path):
    log = tmp_path / "kern.log"
    log.write_bytes(b"[ 1.0] NVRM: Xid (PCI:0000:3b:00): 31, " + b"A" * 50_000 + b"\n" + AER.encode())
    f = KernelLogFollower(log, state_path=tmp_path / "p.json", max_line=1024)
    evs = f.poll()
    assert f.lines_truncated == 1
    assert [e.kind for e in evs] == ["xid", "aer"] and len(evs[0].line) <= 1024
