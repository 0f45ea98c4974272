"""The bus: one small interface, four implementations.

* :class:`InProcessBus` — the embedded default: topics in memory, consumer groups with committed
  offsets, partitions by key hash (so per-host order holds exactly as on Kafka).
* :class:`JsonlBus` — newline-delimited JSON files (``.jsonl`` or ``.jsonl.gz``): recordings,
  replay files, ``--sink jsonl:PATH``.
* Apache Kafka: :class:`fleethealth.kafka_confluent.ConfluentBus` (confluent-kafka, librdkafka; the
  default) or :class:`fleethealth.kafka_bus.KafkaBus` (kafka-python), chosen by
  :func:`fleethealth.config.kafka_bus`.

Values are encoded contract messages (bytes); keys are host names.
"""

from __future__ import annotations

import gzip
import io
import threading
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NamedTuple, Protocol, runtime_checkable

from fleethealth.recordings import side_path

TELEMETRY = "fleet.telemetry.v1"
INCIDENTS = "fleet.incidents.v1"
ACTIONS = "fleet.actions.v1"
DEADLETTER = "fleet.deadletter.v1"
TOPICS = (TELEMETRY, INCIDENTS, ACTIONS, DEADLETTER)
DEFAULT_PARTITIONS = 8


class BusError(RuntimeError):
    """The bus could not deliver or read (broker down, file unreadable)."""


class Record(NamedTuple):
    """One consumed message. A named tuple: immutable, and made in one C call where a consumer
    builds thousands a poll (``tuple.__new__(Record, fields)`` in
    :func:`fleethealth.kafka_confluent._record`). A frozen dataclass's ``__init__`` (one
    ``object.__setattr__`` a field) cost 2.1 us a record, against 0.26 us."""

    topic: str
    partition: int
    offset: int
    key: str | None
    value: bytes
    ts: float | None = None
    headers: tuple[tuple[str, bytes], ...] = ()  # Kafka record headers (the collector's signature)


Headers = tuple[tuple[str, bytes], ...]
TP = tuple[str, int]  # (topic, partition)


@runtime_checkable
class PublishAck(Protocol):
    """What ``publish`` may return: a handle on one message's delivery (Kafka's record future).
    A bus that returns None is durable once ``flush`` returns without error."""

    @property
    def is_done(self) -> bool: ...

    def succeeded(self) -> bool: ...


@runtime_checkable
class Consumer(Protocol):
    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[Record]: ...

    def commit(self) -> None:
        """Commit the offsets of everything returned by poll so far."""

    def close(self) -> None: ...


@runtime_checkable
class RebalancingConsumer(Consumer, Protocol):
    """A consumer of a group whose partitions move between members (Kafka): what a stateful
    consumer (the detect worker) needs to rebuild state on a rebalance and to judge lag."""

    def assignment_changes(self) -> list[tuple[str, frozenset[TP]]]:
        """("revoked" | "assigned", partitions) events since the last call."""

    def assigned(self) -> set[TP]:
        """The partitions this member owns now."""

    def committed(self, partitions: Sequence[TP]) -> dict[TP, int | None]:
        """The group's committed offset of each partition (None: never committed)."""

    def history(self, ends: Mapping[TP, int], window_s: float) -> Iterator[Record]:
        """Records of ``window_s`` before each partition's ``end`` offset, up to it, in offset order."""

    def highwater(self, tp: TP) -> int | None:
        """The partition's last known high watermark (no network call); None when unknown."""


@runtime_checkable
class Bus(Protocol):
    def publish(self, topic: str, key: str | None, value: bytes, headers: Headers = ()) -> PublishAck | None: ...

    def flush(self, timeout: float | None = None) -> None: ...

    def consumer(self, topics: Sequence[str], group: str) -> Consumer: ...

    def close(self) -> None: ...


DELIVERY_REPORTS = ("each", "failures")
"""A Kafka bus's ``delivery_reports``: ``each`` (default) -- ``publish`` returns a handle per message,
what a caller that retries or holds offsets until each message is acknowledged needs (the workers,
the collector's spool); ``failures`` -- ``publish`` returns None and ``flush`` raises BusError when a
message since the last flush was not delivered: what a bulk producer that only needs to know that
all of it arrived needs (``replay``), without the cost of a report per message."""


def per_message_reports(mode: str) -> bool:
    if mode not in DELIVERY_REPORTS:
        raise ValueError(f"delivery_reports must be one of {', '.join(DELIVERY_REPORTS)}, not {mode!r}")
    return mode == "each"


def partition_for(key: str | None, partitions: int) -> int:
    """Stable key -> partition (crc32, so it is the same in every process)."""
    if not key:
        return 0
    return zlib.crc32(key.encode()) % partitions


# --------------------------------------------------------------------------- in-process


@dataclass
class _Topic:
    partitions: list[list[Record]]
    base: list[int]  # per partition: the offset of partitions[p][0] (records before it were dropped)
    groups: set[str] = field(default_factory=set)  # groups that ever subscribed to the topic


@dataclass
class _Group:
    committed: dict[tuple[str, int], int] = field(default_factory=dict)


class InProcessBus:
    """Topics in memory. Thread-safe. Consumers of one group share the group's committed offsets;
    an uncommitted poll is seen again by the next consumer of the group (as on Kafka).

    Retention: by default every record is kept (tests and reports read topics back). With
    ``retain_consumed=True`` — what the long-running embedded pipeline uses — a record is dropped
    once every group that has subscribed to its topic has committed past it, so memory follows the
    consumers' lag, not the run's length (Kafka retains by time; an embedded bus cannot afford to).
    A group that subscribes later starts at the oldest record still held, as a Kafka consumer with
    ``auto.offset.reset=earliest`` does after retention ran. Offsets stay absolute."""

    TRIM_MIN = 4096  # drop in chunks: list deletion moves the tail

    def __init__(self, partitions: int = DEFAULT_PARTITIONS, *, retain_consumed: bool = False) -> None:
        self._partitions = partitions
        self.retain_consumed = retain_consumed
        self._topics: dict[str, _Topic] = {}
        self._groups: dict[str, _Group] = {}
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)

    def _topic(self, name: str) -> _Topic:
        t = self._topics.get(name)
        if t is None:
            t = self._topics[name] = _Topic([[] for _ in range(self._partitions)], [0] * self._partitions)
        return t

    def publish(self, topic: str, key: str | None, value: bytes, headers: Headers = ()) -> None:
        with self._cv:
            t = self._topic(topic)
            p = partition_for(key, self._partitions)
            part = t.partitions[p]
            part.append(Record(topic, p, t.base[p] + len(part), key, value, None, tuple(headers)))
            self._cv.notify_all()

    def _trim(self, tps: Iterable[tuple[str, int]]) -> None:
        """Drop what every subscribed group has committed past (lock held)."""
        for name, p in tps:
            t = self._topics.get(name)
            if t is None or not t.groups:
                continue
            done = min(self._groups[g].committed.get((name, p), 0) for g in t.groups)
            k = done - t.base[p]
            if k >= self.TRIM_MIN or (k > 0 and k == len(t.partitions[p])):
                del t.partitions[p][:k]
                t.base[p] += k

    def held(self) -> int:
        """Records held in memory, all topics."""
        with self._lock:
            return sum(len(part) for t in self._topics.values() for part in t.partitions)

    def flush(self, timeout: float | None = None) -> None:
        return None

    def records(self, topic: str) -> list[Record]:
        """Everything on a topic, partition by partition (for tests and reports)."""
        with self._lock:
            t = self._topics.get(topic)
            return [r for part in t.partitions for r in part] if t else []  # what is still held

    def lag(self, group: str, topic: str) -> int:
        """Messages on ``topic`` not yet committed by ``group`` (consumer lag, as Kafka reports it)."""
        with self._lock:
            t = self._topics.get(topic)
            if t is None:
                return 0
            g = self._groups.get(group)
            committed = g.committed if g else {}
            return sum(t.base[p] + len(part) - max(committed.get((topic, p), 0), t.base[p])
                       for p, part in enumerate(t.partitions))

    def consumer(self, topics: Sequence[str], group: str) -> InProcessConsumer:
        with self._lock:
            g = self._groups.setdefault(group, _Group())
            for name in topics:
                self._topic(name).groups.add(group)
        return InProcessConsumer(self, list(topics), g)

    def close(self) -> None:
        return None


class InProcessConsumer:
    def __init__(self, bus: InProcessBus, topics: list[str], group: _Group) -> None:
        self._bus = bus
        self._topics = topics
        self._group = group
        self._position: dict[tuple[str, int], int] = {}
        self._closed = False

    def _pos(self, tp: tuple[str, int], base: int) -> int:
        pos = self._position.get(tp)
        if pos is None or pos < base:  # new, or what it would read next was dropped
            pos = self._position[tp] = max(self._group.committed.get(tp, 0), base)
        return pos

    def _take(self, max_records: int) -> list[Record]:
        out: list[Record] = []
        for name in self._topics:
            t = self._bus._topics.get(name)
            if t is None:
                continue
            for p, part in enumerate(t.partitions):
                tp = (name, p)
                base = t.base[p]
                i = self._pos(tp, base) - base
                if i < len(part):
                    chunk = part[i : i + max_records - len(out)]
                    out.extend(chunk)
                    self._position[tp] = base + i + len(chunk)
                if len(out) >= max_records:
                    return out
        return out

    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[Record]:
        if self._closed:
            raise BusError("consumer is closed")
        with self._bus._cv:
            out = self._take(max_records)
            if not out and timeout > 0:
                self._bus._cv.wait(timeout)
                out = self._take(max_records)
            return out

    def commit(self) -> None:
        with self._bus._lock:
            self._group.committed.update(self._position)
            if self._bus.retain_consumed:
                self._bus._trim(self._position)

    def close(self) -> None:
        self._closed = True


# --------------------------------------------------------------------------- JSONL files


def open_text(path: Path, mode: str) -> IO[str]:
    """Open ``.jsonl`` or ``.jsonl.gz`` for text reading/writing/appending."""
    if path.suffix == ".gz":
        # mtime=0 keeps compressed output byte-identical across runs of the same seed.
        raw = open(path, mode.replace("t", "") + "b")  # noqa: SIM115
        gz = gzip.GzipFile(fileobj=raw, mode=mode[0] + "b", mtime=0)
        return io.TextIOWrapper(gz, encoding="utf-8", newline="\n")
    return open(path, mode, encoding="utf-8", newline="\n")  # noqa: SIM115


READ_BUFFER = 1 << 20  # a 14 KB line through the default 8 KB buffer cost 4x as much to read


class _GunzipSteps(io.RawIOBase):
    """A gzip file as a raw stream of its decompressor's steps (``read1``), under a large
    BufferedReader: a read stops at the step that fails (a truncated tail), so the lines decompressed
    before it are all delivered (a plain read of 1 MiB would drop the whole read). Not ISA-L's
    ``isal.igzip`` (2.7x zlib's speed on a recording): it loses the last ~0.8 MB before a truncation."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__()
        self._gz = gzip.GzipFile(fileobj=raw, mode="rb")

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self._gz.read1(len(b))
        n = len(data)
        b[:n] = data
        return n

    def close(self) -> None:
        self._gz.close()
        super().close()


_WS = b" \t\n\r\x0b\x0c"  # what bytes.strip() strips


def iter_jsonl(path: Path) -> Iterator[tuple[int, bytes]]:
    """Yield (line number, raw line bytes) of non-empty lines; a truncated gzip tail ends the file
    with a BusError naming the line reached, never silently. Read as bytes (no text decode and
    re-encode: that cost more than the JSON parse of a 14 KB sample); a line that is not UTF-8 is
    the decoder's to reject, line by line. Read through 1 MiB buffers (gzip: of the decompressed
    stream too, :class:`_GunzipSteps`), so a line is one copy out of the buffer, not a chain of 8 KB
    reads."""
    with open(path, "rb", buffering=READ_BUFFER) as raw:
        fh: IO[bytes] = io.BufferedReader(_GunzipSteps(raw), buffer_size=READ_BUFFER) if path.suffix == ".gz" else raw
        with fh:
            lineno = 0
            try:
                for lineno, line in enumerate(fh, 1):  # noqa: B007
                    if line[-1] == 10:  # b"\n"
                        line = line[:-1]
                    if line and (line[0] not in _WS or line.strip()):  # strip() only for a line that starts blank
                        yield lineno, line
            except (EOFError, OSError, zlib.error) as exc:
                raise BusError(f"{path}: unreadable after line {lineno}: {exc}") from exc


def topic_path(path: Path, topic: str) -> Path:
    """Telemetry goes to PATH itself; other topics beside it as PATH-stem.<topic>.jsonl."""
    if topic == TELEMETRY:
        return path
    return side_path(path, f"{topic}.jsonl")


class JsonlBus:
    """Append-only JSONL files, one per topic; consumers read them from the start (or from the
    group's committed line, kept in memory for the life of the bus object)."""

    def __init__(self, path: Path | str, *, append: bool = True) -> None:
        self.path = Path(path)
        self._mode = "at" if append else "wt"
        self._files: dict[str, IO[str]] = {}
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, int]] = {}

    def publish(self, topic: str, key: str | None, value: bytes, headers: Headers = ()) -> None:
        """Keys and headers are not kept: a JSONL file is the operator's own recording."""
        with self._lock:
            fh = self._files.get(topic)
            if fh is None:
                p = topic_path(self.path, topic)
                p.parent.mkdir(parents=True, exist_ok=True)
                fh = self._files[topic] = open_text(p, self._mode)
            fh.write(value.decode() + "\n")

    def flush(self, timeout: float | None = None) -> None:
        with self._lock:
            for fh in self._files.values():
                fh.flush()

    def consumer(self, topics: Sequence[str], group: str) -> JsonlConsumer:
        self.flush()
        return JsonlConsumer(self, list(topics), self._groups.setdefault(group, {}))

    def close(self) -> None:
        with self._lock:
            for fh in self._files.values():
                fh.close()
            self._files.clear()


class JsonlConsumer:
    def __init__(self, bus: JsonlBus, topics: list[str], committed: dict[str, int]) -> None:
        self._bus = bus
        self._committed = committed
        self._iters: dict[str, Iterator[tuple[int, bytes]]] = {}
        self._pos: dict[str, int] = {}
        for t in topics:
            p = topic_path(bus.path, t)
            if p.exists():
                self._iters[t] = iter_jsonl(p)
                self._pos[t] = 0
                skip = committed.get(t, 0)
                for _ in range(skip):
                    if next(self._iters[t], None) is None:
                        break
                self._pos[t] = skip

    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[Record]:
        out: list[Record] = []
        for t, it in self._iters.items():
            for _ in range(max_records - len(out)):
                nxt = next(it, None)
                if nxt is None:
                    break
                out.append(Record(t, 0, self._pos[t], None, nxt[1]))
                self._pos[t] += 1
        return out

    def commit(self) -> None:
        self._committed.update(self._pos)

    def close(self) -> None:
        self._iters.clear()


def read_values(path: Path) -> Iterable[bytes]:
    """All message values in a JSONL recording, in file order."""
    for _, raw in iter_jsonl(path):
        yield raw
