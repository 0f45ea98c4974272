"""The collector's dcgm-exporter / node-exporter scrape sources: they stand in for NVML and the
sysfs IB/EDAC readers, a failed scrape is a counted SourceError (never a crash), and the Xid gauge
tracker's state survives a collector restart (an old Xid is not raised again)."""

from __future__ import annotations

import time

from collectors.daemon import Collector
from collectors.prom_source import PromScrapeSource, parse_source_spec
from tests.backtest.fixture_exporter import FAULTS, FAULTY, FixtureExporter
from tests.backtest.private_prometheus import free_port
from tests.collectors.test_daemon import ListSink, settings


def _collector(tmp_path, ex, **kw):
    st = settings(tmp_path, expected_gpus=0, **kw)
    srcs = [PromScrapeSource("dcgm-exporter", ex.url(FAULTY, "dcgm"), timeout=2, state_dir=st.state_dir),
            PromScrapeSource("node-exporter", ex.url(FAULTY, "node"), timeout=2)]
    return Collector(st, sink=ListSink(), nvml=None, sources=srcs), srcs


def test_scraped_sample_replaces_nvml_and_sysfs_readers(tmp_path):
    ex = FixtureExporter(t0=time.time() - FAULTS["net_link_bad_cable"][0] - 10)  # every fault already there
    try:
        c, srcs = _collector(tmp_path, ex)
        s = c.poll_once()
        c.close(flush_timeout=1)
    finally:
        ex.close()
    assert s.source_errors == []
    assert len(s.gpus) == 4 and s.gpus[2].ecc.dram_uncorrected_volatile == 1  # type: ignore[union-attr]
    assert s.gpus[1].remapped_rows.pending is True  # type: ignore[union-attr]
    assert [x.xid for x in s.gpus[3].xids] == [79] and "time unknown" in s.gpus[3].xids[0].message
    assert {p.device for p in s.net_ports} == {"mlx5_0", "mlx5_1"}  # not the fixture tree's sysfs ports
    assert s.boot_id.startswith("btime:") and s.edac[0].mc == 0
    assert srcs[0].stats.scrapes == 1 and srcs[0].stats.errors == 0


def test_xid_state_survives_a_restart(tmp_path):
    ex = FixtureExporter(t0=time.time() - 60)
    try:
        c, _ = _collector(tmp_path, ex)
        first = c.poll_once()
        c.close(flush_timeout=1)
        c2, _ = _collector(tmp_path, ex)  # the same state folder: a restart
        again = [c2.poll_once() for _ in range(3)]
        c2.close(flush_timeout=1)
    finally:
        ex.close()
    assert [x.xid for g in first.gpus for x in g.xids] == [79]
    assert [x.xid for s in again for g in s.gpus for x in g.xids] == []


def test_a_dead_exporter_is_a_counted_source_error(tmp_path):
    st = settings(tmp_path)
    src = PromScrapeSource("dcgm-exporter", f"http://127.0.0.1:{free_port()}/metrics", timeout=1)
    c = Collector(st, sink=ListSink(), nvml=None, sources=[src])
    s = c.poll_once()
    c.poll_once()
    c.close(flush_timeout=1)
    assert [e.source for e in s.source_errors] == ["dcgm-exporter"] and "127.0.0.1" in s.source_errors[0].error
    assert c.stats.source_errors["dcgm-exporter"] == 2 and src.stats.errors == 2
    assert s.net_ports  # the other sources still report


def test_source_spec():
    assert parse_source_spec("dcgm-exporter=http://h:9400/metrics") == ("dcgm-exporter", "http://h:9400/metrics")
    for bad in ("dcgm=http://x", "dcgm-exporter", "node-exporter=ftp://x"):
        try:
            parse_source_spec(bad)
        except ValueError as exc:
            assert "--source" in str(exc)
        else:
            raise AssertionError(bad)
