"""The collector daemon: sequence across restarts, isolated source errors, spool order and bound."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from collectors.daemon import Collector, CollectorSettings
from collectors.spool import Spool
from fleethealth.bus import BusError
from fleethealth.schema import decode_sample
from simulator.host import build_sim_host
from simulator.nvml import SimNvml

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "collectors"


class ListSink:
    """Accepts batches into a list; can be switched 'down' (raises like an unreachable broker)."""

    def __init__(self) -> None:
        self.got: list[tuple[str, bytes]] = []
        self.down = False
        self.lock = threading.Lock()

    def send_batch(self, records):
        if self.down:
            raise BusError("broker unreachable")
        with self.lock:
            self.got.extend(records)
        return len(records)

    def close(self):
        pass

    def seqs(self):
        return [decode_sample(v).seq for _, v in self.got]


def settings(tmp_path, **kw):
    sysroot = tmp_path / "sys"
    kmsg = tmp_path / "kern.log"
    if not sysroot.exists():  # a second Collector on the same tree = a restart
        shutil.copytree(FIX / "sysfs-h100" / "sys", sysroot)
        shutil.copy(FIX / "kmsg" / "dmesg.log", kmsg)
    base = dict(host="node-1", sysfs_root=str(sysroot), proc_root=str(FIX / "sysfs-h100" / "proc"),
                kmsg_path=str(kmsg), state_dir=str(tmp_path / "state"), expected_gpus=4, fsync=False)
    base.update(kw)
    return CollectorSettings(**base)


def test_one_poll_has_every_source(tmp_path):
    sink = ListSink()
    c = Collector(settings(tmp_path), sink=sink, nvml=SimNvml(4))
    s = c.poll_once()
    assert c.flush(5)
    c.close()
    assert (s.seq, len(s.gpus), len(s.net_ports), len(s.aer), len(s.edac)) == (0, 4, 4, 3, 2)
    assert s.boot_id == "3f1c0a2e-5b7d-4c1e-9a8f-0d2b6e4c7a91" and s.source_errors == []
    assert [e.kind for e in s.kernel_events][:2] == ["xid", "fell_off_bus"]
    assert s.kernel_events[0].ts == pytest.approx(1717000000 + 812.117203, abs=1)
    assert decode_sample(sink.got[0][1]) == s and sink.got[0][0] == "node-1"


def test_seq_continues_across_restart_and_kernel_lines_are_not_repeated(tmp_path):
    sink = ListSink()
    c = Collector(settings(tmp_path), sink=sink, nvml=SimNvml(4))
    c.poll_once()
    c.poll_once()
    c.close()
    c2 = Collector(settings(tmp_path), sink=sink, nvml=SimNvml(4))
    s = c2.poll_once()
    c2.close()
    assert sink.seqs() == [0, 1, 2]
    assert s.kernel_events == []  # the log position was kept


def test_a_failing_source_is_isolated(tmp_path, monkeypatch):
    c = Collector(settings(tmp_path), sink=ListSink(), nvml=SimNvml(4))

    def broken(_sample):
        raise RuntimeError("sysfs exploded")

    monkeypatch.setattr(c, "_net", broken)
    s = c.poll_once()
    c.close()
    assert [(e.source, e.error) for e in s.source_errors] == [("infiniband", "RuntimeError: sysfs exploded")]
    assert len(s.gpus) == 4 and len(s.edac) == 2 and c.stats.source_errors["infiniband"] == 1


def test_unreadable_kmsg_is_a_source_error(tmp_path):
    c = Collector(settings(tmp_path, kmsg_path=str(tmp_path / "missing-dir" / "kmsg")), sink=ListSink(),
                  nvml=SimNvml(2))
    s = c.poll_once()
    c.close()
    assert s.kernel_events == [] and len(s.gpus) == 2


def test_outage_spools_then_replays_in_order_before_new_samples(tmp_path):
    sink = ListSink()
    c = Collector(settings(tmp_path), sink=sink, nvml=SimNvml(2))
    c.poll_once()
    assert c.flush(5)
    sink.down = True
    for _ in range(5):
        c.poll_once()
    assert c.spool.depth() == 5 and not c.flush(0.3)
    sink.down = False
    c.poll_once()
    assert c.flush(10)
    c.close()
    assert sink.seqs() == [0, 1, 2, 3, 4, 5, 6]


def test_spool_survives_a_crash_and_replays_on_next_start(tmp_path):
    sink = ListSink()
    sink.down = True
    c = Collector(settings(tmp_path), sink=sink, nvml=SimNvml(2))
    for _ in range(3):
        c.poll_once()
    c._stop_sender.set()  # crash: no flush, no close
    sink2 = ListSink()
    c2 = Collector(settings(tmp_path), sink=sink2, nvml=SimNvml(2))
    c2.poll_once()
    assert c2.flush(10)
    c2.close()
    assert sink2.seqs() == [0, 1, 2, 3]


def test_spool_bound_drops_oldest_and_counts(tmp_path):
    sp = Spool(tmp_path / "sp", max_bytes=8000, segment_bytes=1000, fsync=False)
    for i in range(200):
        sp.append("h", b"%05d" % i + b"x" * 95)
    assert sp.dropped > 0 and sp.size_bytes() <= 8000 + 1000
    remaining = [int(v[:5]) for _, v in sp.peek(1000)]
    assert remaining == list(range(200 - len(remaining), 200)) and sp.dropped + len(remaining) == 200


def test_spool_torn_last_record_is_skipped(tmp_path):
    sp = Spool(tmp_path / "sp", fsync=False)
    sp.append("h", b"one")
    sp.append("h", b"two")
    sp.close()
    seg = next((tmp_path / "sp").glob("seg-*.spool"))
    seg.write_bytes(seg.read_bytes()[:-2])  # crash mid-write
    sp2 = Spool(tmp_path / "sp", fsync=False)
    assert [v for _, v in sp2.peek()] == [b"one"] and sp2.corrupt >= 1


def test_run_loop_stops_on_event(tmp_path):
    paths = build_sim_host(tmp_path / "host", n_gpus=2, n_ports=2)
    s = CollectorSettings(host="h", sysfs_root=str(paths["sys"]), proc_root=str(paths["proc"]),
                          kmsg_path=str(paths["kmsg"]), state_dir=str(tmp_path / "st"), interval=0.01,
                          jitter=0.01, fsync=False)
    sink = ListSink()
    c = Collector(s, sink=sink, nvml=SimNvml(2))
    stop = threading.Event()
    c.run(stop, max_polls=5)
    assert c.flush(5)
    c.close()
    assert sink.seqs() == [0, 1, 2, 3, 4]


def test_a_kernel_log_flood_keeps_the_failure_lines_and_counts_what_it_leaves_out(tmp_path):
    """6,000 corrected-AER lines around one Xid 79 in one poll: a sample carries at most 4,096
    events (the contract's bound); the Xid is kept, the overflow is counted, none of it silently."""
    kmsg = tmp_path / "flood.log"
    aer = ("[  100.{i:06d}] pcieport 0000:00:01.1: AER: Corrected error message received from 0000:18:00.0\n"
           "[  100.{i:06d}] pcieport 0000:00:01.1: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
           "(Receiver ID)\n")
    lines = [aer.format(i=i) for i in range(3000)]
    lines.insert(2500, "[  101.000000] NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n")
    kmsg.write_text("".join(lines))
    c = Collector(settings(tmp_path, kmsg_path=str(kmsg)), sink=ListSink(), nvml=SimNvml(4))
    try:
        s = c.poll_once()
    finally:
        c.close()
    assert len(s.kernel_events) == 4096
    assert [e.xid for e in s.kernel_events if e.kind == "xid"] == [79]
    parsed = 4096 + c.stats.skipped_reads["kernel_log:over_cap"]
    assert parsed > 4096 and [e.ts for e in s.kernel_events] == sorted(e.ts for e in s.kernel_events)
