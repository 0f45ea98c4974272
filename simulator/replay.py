"""Streaming a recording into the bus: key = host, in file order, at full speed or scaled real time.

A line that is not a sample (not JSON or msgpack, another schema version, a missing or bad host,
ts, seq or collector version) is counted, logged with its line number and published to the
dead-letter topic; replay carries on. The rest of each sample is checked by the detect worker that
reads it (the trust boundary), not here: a strict decode would cost replay four fifths of its CPU. Per-host order is the file's order (a recording is sorted by
ts), and the bus partitions by host, so each host's samples stay in order on Kafka too. ``replay``
opens a Kafka bus with :data:`REPLAY_DELIVERY_REPORTS`: the closing ``flush`` raises BusError when
any message was not delivered (a report per message would cost a sample ~6 us and say no more).

``wire`` is the encoding published (:data:`WIRES`): ``as-recorded`` sends each line's bytes as
they are (JSON, in a recording); ``msgpack`` sends what collectors send to Kafka by default
(fleethealth.config.kafka_wire), ``json`` JSON. Transcoding is a strict decode and the struct's
encode (the bytes a collector would have sent: the detect worker's incremental decoder only reuses
work on that canonical form). A sample the strict decoder does not take as it is (a field to
salvage, an unknown field, an integer past 64 bits) is sent as recorded and counted in
``ReplayStats.as_recorded``: the detect worker refuses or salvages it exactly as from the file.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from fleethealth.bus import DEADLETTER, TELEMETRY, Bus, BusError, iter_jsonl
from fleethealth.deadletter import dead_letter
from fleethealth.errors import UserError
from fleethealth.salvage import has_long_digits
from fleethealth.schema import SAMPLE, ContractError, decode_envelope, encode, encode_packed, is_packed

log = logging.getLogger("fleethealth.replay")
REPLAY_DELIVERY_REPORTS = "failures"  # how `replay` opens a Kafka bus (fleethealth.bus.DELIVERY_REPORTS)
WIRES = ("as-recorded", "msgpack", "json")


def transcoder(wire: str) -> Callable[[bytes], bytes | None] | None:
    """``raw -> the sample in `wire``` (None: the strict decoder does not take it as it is: send
    ``raw`` for the detect worker to refuse or salvage); None for ``as-recorded``."""
    if wire == "as-recorded":
        return None
    if wire not in WIRES:
        raise UserError(f"--wire {wire!r}: use one of {', '.join(WIRES)}")
    to_packed = wire == "msgpack"
    enc = encode_packed if to_packed else encode

    def convert(raw: bytes) -> bytes | None:
        packed = is_packed(raw)
        if packed == to_packed:
            return raw
        if not packed and has_long_digits(raw):  # maybe an integer past 2**64-1: decode_sample salvages it
            return None
        try:  # the struct's own encoding: what collectors send, and the decoder's cache takes
            return enc(SAMPLE.decode(raw))
        except ContractError:
            return None

    return convert


@dataclass
class ReplayStats:
    path: str
    topic: str
    lines: int = 0
    published: int = 0
    invalid: int = 0
    hosts: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    seconds: float = 0.0
    truncated: str = ""  # why reading stopped early (a damaged gzip tail), if it did
    wire: str = "as-recorded"
    as_recorded: int = 0  # samples sent as recorded: the strict decoder does not take them as they are

    @property
    def rate(self) -> float:
        return self.published / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["samples_per_s"] = round(self.rate, 1)
        return d


def replay_file(path: Path, bus: Bus, *, topic: str = TELEMETRY, speed: float = 0.0, limit: int | None = None,
                progress: Callable[[int], None] | None = None, sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic, wire: str = "as-recorded") -> ReplayStats:
    """Publish every valid sample of ``path`` to ``topic`` keyed by host, encoded as ``wire`` says.

    ``speed`` 0 = as fast as the bus takes it; ``speed`` X > 0 = X times real time, paced by the
    samples' own ``ts``.
    """
    convert = transcoder(wire)
    if not path.exists():
        raise UserError(f"{path}: no such recording")
    if speed < 0:
        raise UserError("--speed must be >= 0 (0 = full speed)")
    st = ReplayStats(str(path), topic, wire=wire)
    hosts: set[str] = set()
    t_start = clock()
    pending = 0
    try:
        for lineno, raw in iter_jsonl(path):
            if limit is not None and st.published >= limit:
                break
            st.lines += 1
            try:
                s = decode_envelope(raw)  # the detect worker decodes the rest strictly
            except ContractError as exc:
                st.invalid += 1
                log.warning("skipping invalid line", extra={"path": str(path), "line": lineno, "reason": str(exc)})
                bus.publish(DEADLETTER, None, encode(dead_letter(
                    raw, str(exc), "fleethealth replay", st.last_ts or 0.0, source_topic=f"file:{path.name}",
                    offset=lineno)))
                continue
            if st.first_ts is None:
                st.first_ts = s.ts
            if speed > 0:
                due = (s.ts - st.first_ts) / speed - (clock() - t_start)
                if due > 0:
                    sleep(due)
            if convert is not None:
                out = convert(raw)
                if out is None:
                    st.as_recorded += 1
                    out = raw
                raw = out
            bus.publish(topic, s.host, raw)
            st.last_ts = s.ts
            hosts.add(s.host)
            st.published += 1
            pending += 1
            if progress is not None and pending >= 256:
                progress(pending)
                pending = 0
    except BusError as exc:  # a damaged gzip tail: keep what was read, say why it stopped
        st.truncated = str(exc)
        log.error("recording ends early", extra={"path": str(path), "reason": str(exc)})
    if progress is not None and pending:
        progress(pending)
    bus.flush()
    st.hosts = len(hosts)
    st.seconds = clock() - t_start
    return st
