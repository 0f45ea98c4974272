"""The metric catalogue follows Prometheus naming rules, and every metric in it is exported."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collectors.daemon import Collector, CollectorSettings
from collectors.exporter import CatalogError, SampleMetrics, load_catalog, parse_catalog, start_exporter
from collectors.nvml_source import NvmlSource
from simulator.nvml import SimNvml

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "collectors"
HEADER = "metric\ttype\tunit\tsource\tlabels\thelp\n"


class NullSink:
    def send_batch(self, records):
        return len(records)

    def close(self):
        pass


def test_catalogue_naming_rules():
    specs = load_catalog()
    assert len(specs) >= 30
    for s in specs:
        assert re.fullmatch(r"fleethealth_[a-z0-9_]+", s.metric), s.metric
        assert s.metric.endswith("_total") == (s.type == "counter"), s.metric
        for bad in ("_ms", "_milliseconds", "_percent", "_kb", "_mb", "_gbps"):
            assert bad + "_" not in s.metric + "_", s.metric
        assert s.help and all(re.fullmatch(r"[a-z][a-z0-9_]*", lab) for lab in s.labels)


@pytest.mark.parametrize("row,msg", [
    ("fleethealth_xy_total\tgauge\t-\tgpu:present\t-\th", "only counters"),
    ("fleethealth_xy\tcounter\t-\tgpu:present\t-\th", "only counters"),
    ("FleetHealth_X\tgauge\t-\tgpu:present\t-\th", "snake_case"),
    ("fleethealth_temp_ms\tgauge\tmilliseconds\tgpu:present\t-\th", "base unit"),
    ("fleethealth_temp\tgauge\tcelsius\tgpu:present\t-\th", "must end in _celsius"),
    ("fleethealth_xy\tgauge\t-\tnowhere:present\t-\th", "scope"),
    ("fleethealth_xy\tgauge\t-\tgpu:ecc.{loc}\t-\th", "placeholder"),
    ("fleethealth_xy\tgauge\t-\tgpu:present", "6 tab-separated"),
])
def test_catalogue_errors_name_file_and_line(row, msg):
    with pytest.raises(CatalogError, match=msg) as e:
        parse_catalog("# c\n" + HEADER + row + "\n", "cat.tsv")
    assert "cat.tsv:3" in str(e.value)


def test_every_catalogued_metric_is_exported_from_a_simulated_poll(tmp_path):
    sysroot = tmp_path / "sys"
    shutil.copytree(FIX / "sysfs-h100" / "sys", sysroot)
    kmsg = tmp_path / "kern.log"
    shutil.copy(FIX / "kmsg" / "dmesg.log", kmsg)
    specs = load_catalog()
    metrics = SampleMetrics(specs)
    hopper, volta = SimNvml(4), SimNvml(1, arch="volta", seed=2)
    hopper.xid(0, 13)
    hopper.fall_off_bus(1)
    c = Collector(CollectorSettings(host="n1", sysfs_root=str(sysroot), proc_root=str(FIX / "sysfs-h100" / "proc"),
                                    kmsg_path=str(kmsg), state_dir=str(tmp_path / "st"), fsync=False),
                  sink=NullSink(), nvml=hopper)
    sample = c.poll_once()
    c.close()
    old = NvmlSource(volta).poll().gpus  # a pre-Ampere GPU: retired pages instead of remapped rows
    old[0].index = 4
    sample.gpus.extend(old)
    # the slot's width comes from the sysfs upstream port (tests/collectors/test_pcie_slot.py reads a
    # real tree); this flat fixture has none, so one GPU is given its slot, the others stay unknown
    sample.gpus[0].pcie.slot_width_max = 16
    metrics.update(sample)
    metrics.stats_fn = lambda: {"last_poll_seconds": 0.01, "source_errors": {"nvml": 1}, "spool_depth": 0,
                                "spool_dropped": 0, "spool_corrupt": 0, "spool_write_errors": 0, "polls": 1,
                                "samples_sent": 1, "last_sample_ts": sample.ts}
    reg = CollectorRegistry(auto_describe=False)
    reg.register(metrics)
    text = generate_latest(reg).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    missing = []
    for spec in specs:
        name = spec.metric[: -len("_total")] if spec.type == "counter" else spec.metric
        if name not in fams or not fams[name].samples:
            missing.append(spec.metric)
    assert missing == []
    slot = {x.labels["gpu"]: x.value for x in fams["fleethealth_gpu_pcie_slot_link_width"].samples}
    assert slot == {"0": 16}  # unknown slot: no series (the width alert then judges against the GPU max)
    ecc = [x for x in fams["fleethealth_gpu_ecc_errors"].samples if x.labels.get("location") == "sram"]
    assert ecc and set(ecc[0].labels) == {"host", "gpu", "uuid", "location", "type", "scope"}
    states = {(x.labels["device"], x.labels["state"]) for x in fams["fleethealth_net_port_state"].samples}
    assert ("mlx5_1", "DOWN") in states
    rate = [x.value for x in fams["fleethealth_net_port_rate_bytes_per_second"].samples if x.labels["device"] == "mlx5_0"]
    assert rate == [400e9 / 8]


def test_exporter_serves_on_localhost_and_port_zero_disables():
    metrics = SampleMetrics(load_catalog())
    assert start_exporter(metrics, 0) is None
    server = start_exporter(metrics, 19411)
    try:
        body = urllib.request.urlopen("http://127.0.0.1:19411/metrics", timeout=5).read().decode()
        assert "fleethealth_collector_spool_depth" in body
    finally:
        server.shutdown()


def test_cli_simulate_once_jsonl(tmp_path):
    out = tmp_path / "t.jsonl"
    r = subprocess.run([sys.executable, "-m", "fleetcli.cli", "collect", "--simulate", "--once", "--host", "h9",
                        "--sink", f"jsonl:{out}", "--state-dir", str(tmp_path / "st")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    from fleethealth.bus import read_values
    from fleethealth.schema import decode_sample
    samples = [decode_sample(v) for v in read_values(out)]
    assert [(s.host, s.seq, len(s.gpus), len(s.net_ports)) for s in samples] == [("h9", 0, 8, 8)]
