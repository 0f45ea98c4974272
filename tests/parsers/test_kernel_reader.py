"""The one kernel-line reader: every prefix format, who wrote the line, kmsg records, the families the
rules read by text, wrapped / truncated / over-long lines."""

from __future__ import annotations

import errno
import os
from datetime import datetime
from pathlib import Path

import pytest

from collectors import kernel_follow
from collectors.kernel_follow import KernelLogFollower
from parsers.kernel_log import MAX_LINE, KernelLineParser, month_number, parse_kernel_line, split_prefix

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "kernel-lines"
BOOT = 1_717_000_000.0
LOCAL = datetime(2024, 3, 5, 10, 11, 12).timestamp()  # syslog / dmesg -T print local time
UTC_TS = 1709633472.117215

# file -> the Xid line's expected timestamp (None: the format has none), whether it holds a forged line
EXPECT: dict[str, tuple[float | None, bool]] = {
    "raw-dmesg.log": (BOOT + 812.117215, False),
    "dmesg-caller-id.log": (BOOT + 812.117215, False),
    "dmesg-T.log": (LOCAL, False),
    "dmesg-H-reltime.log": (datetime(2024, 3, 5, 10, 11).timestamp() + 1.117215, False),
    "dmesg-delta.log": (BOOT + 1.117214, False),
    "dmesg-iso.log": (UTC_TS, False),
    "dmesg-decode.log": (BOOT + 812.117215, True),
    "pstore-dmesg-ramoops.log": (BOOT + 812.117215, True),
    "kmsg-records.log": (BOOT + 812.117215, True),
    "syslog-rfc3164.log": (LOCAL, True),
    "syslog-pri.log": (LOCAL, True),
    "syslog-rfc5424.log": (UTC_TS, True),
    "syslog-rfc3339.log": (UTC_TS, True),
    "syslog-sonic-severity.log": (LOCAL + 0.117215, True),
    "syslog-broadcast.log": (BOOT + 812.117215, False),
    "journal-short.log": (LOCAL, True),
    "journal-short-precise.log": (LOCAL + 0.117215, True),
    "journal-short-iso.log": (1709633472.0, True),
    "journal-short-full.log": (LOCAL, True),
    "journal-short-unix.log": (UTC_TS, True),
    "journal-short-monotonic.log": (BOOT + 812.117215, True),
    "journal-cat.log": (None, False),
    "journal-json.log": (UTC_TS, True),
    "talosctl-dmesg.log": (UTC_TS, True),
    "cri-container.log": (BOOT + 812.117215, True),
    "docker-json.log": (BOOT + 812.117215, True),
    "kubectl-logs-prefix.log": (BOOT + 812.117215, True),
    "grep-file-and-line-numbers.log": (LOCAL, True),
    "localized-months.log": (LOCAL, True),
    "condensed-no-host.log": (LOCAL, False),
    "wrapped-and-pager-truncated.log": (BOOT + 812.117215, False),
}


def read(name: str) -> tuple[list, KernelLineParser]:
    p = KernelLineParser(boot_time=BOOT, year_hint=2024)
    return [e for line in (FIX / name).read_text().splitlines() for e in p.feed_all(line)], p


def test_every_fixture_is_listed():
    assert sorted(EXPECT) == sorted(f.name for f in FIX.iterdir())


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_prefix_format(name):
    evs, p = read(name)
    ts, forged = EXPECT[name]
    xids = [e for e in evs if e.kind == "xid"]
    assert [(e.xid, e.pci_addr) for e in xids] == [(79, "0000:3b:00.0")], name  # never the forged Xid 48
    assert xids[0].message.startswith("GPU has fallen off the bus")
    if ts is not None:
        assert xids[0].ts == pytest.approx(ts, abs=1e-3)
    aer = [e for e in evs if e.kind == "aer"]
    assert [(e.pci_addr, e.severity) for e in aer] == [("0000:00:02.0", "fatal")]
    assert not any("usb 1-1" in e.line for e in evs)
    assert (p.lines_foreign > 0) == forged


@pytest.mark.parametrize("line", [
    "Mar  5 10:11:12 gpu-node-007 sshd[4242]: Invalid user NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off",
    "Mar  5 10:11:12 gpu-node-007 myjob: NVRM: Xid (PCI:0000:18:00): 48, DBE",
    "Mar  5 10:11:12 gpu-node-007 sudo: alice : user NOT in sudoers ; COMMAND=/bin/echo mce: [Hardware Error]: "
    "CPU 0: Machine Check: 0 Bank 5: be00000000800400 uncorrected",
    "12,77,1000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.",
    "<14>1 2024-03-05T10:11:12Z host app 1 - - NVRM: Xid (PCI:0000:18:00): 79, x",
    "2024-03-05T10:11:12.000000000Z stdout F NVRM: Xid (PCI:0000:18:00): 79, x",
    '{"_TRANSPORT":"stdout","SYSLOG_IDENTIFIER":"kernel","MESSAGE":"NVRM: Xid (PCI:0000:18:00): 79, x"}',
    "user  :warn  : [ 12.0] NVRM: Xid (PCI:0000:18:00): 79, x",
    # an application's log with an ISO stamp (not dmesg's "T…,ffffff+hh:mm" shape) and no tag
    "2024-03-05 10:11:12.123 ERROR [1514002:1514004] NVRM: Xid (PCI:0000:18:00): 79, x",
    "1709633472.117215 NVRM: Xid (PCI:0000:18:00): 79, x",
])
def test_other_programs_lines_are_never_events(line):
    assert parse_kernel_line(line) is None
    p = KernelLineParser()
    assert p.feed_all(line) == [] and p.lines_foreign == 1


def test_a_wrapped_foreign_line_stays_foreign():
    p = KernelLineParser()
    assert p.feed_all("Mar  5 10:11:12 host sshd[1]: Invalid user x from") == []
    assert p.feed_all("NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.") == []
    assert p.lines_foreign == 2


def test_bare_lines_in_a_syslog_stream_do_not_count_after_a_break():
    p = KernelLineParser()
    p.feed_all("Mar  5 10:11:12 host kernel: usb 1-1: new device")
    p.feed_all("")
    assert p.feed_all("NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.") == []


def test_kmsg_record_with_dictionary_read_whole():
    rec = ("3,4021,98765432,-;pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:01:00.0\n"
           " SUBSYSTEM=pci\n DEVICE=+pci:0000:00:01.0")
    ev = parse_kernel_line(rec, boot_time=BOOT)
    assert ev and (ev.kind, ev.pci_addr, ev.severity) == ("aer", "0000:00:01.0", "non-fatal")
    assert ev.ts == pytest.approx(BOOT + 98.765432) and "\n" not in ev.line
    st = split_prefix(rec)
    assert st.kmsg_seq == 4021 and dict(st.fields) == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:00:01.0"}
    # no address in the text: the dictionary's DEVICE gives it
    ev = parse_kernel_line("4,9,10,-;mlx5_core: Link down\n SUBSYSTEM=pci\n DEVICE=+pci:0000:53:00.0")
    assert ev and ev.kind == "other" and ev.pci_addr == "0000:53:00.0"


def test_read_kmsg_one_record_per_read(tmp_path, monkeypatch):
    """``/dev/kmsg`` hands out one record per read(2), dictionary lines included; EPIPE means the ring
    wrapped. A fake descriptor plays the device."""
    reads = [
        b"6,10,1000000,-;usb 1-1: new device\n",
        b"3,11,2000000,-;pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: 0000:00:02.0\n"
        b" SUBSYSTEM=pci\n DEVICE=+pci:0000:00:02.0\n",
        OSError(errno.EPIPE, "Broken pipe"),  # the ring wrapped: records 12..14 were overwritten
        b"12,15,2500000,-;NVRM: Xid (PCI:0000:18:00): 79, forged by a user-space writer\n",
        b"3,16,3000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n",
        BlockingIOError(),
    ]

    def fake_read(fd, n):
        item = reads.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    f = KernelLogFollower(tmp_path / "kmsg", state_path=tmp_path / "s.json", boot_time=BOOT)
    f._is_kmsg, f._fd = True, 99
    monkeypatch.setattr(kernel_follow.os, "read", fake_read)
    evs = f.poll()
    assert [(e.kind, e.pci_addr) for e in evs] == [("aer", "0000:00:02.0"), ("xid", "0000:3b:00.0")]
    assert evs[0].severity == "fatal" and f._kmsg_seq == 16
    assert (f.ring_wraps, f.records_lost) == (1, 3)  # lost records counted by the sequence gap
    assert f.parser.lines_foreign == 1
    f._fd = None


def test_kmsg_file_with_separate_dictionary_lines():
    p = KernelLineParser(boot_time=BOOT)
    lines = ["4,9,10,-;mlx5_core: Link down", " SUBSYSTEM=pci", " DEVICE=+pci:0000:53:00.0"]
    evs = [e for x in lines for e in p.feed_all(x)]
    assert len(evs) == 1 and evs[0].pci_addr == "0000:53:00.0"


def test_dmesg_H_deltas_count_from_the_last_stamp():
    p = KernelLineParser(year_hint=2024)
    p.feed_all("[Mar 5 10:11] usb 1-1: x")
    ev = p.feed_all("[  +2.500000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")[0]
    ev2 = p.feed_all("[  +0.500000] NVRM: Xid (PCI:0000:3b:00): 45, pid=1, Ch 1")[0]
    base = datetime(2024, 3, 5, 10, 11).timestamp()
    assert ev.ts == pytest.approx(base + 2.5) and ev2.ts == pytest.approx(base + 3.0)


def test_months_in_other_languages():
    assert [month_number(m) for m in ("Jan", "janv.", "Okt", "set", "фев", "11月", "Dez", "août", "Xyz")] == [
        1, 1, 10, 9, 2, 11, 12, 8, None]
    st = split_prefix("set 09 14:54:33 pop-os kernel: pcieport 0000:03:07.0: PCIe Bus Error: severity=>",
                      year_hint=2024)
    assert st.origin == "kernel" and st.ts == datetime(2024, 9, 9, 14, 54, 33).timestamp()


def test_joined_syslog_records_are_read_one_by_one():
    line = ("kernel: {37}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 162 "
            "kernel: {37}[Hardware Error]: event severity: recoverable kernel: {37}[Hardware Error]:  Error 0, "
            "type: recoverable kernel: {37}[Hardware Error]:   section_type: memory error")
    p = KernelLineParser()
    evs = p.feed_all(line)
    assert [e.message.split("]:", 1)[1].strip()[:14] for e in evs] == [
        "Hardware error", "event severity", "Error 0, type:", "section_type: "]
    assert [e.severity for e in evs] == [None, "recoverable", "recoverable", "recoverable"]


def test_ghes_record_severity_reaches_its_lines():
    lines = ["[ 5.0] {1}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 4",
             "[ 5.0] {1}[Hardware Error]: event severity: corrected",
             "[ 5.0] {1}[Hardware Error]:   section_type: memory error",
             "[ 9.0] {2}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 4",
             "[ 9.0] {2}[Hardware Error]: event severity: fatal",
             "[ 9.0] {2}[Hardware Error]:   section_type: memory error",
             "[ 9.0] {2}[Hardware Error]:   node: 1 card: 4 module: 0 rank: 0 bank: 1"]
    p = KernelLineParser()
    evs = [e for x in lines for e in p.feed_all(x)]
    assert [(e.kind, e.severity) for e in evs] == [("other", None), ("other", "corrected"), ("other", "corrected"),
                                                   ("other", None), ("other", "fatal"), ("other", "fatal"),
                                                   ("other", "fatal")]


@pytest.mark.parametrize(("line", "pci", "sev"), [
    ("[ 38.1] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt",
     "0000:04:00.0", "non-fatal"),
    ("[ 38.1] nvidia-nvswitch0: SXid (PCI:0000:86:00.0): 24007, Fatal, Link 12 sourcetrack TCEN0 crumbstore ECC",
     "0000:86:00.0", "fatal"),
    ("[ 38.1] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Severity 0 Engine instance 44", "0000:04:00.0",
     None),
    ("[ 4435.1] mlx5_core 0000:53:00.0 enp83s0f0np0: Link down", "0000:53:00.0", None),
    ("[ 22.3] mlx5_core 0000:63:00.0: 63.008 Gb/s available PCIe bandwidth, limited by 8.0 GT/s PCIe x8 link at "
     "0000:60:01.0 (capable of 252.048 Gb/s with 16.0 GT/s PCIe x16 link)", "0000:63:00.0", None),
    ("[ 22.3] mlx5_core 0000:0c:00.0: Port module event[error]: module 0, Cable error, Bus stuck (I2C or data "
     "shorted)", "0000:0c:00.0", None),
    ("[ 22.3] ixgbe 0000:81:00.0 enp129s0f0: NIC Link is Down", "0000:81:00.0", None),
    ("[ 24.3] NVRM: GPU6 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 812751949", None, None),
    ("[ 101.2] NVRM: GPU 0000:a1:00.0: RmInitAdapter failed! (0x62:0x40:2168)", "0000:a1:00.0", None),
    ("[ 373871.3] NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED] "
     "(0x00000062) returned from status @ kernel_channel.c:2827", None, None),
    ("[ 5.0] nvidia: probe of 0000:01:00.0 failed with error -1", None, None),
])
def test_family_lines_are_kept_as_other(line, pci, sev):
    ev = parse_kernel_line(line)
    assert ev is not None and ev.kind == "other" and ev.pci_addr == pci and ev.severity == sev
    assert ev.message == split_prefix(line).msg


def test_carrier_state_from_networkd_and_networkmanager_only():
    lines = ["Oct 23 16:45:27 san-jose systemd-networkd[1217]: enp129s0f0: Lost carrier",
             "Oct 23 16:45:29 san-jose systemd-networkd[1217]: enp129s0f0: Gained carrier",
             "Oct 23 16:45:30 san-jose NetworkManager[900]: <info>  [1698079530.1] device (eth0): carrier: link "
             "connected",
             "Oct 23 16:45:31 san-jose evil[66]: enp129s0f0: Lost carrier",
             "Oct 23 16:45:32 san-jose systemd-networkd[1217]: enp129s0f0: DHCP lease lost"]
    p = KernelLineParser(year_hint=2024)
    evs = [e for x in lines for e in p.feed_all(x)]
    assert [e.message for e in evs] == ["systemd-networkd: enp129s0f0: Lost carrier",
                                        "systemd-networkd: enp129s0f0: Gained carrier",
                                        "NetworkManager: <info>  [1698079530.1] device (eth0): carrier: link "
                                        "connected"]
    assert all(e.kind == "other" for e in evs) and p.lines_foreign == 5


def test_benign_lines_give_nothing():
    for line in ["[ 1.0] EDAC MC0: Giving out device to module i10nm_edac",
                 "[ 2.0] mlx5_core 0000:0c:00.0: Port module event: module 0, Cable plugged",
                 "[ 3.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
                 "[ 4.0] IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
                 "[ 5.0] ata6: SATA link down (SStatus 4 SControl 300)"]:
        assert parse_kernel_line(line) is None, line


def test_over_long_lines_are_cut_and_counted():
    p = KernelLineParser()
    hostile = "[ 1.0] NVRM: GSP " + "GSP " * (1 << 18)  # 1 MiB
    evs = p.feed_all(hostile)
    assert p.lines_cut == 1 and all(len(e.line) <= MAX_LINE for e in evs)
    assert p.feed_all("[ 2.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception")[0].xid == 13


def test_wrapped_line_read_with_its_continuation():
    p = KernelLineParser()
    first = p.feed_all("[ 812.1] NVRM: Xid (PCI:0000:3b:00):")
    rest = p.feed_all("79, pid=2211, GPU has fallen off the bus.")
    assert [e.kind for e in first] == ["other"] and [(e.kind, e.xid) for e in rest] == [("xid", 79)]


def test_a_line_with_its_bracket_cut_off():
    ev = parse_kernel_line(" 4428.423595] mlx5_core 0000:53:00.0 enp83s0f0np0: Link up", boot_time=BOOT)
    assert ev and ev.ts == pytest.approx(BOOT + 4428.423595)


def test_follower_reads_journal_short_precise_file(tmp_path):
    log = tmp_path / "messages"
    log.write_text((FIX / "syslog-rfc3164.log").read_text())
    f = KernelLogFollower(log, state_path=tmp_path / "p.json", year_hint=2024)
    assert sorted(e.kind for e in f.poll()) == ["aer", "xid"]
    f.close()
    os.remove(log)


def test_terminal_colour_codes_are_dropped():
    line = "\x1b[32m[  812.117215]\x1b[0m \x1b[33mNVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\x1b[0m"
    ev = parse_kernel_line(line, boot_time=BOOT)
    assert ev and ev.xid == 79 and ev.ts == pytest.approx(BOOT + 812.117215)


def test_spoofed_syslog_file_through_follower_and_engine_raises_nothing(tmp_path):
    """security review F7's reproduction: a combined syslog file followed as the kernel log, where
    anyone who can reach sshd, run a job or call sudo writes text that looks like kernel failures."""
    from detectors.engine.engine import DetectorEngine
    from fleethealth.schema import Sample

    log = tmp_path / "messages"
    log.write_text(
        "Mar  5 10:11:12 gpu-node-007 sshd[4242]: Invalid user NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off "
        "the bus. from 203.0.113.9 port 40022\n"
        "Mar  5 10:11:12 gpu-node-007 myjob[99]: NVRM: Xid (PCI:0000:18:00): 48, An uncorrectable double bit error\n"
        "Mar  5 10:11:13 gpu-node-007 sudo: alice : user NOT in sudoers ; COMMAND=/bin/echo mce: [Hardware Error]: "
        "CPU 0: Machine Check: 0 Bank 5: be00000000800400 uncorrected\n"
        "Mar  5 10:11:14 gpu-node-007 logger: pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: "
        "0000:00:02.0\n")
    f = KernelLogFollower(log, state_path=tmp_path / "p.json", year_hint=2024)
    evs = f.poll()
    assert evs == [] and f.parser.lines_foreign == 4
    eng = DetectorEngine()
    s = Sample(host="gpu-node-007", ts=LOCAL + 10, seq=1, collector_version="t", kernel_events=evs)
    assert eng.feed(s) == [] and eng.flush() == []
    # the same lines written by the kernel do raise incidents (the test can fail)
    with open(log, "a") as fh:
        fh.write("Mar  5 10:11:15 gpu-node-007 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off "
                 "the bus.\n")
    evs = f.poll()
    s2 = Sample(host="gpu-node-007", ts=LOCAL + 20, seq=2, collector_version="t", kernel_events=evs)
    assert "gpu_fell_off_bus" in {i.failure_mode for i in eng.feed(s2) + eng.flush()}
