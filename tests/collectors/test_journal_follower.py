"""JournalFollower: the kernel log through ``journalctl -k -f`` (for hosts where /dev/kmsg cannot
be read). The stand-in for journalctl is a small script given as ``argv``: it writes journal lines
(``-o short-iso``) the way journalctl does, in pieces, and can exit like a killed journalctl."""

from __future__ import annotations

import shutil
import sys
import textwrap
import time
from pathlib import Path

import pytest

from collectors.kernel_follow import JournalFollower

XID = "2026-11-30T16:00:{s:02d}+0000 gpu-node-7 kernel: NVRM: Xid (PCI:0000:{bus:02x}:00): 79, pid=1234, " \
      "name=python, GPU has fallen off the bus."


def _script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "fake_journalctl.py"
    path.write_text("import sys, time\n" + textwrap.dedent(body))
    return [sys.executable, str(path)]


def _poll_until(f: JournalFollower, want: int, max_lines: int = 100_000, timeout: float = 10.0) -> list:
    out: list = []
    end = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < end:
        out += f.poll(max_lines=max_lines)
        time.sleep(0.02)
    return out


def test_lines_in_pieces_and_over_max_lines_all_arrive_in_order(tmp_path: Path) -> None:
    lines = [XID.format(s=i, bus=0x18 + i) for i in range(30)]
    blob = "\n".join(lines) + "\n"
    argv = _script(tmp_path, f"""
        blob = {blob!r}
        for i in range(0, len(blob), 37):  # a pipe delivers whatever was written, mid-line included
            sys.stdout.write(blob[i:i + 37]); sys.stdout.flush(); time.sleep(0.001)
        time.sleep(60)
    """)
    f = JournalFollower(tmp_path / "cursor", argv=argv)
    try:
        got = _poll_until(f, 30, max_lines=7)  # at most 7 lines a poll: the rest wait, none is lost
        assert [e.xid for e in got] == [79] * 30
        assert [e.pci_addr for e in got] == [f"0000:{0x18 + i:02x}:00.0" for i in range(30)]
        assert f.restarts == 0 and f.lines_truncated == 0
    finally:
        f.close()
    assert "--cursor-file=" + str(tmp_path / "cursor") in " ".join(f.proc.args)  # type: ignore[arg-type]


def test_an_overlong_line_is_cut_counted_and_its_tail_not_read_as_a_line(tmp_path: Path) -> None:
    tail = "X" * 5000 + " NVRM: Xid (PCI:0000:99:00): 48, pid=1, DBE"  # would parse if read alone
    argv = _script(tmp_path, f"""
        sys.stdout.write({XID.format(s=1, bus=0x18)!r} + {tail!r} + "\\n")
        sys.stdout.write({XID.format(s=2, bus=0x2a)!r} + "\\n"); sys.stdout.flush()
        time.sleep(60)
    """)
    f = JournalFollower(tmp_path / "cursor", argv=argv, max_line=1024)
    try:
        got = _poll_until(f, 2)
        assert [(e.xid, e.pci_addr) for e in got] == [(79, "0000:18:00.0"), (79, "0000:2a:00.0")]
        assert f.lines_truncated == 1
    finally:
        f.close()


def test_a_journalctl_that_exits_is_restarted_and_counted(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    argv = _script(tmp_path, f"""
        from pathlib import Path
        runs = Path({str(runs)!r}); n = len(runs.read_text()) if runs.exists() else 0
        runs.write_text("x" * (n + 1))
        sys.stdout.write({XID.format(s=3, bus=0x18)!r}.replace(":03+", ":0" + str(n) + "+") + "\\n")
        sys.stdout.flush()
        sys.exit(1 if n == 0 else time.sleep(60))  # the first one dies (OOM-killed, journald restart)
    """)
    f = JournalFollower(tmp_path / "cursor", argv=argv)
    try:
        got = _poll_until(f, 2)
        assert len(got) == 2 and f.restarts == 1  # its last line kept, then the new one's
        assert runs.read_text() == "xx"
    finally:
        f.close()


def test_a_journalctl_that_cannot_start_is_an_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        JournalFollower(tmp_path / "cursor", argv=[str(tmp_path / "no-such-journalctl")])


@pytest.mark.skipif(shutil.which("journalctl") is None, reason="no journalctl on this machine")
def test_the_real_journalctl_runs_and_is_followed(tmp_path: Path) -> None:
    """The real binary with our arguments (this machine has no journald: it waits, writes nothing)."""
    f = JournalFollower(tmp_path / "cursor")
    try:
        time.sleep(0.5)
        assert f.poll() == [] and f.restarts == 0 and f.proc.poll() is None
    finally:
        f.close()


def test_the_collector_follows_the_journal_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import collectors.daemon as daemon

    made: list[Path] = []

    class Spy(JournalFollower):
        def __init__(self, cursor_file: Path, **kw: object) -> None:
            made.append(Path(cursor_file))
            super().__init__(cursor_file, argv=_script(tmp_path, "time.sleep(60)\n"))

    monkeypatch.setattr(daemon, "JournalFollower", Spy)
    c = daemon.Collector(daemon.CollectorSettings(host="h", kmsg_path="journal", state_dir=str(tmp_path / "st"),
                                                  sysfs_root=str(tmp_path), proc_root=str(tmp_path)),
                         sink=_NullSink())
    try:
        assert isinstance(c.kernel, JournalFollower) and made == [tmp_path / "st" / "journal.cursor"]
        assert "kernel_log" not in {e.source for e in c.poll_once().source_errors}
    finally:
        c.close()


class _NullSink:
    def send_batch(self, records: list[tuple[str, bytes]]) -> int:
        return len(records)

    def close(self) -> None:
        return None
