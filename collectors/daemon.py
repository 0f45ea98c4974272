"""The collector daemon: poll every source, build one Sample, spool it, send it in order.

Poll loop (this thread): sources -> :class:`Sample` with a per-host ``seq`` persisted in
``state_dir/collector-state.json`` (a restart continues the sequence) -> appended to the
:class:`Spool`. Sender (a second thread): the oldest spooled records -> sink -> acknowledged. So
polling never waits on Kafka, a broker outage fills the spool, and on reconnect the backlog goes
out in order before anything newer. Each source runs isolated: an exception becomes a
``SourceError`` in the sample and a counter, and the other sources still report.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from collectors.kernel_follow import JournalFollower, KernelLogFollower
from collectors.nvml_source import NvmlSource
from collectors.spool import Spool
from collectors.sysfs import (
    ReadStats,
    nvidia_gpu_functions,
    read_boot_id,
    read_boot_time,
    read_edac,
    read_net_ports,
    read_pcie,
)
from fleethealth import __version__
from fleethealth.nvml_pause import released_marker
from fleethealth.schema import MAX_EVENTS, GpuSample, KernelEvent, Sample, SourceError, encode, encode_packed

log = logging.getLogger(__name__)


MAX_KERNEL_EVENTS = MAX_EVENTS  # per sample: the contract's bound on Sample.kernel_events


def _vital(e: KernelEvent) -> bool:
    """An event that names a failure, kept first when a poll brings more than a sample may carry."""
    return e.kind in ("xid", "fell_off_bus", "mce", "edac") or (e.kind == "aer" and e.severity != "corrected")


class Sink(Protocol):
    # the encoding the sink wants new samples in: "msgpack" (Kafka, by default) or "json" (stdout,
    # JSONL). Records already spooled keep the encoding they were written in: every consumer reads
    # both, and a JSON sink writes a spooled msgpack record out as JSON (collectors/sinks.py).
    wire: str

    def send_batch(self, records: list[tuple[str, bytes]]) -> int:
        """Deliver records in order; return how many (a prefix) were accepted. May raise."""
        ...

    def close(self) -> None: ...


@dataclass
class CollectorSettings:
    host: str
    cluster: str = "default"
    rack: str = ""
    expected_gpus: int = 0
    interval: float = 10.0
    jitter: float = 0.0
    sysfs_root: str = "/sys"
    proc_root: str = "/proc"
    kmsg_path: str | None = "/dev/kmsg"
    state_dir: str = "/var/lib/fleethealth"
    spool_dir: str | None = None
    spool_max_bytes: int = 256 << 20
    memory_queue_bytes: int = 32 << 20  # bound of the in-memory queue used while the spool cannot be written
    call_timeout: float = 2.0
    fsync: bool = True
    nvml_pause_file: str | None = None  # while it exists NVML is released (a GPU reset); None = STATE_DIR/nvml.pause


@dataclass
class CollectorStats:
    polls: int = 0
    samples_sent: int = 0
    send_failures: int = 0
    last_poll_seconds: float = 0.0
    last_sample_ts: float = 0.0
    spool_write_errors: int = 0
    state_write_errors: int = 0
    missing_from_nvml: int = 0  # GPU functions in sysfs that NVML did not list (summed over polls)
    memory_dropped: int = 0  # records dropped from the in-memory queue (disk full for long, bound hit)
    source_errors: Counter[str] = field(default_factory=Counter)
    skipped_reads: Counter[str] = field(default_factory=Counter)


class Collector:
    def __init__(self, settings: CollectorSettings, *, sink: Sink, nvml: Any = None,
                 clock: Callable[[], float] = time.time, on_sample: Callable[[Sample], None] | None = None,
                 sources: Sequence[Any] = ()) -> None:
        self.s = settings
        # extra sources (collectors/prom_source.py): ``name``, ``fill(sample)``, ``replaces`` (builtins they stand in for)
        self.sources = list(sources)
        self._replaced = {n for src in self.sources for n in getattr(src, "replaces", ())}
        self.sink = sink
        self._encode = encode_packed if getattr(sink, "wire", "json") == "msgpack" else encode
        self.clock = clock
        self.on_sample = on_sample
        self.stats = CollectorStats()
        state = Path(settings.state_dir)
        state.mkdir(parents=True, exist_ok=True)
        self._state_path = state / "collector-state.json"
        self.seq = self._load_seq()
        if settings.nvml_pause_file is None:
            settings.nvml_pause_file = str(state / "nvml.pause")
        self.boot_id = read_boot_id(settings.proc_root)
        self.spool = Spool(settings.spool_dir or state / "spool", max_bytes=settings.spool_max_bytes,
                           fsync=settings.fsync)
        self._mem: deque[tuple[str, bytes]] = deque()  # records the spool could not take (disk full)
        self._mem_bytes = 0
        self._mem_max = min(settings.spool_max_bytes, settings.memory_queue_bytes)
        self._mem_lock = threading.Lock()
        self._mem_taken = self._mem_inflight = 0  # records of the memory queue the sender has in flight
        self._disk_retry_at = 0.0
        self._disk_backoff = 0.0
        self._spool_failing = False
        self.nvml = NvmlSource(nvml, expected_gpus=settings.expected_gpus, call_timeout=settings.call_timeout,
                               clock=clock) if nvml is not None else None
        self.kernel: KernelLogFollower | JournalFollower | None = None
        self._kernel_error: str | None = None
        if settings.kmsg_path:
            try:
                if settings.kmsg_path == "journal":  # journalctl -k -f, its cursor in the state dir
                    self.kernel = JournalFollower(state / "journal.cursor")
                else:
                    self.kernel = KernelLogFollower(
                        settings.kmsg_path, state_path=state / "kmsg-position.json",
                        boot_time=read_boot_time(settings.proc_root), boot_id=self.boot_id,
                    )
            except OSError as exc:
                self._kernel_error = f"cannot open {settings.kmsg_path}: {exc}"
        self._wake = threading.Event()
        self._stop_sender = threading.Event()
        self._kick = threading.Event()  # set while draining / closing: cuts the retry backoff short
        self._fails_in_a_row = 0  # sends that delivered nothing since the last one that did
        self._sender = threading.Thread(target=self._send_loop, name="collector-sender", daemon=True)
        self._sender.start()

    # ------------------------------------------------------------------ sequence state

    def _load_seq(self) -> int:
        try:
            d = json.loads(self._state_path.read_text())
            if d.get("host") == self.s.host:
                return int(d["seq"]) + 1
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return 0

    def _save_seq(self, seq: int) -> None:
        """Persist the sequence number. A full or broken state disk is logged and counted, never a
        reason to stop: the sequence goes on in memory (a restart then may repeat numbers, which
        the detectors see as a restart, not as lost samples)."""
        tmp = self._state_path.with_name(self._state_path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"host": self.s.host, "seq": seq}, f)
                f.flush()
                if self.s.fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, self._state_path)
        except OSError as exc:
            self.stats.state_write_errors += 1
            if self.stats.state_write_errors == 1 or self.stats.state_write_errors % 100 == 0:
                log.warning("sequence number not saved", extra={"error": str(exc)})

    # ------------------------------------------------------------------ spool, or memory when the disk is full

    def _enqueue(self, key: str, value: bytes) -> None:
        """Spool the record; when the spool cannot be written (disk full, I/O error) keep it in a
        bounded in-memory queue instead and retry the disk with backoff. Order is kept: while the
        memory queue has records, new ones go behind them, and they move to the spool (oldest
        first) once it can be written again; the sender sends the spool first, then memory. Over
        the bound the oldest in-memory record is dropped and counted: the newest are kept."""
        now = time.monotonic()
        with self._mem_lock:
            self._mem.append((key, value))
            self._mem_bytes += len(value)
            while self._mem_bytes > self._mem_max and len(self._mem) > 1:
                _k, v = self._mem.popleft()
                self._mem_bytes -= len(v)
                self.stats.memory_dropped += 1
                self._mem_inflight = max(0, self._mem_inflight - 1)
            if now < self._disk_retry_at or self._mem_inflight:
                return  # backing off, or the sender has the oldest in flight (moving them would duplicate)
            while self._mem:
                k, v = self._mem[0]
                try:
                    self.spool.append(k, v)
                except OSError as exc:
                    self.stats.spool_write_errors += 1
                    self._disk_backoff = min(max(self._disk_backoff * 2, 1.0), 60.0)
                    self._disk_retry_at = now + self._disk_backoff
                    if not self._spool_failing:
                        log.warning("spool cannot be written; samples are kept in memory and sent "
                                    "directly until it can", extra={"error": str(exc)})
                    self._spool_failing = True
                    return
                self._mem.popleft()
                self._mem_bytes -= len(v)
            if self._spool_failing:
                log.info("spool writable again")
            self._spool_failing = False
            self._disk_backoff = 0.0

    def pending(self) -> int:
        """Samples not yet delivered: in the spool plus in memory."""
        with self._mem_lock:
            mem = len(self._mem)
        return self.spool.depth() + mem

    # ------------------------------------------------------------------ one poll

    def poll_once(self) -> Sample:
        t0 = time.perf_counter()
        sample = Sample(host=self.s.host, cluster=self.s.cluster, rack=self.s.rack, ts=self.clock(), seq=self.seq,
                        collector_version=__version__, boot_id=self.boot_id, expected_gpus=self.s.expected_gpus)
        builtin = (("nvml", self._nvml), ("pcie", self._pcie), ("infiniband", self._net),
                   ("edac", self._edac), ("kernel_log", self._kernel))
        for name, fn in [*((n, f) for n, f in builtin if n not in self._replaced),
                         *((src.name, src.fill) for src in self.sources)]:
            try:
                fn(sample)
            except Exception as exc:  # noqa: BLE001 - one source failing must not stop the others
                self._source_error(sample, name, f"{type(exc).__name__}: {exc}")
                log.warning("source failed", extra={"source": name, "error": str(exc)})
        self._save_seq(self.seq)
        self.seq += 1
        self._enqueue(self.s.host, self._encode(sample))
        self._wake.set()
        self.stats.polls += 1
        self.stats.last_sample_ts = sample.ts
        self.stats.last_poll_seconds = time.perf_counter() - t0
        if self.on_sample is not None:
            self.on_sample(sample)
        return sample

    def _source_error(self, sample: Sample, source: str, error: str) -> None:
        self.stats.source_errors[source] += 1
        if len(sample.source_errors) < 64:
            sample.source_errors.append(SourceError(source=source, error=error[:8000]))

    def _nvml(self, sample: Sample) -> None:
        if self.nvml is None:
            return
        self._pause_check()
        p = self.nvml.poll()
        sample.gpus = p.gpus[:64]
        sample.driver_version = p.driver_version
        for e in p.errors:
            self._source_error(sample, "nvml", e)
        if p.device_count is not None:
            self._cross_check(sample)

    def _pause_check(self) -> None:
        """While the pause file exists NVML is released (event set freed, nvmlShutdown) so that
        ``nvidia-smi -r`` can reset a GPU; the released-marker file tells the reset tool that
        nothing is held any more. Removing the pause file resumes NVML on the next poll."""
        assert self.nvml is not None
        pause = self.s.nvml_pause_file
        if not pause:
            return
        marker = released_marker(pause)  # the protocol: fleethealth/nvml_pause.py
        if os.path.exists(pause):
            if self.nvml.release() and not marker.exists():
                try:
                    marker.touch(mode=0o600)
                except OSError as exc:
                    log.warning("cannot write the NVML released marker", extra={"error": str(exc)})
        else:
            self.nvml.resume()
            marker.unlink(missing_ok=True)

    def _cross_check(self, sample: Sample) -> None:
        """What the driver cannot lie about: NVIDIA GPU functions the PCI core enumerated in sysfs
        that NVML does not list. Each becomes a GPU entry ``present=False, nvml_error="NOT_IN_NVML"``
        naming its PCI address (and its UUID, if NVML listed it earlier) -- evidence for
        gpu_fell_off_bus even when the GPU never initialised and has no UUID."""
        pcis = nvidia_gpu_functions(self.s.sysfs_root, ReadStats())
        if not pcis:
            return
        known = {pci: (uuid, name) for uuid, (pci, name) in self.nvml._known.items()} if self.nvml else {}
        by_uuid = {uuid: pci for pci, (uuid, _) in known.items()}
        # NVML spells the domain with 8 digits (00000000:3b:00.0), sysfs with 4; a lost GPU NVML
        # still lists may carry no PCI id but its UUID: it is listed, not missing
        listed = {_pci_key(g.pci_bus_id or by_uuid.get(g.uuid, "")) for g in sample.gpus} - {""}
        index = max((g.index for g in sample.gpus), default=-1) + 1
        missing = [pci for pci in pcis if _pci_key(pci) not in listed]
        # NVML entries it could not identify (a GPU lost before its first read has no PCI id and no
        # UUID) may be those very functions: only a surplus of sysfs functions is missing from NVML
        unidentified = sum(1 for g in sample.gpus if not (g.pci_bus_id or by_uuid.get(g.uuid, "")))
        if len(missing) <= unidentified:
            return
        for pci in missing:
            if len(sample.gpus) >= 64:
                continue
            uuid, name = known.get(pci, ("", ""))
            sample.gpus.append(GpuSample(index=index, uuid=uuid, pci_bus_id=pci, name=name, present=False,
                                         nvml_error="NOT_IN_NVML"))
            index += 1
            self.stats.missing_from_nvml += 1

    def _sysfs(self, sample: Sample, name: str, fn: Callable[[ReadStats], list[Any]], attr: str) -> None:
        st = ReadStats()
        setattr(sample, attr, fn(st))
        skipped = st.vanished + st.unreadable
        self.stats.skipped_reads[f"{name}:vanished"] += st.vanished
        self.stats.skipped_reads[f"{name}:unreadable"] += st.unreadable
        self.stats.skipped_reads[f"{name}:non_numeric"] += st.non_numeric
        if skipped:
            log.info("sysfs files skipped", extra={"source": name, "vanished": st.vanished,
                                                   "unreadable": st.unreadable})

    def _pcie(self, sample: Sample) -> None:
        self._sysfs(sample, "pcie", lambda st: read_pcie(self.s.sysfs_root, st)[:256], "aer")
        # the slot's capability for each GPU's NVML link: the upstream port of its PCI function
        slots = {a.pci_addr: a for a in sample.aer if a.upstream_width_max is not None or a.upstream_gen_max is not None}
        if not slots:
            return
        for g in sample.gpus:
            a = slots.get(g.pci_bus_id)
            if a is not None and g.pcie is not None:
                g.pcie.slot_width_max, g.pcie.slot_gen_max = a.upstream_width_max, a.upstream_gen_max

    def _net(self, sample: Sample) -> None:
        self._sysfs(sample, "infiniband", lambda st: read_net_ports(self.s.sysfs_root, st)[:64], "net_ports")

    def _edac(self, sample: Sample) -> None:
        self._sysfs(sample, "edac", lambda st: read_edac(self.s.sysfs_root, st)[:64], "edac")

    def _kernel(self, sample: Sample) -> None:
        if self._kernel_error:
            raise OSError(self._kernel_error)
        if self.kernel is not None:
            sample.kernel_events = self._cap_events(self.kernel.poll(max_lines=100_000))

    def _cap_events(self, events: list[KernelEvent]) -> list[KernelEvent]:
        """At most MAX_KERNEL_EVENTS per sample (the contract's bound). Over it — a flood, usually
        corrected-AER spam — the events that name a failure (Xid, fallen off the bus, MCE, EDAC,
        uncorrectable AER) are kept first, the rest fill what room is left, in log order; what is
        left out is counted (``skipped_reads["kernel_log:over_cap"]``) and logged."""
        if len(events) <= MAX_KERNEL_EVENTS:
            return events
        keep = [i for i, e in enumerate(events) if _vital(e)][:MAX_KERNEL_EVENTS]
        room = MAX_KERNEL_EVENTS - len(keep)
        if room:
            chosen = set(keep)
            keep += [i for i, e in enumerate(events) if i not in chosen][:room]
        dropped = len(events) - len(keep)
        self.stats.skipped_reads["kernel_log:over_cap"] += dropped
        log.warning("kernel log flood: %d events in one poll, %d left out (failure events kept first)",
                    len(events), dropped)
        return [events[i] for i in sorted(keep)]

    # ------------------------------------------------------------------ sending

    def _next_batch(self) -> tuple[list[tuple[str, bytes]], bool]:
        """The oldest undelivered records: the spool's, else the in-memory ones (all newer)."""
        with self._mem_lock:  # held across both, so no record moves from memory to the spool between
            batch = self.spool.peek(500)
            if batch:
                return batch, True
            batch = list(itertools.islice(self._mem, 500))
            self._mem_taken = self._mem_inflight = len(batch)
            return batch, False

    def _ack(self, n: int, from_spool: bool) -> None:
        if from_spool:
            if n:
                self.spool.ack(n)
            return
        with self._mem_lock:
            dropped_meanwhile = self._mem_taken - self._mem_inflight
            for _ in range(min(max(0, n - dropped_meanwhile), self._mem_inflight, len(self._mem))):
                _k, v = self._mem.popleft()
                self._mem_bytes -= len(v)
            self._mem_taken = self._mem_inflight = 0

    def _send_loop(self) -> None:
        backoff = 0.1
        while not self._stop_sender.is_set():
            batch, from_spool = self._next_batch()
            if not batch:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            try:
                n = self.sink.send_batch(batch)
            except Exception as exc:  # noqa: BLE001 - keep spooling; retry with backoff
                n = 0
                self.stats.send_failures += 1
                log.warning("sink unavailable; samples stay spooled",
                            extra={"error": str(exc)[:300], "spooled": self.pending()})
            self._ack(n, from_spool)
            if n:
                self.stats.samples_sent += n
                self._fails_in_a_row = 0
                backoff = 0.1
            else:
                self._fails_in_a_row += 1
            if n < len(batch):
                if self._kick.wait(backoff):  # draining: retry soon, but not in a tight loop
                    self._stop_sender.wait(min(backoff, 0.5))
                backoff = min(backoff * 2, 5.0)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until the spool is empty (True) or the timeout passes (False)."""
        end = time.monotonic() + timeout
        while self.pending() and time.monotonic() < end:
            self._wake.set()
            time.sleep(0.02)
        return self.pending() == 0

    def drain(self, timeout: float = 60.0, give_up_after: int = 2) -> bool:
        """Deliver what is spooled before stopping (SIGTERM): True once nothing is pending.

        While the sink takes records -- or a send is still in flight (after a broker restart the
        first batch can take many seconds) -- wait, up to ``timeout`` in all. Give up early only
        when the sink is failing: ``give_up_after`` sends in a row during the drain delivered
        nothing, or the sink says it cannot be reached for 2 s (the broker is down; the spool keeps
        the records for the next start). One failed
        send is not enough: a batch handed to the producer before the broker came back can time
        out while the next one goes through. Retry backoff is cut short meanwhile."""
        now = time.monotonic()
        end, probe_at, down_since = now + timeout, now + 1.0, None
        reachable = getattr(self.sink, "reachable", None)  # a sink that can tell (Kafka) is probed once a second
        self._fails_in_a_row = 0
        self._kick.set()
        try:
            while self.pending() and now < end and self._fails_in_a_row < give_up_after:
                if reachable is not None and now >= probe_at:
                    probe_at = now + 1.0
                    if reachable():
                        down_since = None
                    elif down_since is None:
                        down_since = now
                    elif now - down_since >= 2.0:
                        break  # unreachable for 2 s: the rest stays spooled
                self._wake.set()
                time.sleep(0.02)
                now = time.monotonic()
        finally:
            self._kick.clear()
        return self.pending() == 0

    # ------------------------------------------------------------------ loop

    def run(self, stop: threading.Event, *, max_polls: int | None = None, rng: random.Random | None = None) -> None:
        rng = rng or random.Random()
        next_at = time.monotonic()
        while not stop.is_set():
            self.poll_once()
            if max_polls is not None and self.stats.polls >= max_polls:
                break
            next_at += self.s.interval
            delay = next_at - time.monotonic() + (rng.uniform(0, self.s.jitter) if self.s.jitter else 0.0)
            if delay < 0:
                next_at = time.monotonic()  # fell behind: do not burst to catch up
            stop.wait(max(0.0, delay))

    def close(self, flush_timeout: float = 10.0) -> None:
        self.flush(flush_timeout)
        for src in self.sources:
            getattr(src, "close", lambda: None)()
        self._stop_sender.set()
        self._kick.set()
        self._wake.set()
        self._sender.join(5)
        self.spool.close()
        if self.kernel is not None:
            self.kernel.close()
        if self.nvml is not None:
            self.nvml.close()
        try:
            self.sink.close()
        except Exception:  # noqa: BLE001 - closing must not hide the exit status
            log.warning("sink close failed", exc_info=True)


def _pci_key(addr: str) -> str:
    """``bus:device.function`` with the domain as a number: NVML's and sysfs's spellings compare equal."""
    a = addr.strip().lower()
    if a.count(":") == 2:
        dom, rest = a.split(":", 1)
        try:
            return f"{int(dom, 16):x}:{rest}"
        except ValueError:
            return a
    return a
