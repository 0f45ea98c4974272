"""Follow the kernel log: ``/dev/kmsg``, a log file, or ``journalctl -k -f`` output.

The read position survives restarts in a small JSON state file (written to a temp file and
``os.replace``d): for a file, its inode and byte offset; for ``/dev/kmsg``, the last record
sequence number and the boot id (a new boot restarts the sequence). A file that was rotated (inode
changed) is read to its end through the still-open descriptor, then the new file is read from
its start; a file that shrank on the same inode (``copytruncate``) is read from 0. Lines longer than
``max_line`` bytes are cut and counted. A half-written last line stays unread until its newline
arrives.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleethealth.schema import KernelEvent
from parsers.kernel_log import MAX_LINE, KernelLineParser

log = logging.getLogger(__name__)


def _write_state(path: Path | None, state: dict[str, Any]) -> None:
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def _read_state(path: Path | None) -> dict[str, Any]:
    if path is None or not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        log.warning("kernel-log state file unreadable, starting from the current end", extra={"path": str(path)})
        return {}


class KernelLogFollower:
    """Non-blocking: :meth:`poll` returns the events logged since the last call."""

    def __init__(
        self,
        path: str | Path = "/dev/kmsg",
        *,
        state_path: str | Path | None = None,
        boot_time: float | None = None,
        boot_id: str = "",
        max_line: int = MAX_LINE,
        start_at_end: bool = False,
        year_hint: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.state_path = Path(state_path) if state_path else None
        self.boot_id = boot_id
        self.max_line = max_line
        self.parser = KernelLineParser(boot_time=boot_time, year_hint=year_hint)
        self.lines_truncated = 0
        self.records_lost = 0  # /dev/kmsg records overwritten before we read them (the sequence-number gap)
        self.ring_wraps = 0  # EPIPE: the ring wrapped past our position (once per wrap, however many were lost)
        self.rotations = 0
        self._fd: int | None = None
        self._ino: int | None = None
        self._off = 0
        self._kmsg_seq = -1
        self._start_at_end = start_at_end
        self._is_kmsg = False
        self._carry = b""
        self._head = b""  # first bytes of the file: a copytruncate that refills past our offset changes them
        self._restore()

    # ------------------------------------------------------------------ state

    def _restore(self) -> None:
        st = _read_state(self.state_path)
        try:
            self._is_kmsg = stat.S_ISCHR(os.stat(self.path).st_mode)
        except OSError:
            self._is_kmsg = False
        if self._is_kmsg:
            if st.get("boot_id") == self.boot_id and isinstance(st.get("kmsg_seq"), int):
                self._kmsg_seq = st["kmsg_seq"]
            return
        if isinstance(st.get("ino"), int) and isinstance(st.get("offset"), int):
            self._ino, self._off = st["ino"], st["offset"]
            self._head = bytes.fromhex(st.get("head", "")) if isinstance(st.get("head"), str) else b""
            self._resume_file()
        elif self._start_at_end:
            self._open_file(at_end=True)

    def save(self) -> None:
        if self._is_kmsg:
            _write_state(self.state_path, {"boot_id": self.boot_id, "kmsg_seq": self._kmsg_seq})
        elif self._ino is not None:
            _write_state(self.state_path, {"ino": self._ino, "offset": self._off, "head": self._head.hex()})

    def _resume_file(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        if st.st_ino == self._ino and st.st_size >= self._off:
            head = self._head
            self._open_file(at_end=False, offset=self._off)
            self._head = head
            return
        # Rotated while we were down: the old inode may live on as PATH.1 (logrotate's default).
        old = self.path.with_name(self.path.name + ".1")
        try:
            ost = os.stat(old)
            if ost.st_ino == self._ino and ost.st_size >= self._off:
                fd = os.open(old, os.O_RDONLY)
                os.lseek(fd, self._off, os.SEEK_SET)
                self._fd = fd
                return  # poll() drains it, then notices the inode change and switches
        except OSError:
            pass
        self._open_file(at_end=False, offset=0)

    def _open_file(self, *, at_end: bool, offset: int = 0) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            self._fd = None
            return
        st = os.fstat(fd)
        self._fd, self._ino = fd, st.st_ino
        self._off = st.st_size if at_end else offset
        os.lseek(fd, self._off, os.SEEK_SET)
        self._carry = b""
        self._head = os.pread(fd, min(64, self._off), 0) if self._off else b""

    # ------------------------------------------------------------------ reading

    def poll(self, max_lines: int = 100_000) -> list[KernelEvent]:
        lines = self._read_kmsg(max_lines) if self._is_kmsg else self._read_file(max_lines)
        out = []
        for raw in lines:
            out.extend(self.parser.feed_all(raw))
        self.save()
        return out

    def _read_file(self, max_lines: int) -> list[str]:
        out: list[str] = []
        if self._fd is None:
            self._open_file(at_end=False, offset=0)
            if self._fd is None:
                return out
        # Truncated or rewritten in place (copytruncate): start over before reading anything.
        if os.fstat(self._fd).st_size < self._off or self._replaced():
            self.rotations += 1
            os.lseek(self._fd, 0, os.SEEK_SET)
            self._off, self._carry, self._head = 0, b"", b""
        self._drain(out, max_lines)
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return out  # between rotate's rename and create: keep the old descriptor
        if st.st_ino != os.fstat(self._fd).st_ino:  # rotated: old file drained above, now the new one
            self.rotations += 1
            os.close(self._fd)
            self._open_file(at_end=False, offset=0)
            self._drain(out, max_lines)
        return out

    def _replaced(self) -> bool:
        assert self._fd is not None
        return bool(self._head) and os.pread(self._fd, len(self._head), 0) != self._head

    def _drain(self, out: list[str], max_lines: int) -> None:
        assert self._fd is not None
        while len(out) < max_lines:
            chunk = os.read(self._fd, 65536)
            if not chunk:
                break
            buf = self._carry + chunk
            start = 0
            while True:
                nl = buf.find(b"\n", start)
                if nl < 0:
                    break
                out.append(self._cut(buf[start:nl]))
                self._off += nl + 1 - start
                start = nl + 1
            rest = buf[start:]
            if len(rest) > self.max_line:  # a runaway line with no newline in sight
                out.append(self._cut(rest))
                self._off += len(rest)
                rest = b""
            self._carry = rest
        if len(self._head) < 64 and self._off > len(self._head):
            self._head = os.pread(self._fd, min(64, self._off), 0)

    def _cut(self, raw: bytes) -> str:
        if len(raw) > self.max_line:
            self.lines_truncated += 1
            raw = raw[: self.max_line]
        return raw.decode("utf-8", errors="replace")

    def _read_kmsg(self, max_lines: int) -> list[str]:
        out: list[str] = []
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        while len(out) < max_lines:
            try:
                rec = os.read(self._fd, 16384)  # one record per read on /dev/kmsg
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # ring buffer wrapped past our position
                    self.ring_wraps += 1
                    continue
                raise
            if not rec:
                break
            text = self._cut(rec.rstrip(b"\n"))
            head = text.split(";", 1)[0].split(",")
            try:
                seq = int(head[1])
            except (IndexError, ValueError):
                seq = self._kmsg_seq + 1
            if seq <= self._kmsg_seq:
                continue  # already read before a restart
            if self._kmsg_seq >= 0 and seq > self._kmsg_seq + 1:
                self.records_lost += seq - self._kmsg_seq - 1
            self._kmsg_seq = seq
            out.append(text)
        return out

    def close(self) -> None:
        self.save()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class JournalFollower:
    """``journalctl -k -f -o short-iso --cursor-file=STATE``: journald keeps the position for us.

    For hosts where ``/dev/kmsg`` cannot be read (a container) but the journal can. Nothing is
    dropped: complete lines beyond ``max_lines`` wait for the next poll, a half-written last line
    waits for its newline. A line longer than ``max_line`` bytes is cut, counted
    (``lines_truncated``), and the rest of it is skipped rather than read as a line of its own.
    A journalctl that exits (journald restarted, an OOM kill) is started again on the next poll
    from its cursor file, logged and counted (``restarts``); one that cannot be started raises
    ``OSError`` (the collector reports the kernel log as a failed source)."""

    def __init__(self, cursor_file: str | Path, *, argv: Sequence[str] | None = None, max_line: int = MAX_LINE) -> None:
        self.cursor_file = Path(cursor_file)
        self.argv = list(argv) if argv else ["journalctl", "-k", "-f", "-o", "short-iso", "--no-pager"]
        self.max_line = max_line
        self.parser = KernelLineParser()
        self.restarts = 0
        self.lines_truncated = 0
        self._carry = b""
        self._skipping = False  # inside the tail of a line already cut
        self._queue: list[bytes] = []  # complete lines not handed out yet
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([*self.argv, f"--cursor-file={self.cursor_file}"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        return proc

    def _read(self) -> bytes:
        assert self.proc.stdout is not None
        fd, chunks = self.proc.stdout.fileno(), []
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not data:  # EOF: journalctl is gone
                break
            chunks.append(data)
        return b"".join(chunks)

    def _split(self, data: bytes) -> None:
        buf = self._carry + data
        if self._skipping:
            nl = buf.find(b"\n")
            if nl < 0:
                self._carry = b""
                return
            buf, self._skipping = buf[nl + 1:], False
        *lines, self._carry = buf.split(b"\n")
        for raw in lines:
            if len(raw) > self.max_line:
                raw = raw[:self.max_line]
                self.lines_truncated += 1
            self._queue.append(raw)
        if len(self._carry) > self.max_line:  # no newline in sight: cut it, skip the rest of it
            self._queue.append(self._carry[:self.max_line])
            self.lines_truncated += 1
            self._carry, self._skipping = b"", True

    def poll(self, max_lines: int = 100_000) -> list[KernelEvent]:
        self._split(self._read())
        rc = self.proc.poll()
        if rc is not None:
            self._split(self._read())  # what it wrote before it went
            self.restarts += 1
            log.warning("journalctl exited with status %s; starting it again from %s", rc, self.cursor_file)
            self.proc = self._start()
        take, self._queue = self._queue[:max_lines], self._queue[max_lines:]
        out = []
        for raw in take:
            out.extend(self.parser.feed_all(raw.decode("utf-8", errors="replace")))
        return out

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
