"""A bounded, append-only, on-disk spool: the collector's write-ahead queue to the bus.

Every sample is appended (and fsync'd) before it is sent; the sender reads records in order and
acknowledges the ones the bus accepted, so a broker outage or a collector crash loses nothing
and replay order is append order. Records live in segment files ``seg-<first record number>.spool``;
each record is ``len:u32 crc32:u32 key_len:u16 key value``. A torn last record (crash mid-write)
fails its CRC and is counted and dropped, not replayed. When the spool is over ``max_bytes`` the
oldest whole segment is deleted and its unsent records are counted in :attr:`dropped` -- the only
way data is lost, and only when the bound is hit.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import zlib
from pathlib import Path

log = logging.getLogger(__name__)
_HEAD = struct.Struct("<IIH")


class Spool:
    def __init__(self, directory: str | Path, *, max_bytes: int = 256 << 20, segment_bytes: int | None = None,
                 fsync: bool = True) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or max(4096, min(8 << 20, max_bytes // 8))
        self.fsync = fsync
        self.dropped = 0  # records deleted unsent because the bound was hit
        self.corrupt = 0  # torn / corrupt records skipped on read
        self._lock = threading.Lock()
        self._cursor_path = self.dir / "cursor.json"
        self._segments: list[tuple[int, Path]] = sorted(
            (int(p.stem.split("-")[1]), p) for p in self.dir.glob("seg-*.spool")
        )
        self._counts: dict[Path, int] = {p: self._count(p) for _, p in self._segments}
        self._read_seg, self._read_rec, self._read_off = self._load_cursor()
        self._peek_sizes: list[int] = []
        self._next = (self._segments[-1][0] + self._counts[self._segments[-1][1]]) if self._segments else 0
        self._fh = None

    # ------------------------------------------------------------------ persistence

    def _load_cursor(self) -> tuple[int, int, int]:
        try:
            d = json.loads(self._cursor_path.read_text())
            return int(d["segment"]), int(d["record"]), int(d.get("offset", -1))
        except (OSError, ValueError, KeyError, TypeError):
            return (self._segments[0][0] if self._segments else 0), 0, 0

    def _save_cursor(self) -> None:
        tmp = self._cursor_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"segment": self._read_seg, "record": self._read_rec, "offset": self._read_off}))
        os.replace(tmp, self._cursor_path)

    def _records(self, path: Path, offset: int = 0, limit: int | None = None,
                 sizes: list[int] | None = None) -> list[tuple[str, bytes]]:
        out: list[tuple[str, bytes]] = []
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return out
        pos = 0
        while pos + _HEAD.size <= len(data) and (limit is None or len(out) < limit):
            n, crc, klen = _HEAD.unpack_from(data, pos)
            body = data[pos + _HEAD.size: pos + _HEAD.size + n]
            if len(body) != n or zlib.crc32(body) != crc or klen > n:
                self.corrupt += 1
                break
            out.append((body[:klen].decode(errors="replace"), bytes(body[klen:])))
            if sizes is not None:
                sizes.append(_HEAD.size + n)
            pos += _HEAD.size + n
        return out

    def _count(self, path: Path) -> int:
        return len(self._records(path))

    # ------------------------------------------------------------------ API

    def append(self, key: str, value: bytes) -> None:
        kb = key.encode()[:65535]
        body = kb + value
        rec = _HEAD.pack(len(body), zlib.crc32(body), len(kb)) + body
        with self._lock:
            if not self._segments or self._segments[-1][1].stat().st_size >= self.segment_bytes:
                self._roll()
            _, path = self._segments[-1]
            if self._fh is None:
                self._fh = open(path, "ab")  # noqa: SIM115 - kept open across appends
            self._fh.write(rec)
            self._fh.flush()
            if self.fsync:
                os.fsync(self._fh.fileno())
            self._counts[path] += 1
            self._next += 1
            self._enforce_bound()

    def _roll(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        path = self.dir / f"seg-{self._next:020d}.spool"
        path.touch()
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
            if self._fh is not None:
                self._fh.flush()
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
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            self._save_cursor()
