"""A bounded, append-only, on-disk spool: the collector's write-ahead queue to the bus.

Every sample is appended (and fsync'd) before it is sent; the sender reads records in order and
acknowledges the ones the bus accepted, so a broker outage or a collector crash loses nothing
and replay order is append order. Records live in segment files ``seg-<first record number>.spool``
(other names in the folder are ignored); each record is ``len:u32 crc32:u32 key_len:u16 key value``.

Damage is skipped, never a reason to stop reading:

* a torn last record (crash mid-write) is cut off when the spool is opened, so later appends are
  not written behind it; it is counted in :attr:`corrupt`;
* a corrupt record inside a segment (a flipped byte) is skipped by scanning forward to the next
  record whose header and CRC check out (a resync); every skipped stretch is counted once;
* a failed append (ENOSPC, EIO, a file-size limit) truncates the segment back to where the record
  began and raises :class:`OSError`: nothing half-written stays behind, nothing is counted.

When the spool is over ``max_bytes`` the oldest whole segment is deleted and its unsent records are
counted in :attr:`dropped` -- the only way data is lost, and only when the bound is hit. Files are
created 0600 and the folder 0700 (samples carry kernel-log excerpts; ``dmesg_restrict`` must not be
bypassed through the spool).
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import threading
import zlib
from pathlib import Path

log = logging.getLogger(__name__)
_HEAD = struct.Struct("<IIH")
_SEGMENT = re.compile(r"^seg-(\d{1,20})\.spool$")
_MAX_RECORD = 64 << 20  # a header claiming more is garbage, not a record


def _segments(directory: Path) -> list[tuple[int, Path]]:
    out = []
    for p in directory.glob("seg-*.spool"):
        m = _SEGMENT.match(p.name)
        if m is None:
            log.warning("spool: ignoring a file that is not a segment", extra={"file": str(p)})
            continue
        out.append((int(m.group(1)), p))
    return sorted(out)


def _valid_at(data: bytes, pos: int) -> int:
    """Length of a valid record at ``pos``, or 0."""
    if pos + _HEAD.size > len(data):
        return 0
    n, crc, klen = _HEAD.unpack_from(data, pos)
    if n > _MAX_RECORD or klen > n or pos + _HEAD.size + n > len(data):
        return 0
    body = data[pos + _HEAD.size: pos + _HEAD.size + n]
    return _HEAD.size + n if zlib.crc32(body) == crc else 0


def scan(data: bytes, offset: int = 0) -> tuple[list[tuple[int, int]], list[int], int]:
    """The records of a segment's bytes from ``offset``: ``(records, damaged, end)`` where records
    are ``(start, size)`` of every valid record in order, ``damaged`` the start offsets of skipped
    stretches (a corrupt record and whatever garbage follows it up to the next valid record), and
    ``end`` the end of the last valid record (bytes after it are a torn tail or garbage)."""
    recs: list[tuple[int, int]] = []
    damaged: list[int] = []
    pos = end = offset
    while pos + _HEAD.size <= len(data):
        size = _valid_at(data, pos)
        if size:
            recs.append((pos, size))
            pos = end = pos + size
            continue
        damaged.append(pos)
        nxt = pos + 1
        while nxt + _HEAD.size <= len(data) and not _valid_at(data, nxt):
            nxt += 1
        pos = nxt
    if pos < len(data) and (not damaged or damaged[-1] < end):
        damaged.append(end)  # a short tail (less than a header)
    return recs, damaged, end


class Spool:
    def __init__(self, directory: str | Path, *, max_bytes: int = 256 << 20, segment_bytes: int | None = None,
                 fsync: bool = True) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            os.chmod(self.dir, 0o700)
        except OSError:
            pass
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or max(4096, min(8 << 20, max_bytes // 8))
        self.fsync = fsync
        self.dropped = 0  # records deleted unsent because the bound was hit
        self.corrupt = 0  # torn / corrupt stretches skipped (each counted once)
        self.write_errors = 0  # appends that failed (disk full, I/O error) and were rolled back
        self._seen_damage: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._cursor_path = self.dir / "cursor.json"
        self._segments: list[tuple[int, Path]] = _segments(self.dir)
        if self._segments:
            self._repair_tail(self._segments[-1][1])
        self._counts: dict[Path, int] = {p: self._count(p) for _, p in self._segments}
        self._read_seg, self._read_rec, self._read_off = self._load_cursor()
        self._peek_sizes: list[int] = []
        self._next = (self._segments[-1][0] + self._counts[self._segments[-1][1]]) if self._segments else 0
        self._fd: int | None = None

    # ------------------------------------------------------------------ persistence

    def _repair_tail(self, path: Path) -> None:
        """Cut a torn last record off the segment appends go to (else new records would sit behind
        it and, before the resync, be unreadable)."""
        try:
            data = path.read_bytes()
        except OSError:
            return
        _recs, _damaged, end = scan(data)
        if end < len(data):
            self._note_damage(path, end)
            log.warning("spool: cut a torn record off the last segment",
                        extra={"file": str(path), "bytes": len(data) - end})
            try:
                os.truncate(path, end)
            except OSError:
                log.warning("spool: cannot truncate the torn tail; reading resyncs past it", exc_info=True)

    def _note_damage(self, path: Path, offset: int) -> None:
        key = (path.name, offset)
        if key not in self._seen_damage:
            self._seen_damage.add(key)
            self.corrupt += 1

    def _load_cursor(self) -> tuple[int, int, int]:
        starts = [s for s, _ in self._segments]
        first = starts[0] if starts else 0
        try:
            d = json.loads(self._cursor_path.read_text())
            seg, rec, off = int(d["segment"]), int(d["record"]), int(d.get("offset", -1))
        except (OSError, ValueError, KeyError, TypeError):
            return first, 0, 0
        if starts and seg not in starts:
            # the cursor names a segment that is gone: re-send from the next one that exists (or the
            # oldest) rather than skip records -- a duplicate is better than a loss (seq tells them apart)
            later = [s for s in starts if s > seg]
            log.warning("spool cursor names a missing segment", extra={"segment": seg})
            return (later[0] if later else first), 0, 0
        return seg, rec, off

    def _save_cursor(self) -> None:
        tmp = self._cursor_path.with_suffix(".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, json.dumps({"segment": self._read_seg, "record": self._read_rec,
                                         "offset": self._read_off}).encode())
            finally:
                os.close(fd)
            os.replace(tmp, self._cursor_path)
        except OSError as exc:  # a full disk must not stop sending: the cursor is only a restart hint
            self.write_errors += 1
            log.warning("spool cursor not saved", extra={"error": str(exc)})

    def _records(self, path: Path, offset: int = 0, limit: int | None = None,
                 sizes: list[int] | None = None) -> list[tuple[str, bytes]]:
        out: list[tuple[str, bytes]] = []
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return out
        recs, damaged, _end = scan(data)
        for d in damaged:
            self._note_damage(path, offset + d)
        prev = 0
        for start, size in recs:
            if limit is not None and len(out) >= limit:
                break
            _n, _crc, klen = _HEAD.unpack_from(data, start)
            body = data[start + _HEAD.size: start + size]
            out.append((body[:klen].decode(errors="replace"), bytes(body[klen:])))
            if sizes is not None:
                sizes.append(start + size - prev)  # the bytes this record moves the cursor (skips included)
            prev = start + size
        return out

    def _count(self, path: Path) -> int:
        return len(self._records(path))

    # ------------------------------------------------------------------ API

    def append(self, key: str, value: bytes) -> None:
        """Append one record, durably. Raises OSError (disk full, I/O error) with the segment
        restored to what it was: the record is not counted and nothing torn is left behind."""
        kb = key.encode()[:65535]
        body = kb + value
        rec = _HEAD.pack(len(body), zlib.crc32(body), len(kb)) + body
        with self._lock:
            if not self._segments or self._segments[-1][1].stat().st_size >= self.segment_bytes:
                self._roll()
            _, path = self._segments[-1]
            if self._fd is None:
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            before = os.fstat(self._fd).st_size
            try:
                view = memoryview(rec)
                while view:
                    n = os.write(self._fd, view)
                    view = view[n:]
                if self.fsync:
                    os.fsync(self._fd)
            except OSError:
                self.write_errors += 1
                try:
                    os.ftruncate(self._fd, before)
                finally:
                    os.close(self._fd)
                    self._fd = None
                raise
            self._counts[path] += 1
            self._next += 1
            self._enforce_bound()

    def _roll(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        path = self.dir / f"seg-{self._next:020d}.spool"
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        if self.fsync:
            fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._segments.append((self._next, path))
        self._counts[path] = 0

    def _enforce_bound(self) -> None:
        while len(self._segments) > 1 and self.size_bytes() > self.max_bytes:
            first, path = self._segments.pop(0)
            unsent = self._counts.pop(path, 0)
            if first == self._read_seg:
                unsent -= self._read_rec
            elif first < self._read_seg:
                unsent = 0
            self.dropped += max(0, unsent)
            path.unlink(missing_ok=True)
            if first >= self._read_seg:
                self._read_seg, self._read_rec, self._read_off = self._segments[0][0], 0, 0
                self._save_cursor()
            log.warning("spool over its bound: dropped the oldest segment", extra={"records": unsent})

    def size_bytes(self) -> int:
        total = 0
        for _, p in self._segments:
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                pass
        return total

    def depth(self) -> int:
        """Records appended but not yet acknowledged."""
        with self._lock:
            return sum(
                self._counts.get(p, 0) - (self._read_rec if first == self._read_seg else 0)
                for first, p in self._segments if first >= self._read_seg
            )

    def peek(self, limit: int = 500) -> list[tuple[str, bytes]]:
        """The oldest unacknowledged records, in order."""
        with self._lock:
            out: list[tuple[str, bytes]] = []
            self._peek_sizes = []
            for first, path in self._segments:
                if first < self._read_seg:
                    continue
                if first == self._read_seg:
                    if self._read_off < 0:  # old cursor without a byte offset: find it by counting
                        sizes: list[int] = []
                        self._records(path, 0, self._read_rec, sizes)
                        self._read_off = sum(sizes)
                    recs = self._records(path, self._read_off, limit - len(out), self._peek_sizes)
                else:
                    recs = self._records(path, 0, limit - len(out), self._peek_sizes)
                out.extend(recs)
                if len(out) >= limit:
                    break
            return out

    def ack(self, n: int) -> None:
        """The first ``n`` records of the last :meth:`peek` were delivered."""
        with self._lock:
            while n > 0 and self._segments:
                idx = next((i for i, (f, _) in enumerate(self._segments) if f == self._read_seg), None)
                if idx is None:
                    self._read_seg, self._read_rec, self._read_off = self._segments[0][0], 0, 0
                    continue
                first, path = self._segments[idx]
                left = self._counts.get(path, 0) - self._read_rec
                take = min(n, left)
                self._read_rec += take
                self._read_off += sum(self._peek_sizes[:take])
                self._peek_sizes = self._peek_sizes[take:]
                n -= take
                last = idx == len(self._segments) - 1
                if self._read_rec >= self._counts.get(path, 0) and not last:
                    self._segments.pop(idx)
                    self._counts.pop(path, None)
                    path.unlink(missing_ok=True)
                    self._read_seg, self._read_rec, self._read_off = self._segments[idx][0], 0, 0
                elif take == 0:
                    break
            self._save_cursor()

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._save_cursor()
