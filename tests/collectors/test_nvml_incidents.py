"""What the collector's new NVML facts turn into: incidents from the real rule set, and the sysfs
cross-check and pause file of the real Collector."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest

from collectors.daemon import Collector, CollectorSettings
from detectors.engine.engine import DetectorEngine
from detectors.engine.ruleset import RuleSet
from simulator.fixtures import HostSeries
from simulator.nvml import SimNvml

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "collectors"
replace = msgspec.structs.replace


@pytest.fixture(scope="module")
def rules():
    return RuleSet.load()


def run(rules, steps):
    series, engine, out = HostSeries(), DetectorEngine(rules), []
    for fn in steps:
        out += engine.feed(series.advance(fn))
    return out


def opened(incs):
    return sorted({(i.failure_mode, i.detector) for i in incs if i.state == "open"})


def gpu_fn(i, **kw):
    def fn(s):
        s.gpus[i] = replace(s.gpus[i], **kw)
    return fn


def test_a_persistent_ecc_read_error_raises_an_incident_and_a_blip_does_not(rules):
    err = gpu_fn(2, field_errors={"ecc": "UNKNOWN"}, ecc=None)
    assert opened(run(rules, [None, err, err, err])) == [("gpu_hw_error", "gpu.nvml.ecc-read-error")]
    assert opened(run(rules, [None, err, None, err, None])) == []
    ns = gpu_fn(2, field_errors={}, ecc=None)  # NOT_SUPPORTED is absent, never an incident
    assert opened(run(rules, [None, ns, ns, ns, ns])) == []


def test_under_mig_an_aggregate_uce_step_is_a_dram_uce(rules):
    def mig(n):
        def fn(s):
            g = s.gpus[1]
            s.gpus[1] = replace(g, mig_enabled=True, remapped_rows=None, utilization_pct=None,
                                ecc=replace(g.ecc, dram_uncorrected_volatile=None, dram_corrected_volatile=None,
                                            sram_uncorrected_volatile=None, sram_corrected_volatile=None,
                                            dram_uncorrected_aggregate=n))
        return fn
    incs = run(rules, [mig(4), mig(4), mig(5)])
    assert opened(incs) == [("gpu_dram_uce", "gpu.dram-uce.aggregate-mig")]
    assert opened(run(rules, [mig(4)] * 5)) == []  # lifetime history on first sight is not new


def test_hopper_ecc_data_errors_are_an_nvlink_incident(rules):
    def ecc_data(n):
        def fn(s):
            nv = s.gpus[0].nvlink
            data = [0] * len(nv.active)
            data[3] = n
            s.gpus[0] = replace(s.gpus[0], nvlink=replace(nv, crc_data=[None] * len(nv.active), ecc_data=data))
        return fn
    incs = run(rules, [ecc_data(500 * k) for k in range(12)])
    assert ("gpu_nvlink_error", "gpu.nvlink.ecc-data") in opened(incs)


def _tree(tmp_path: Path, gpus: list[str], others: dict[str, str]) -> Path:
    sysroot = tmp_path / "sys"
    shutil.copytree(FIX / "sysfs-h100" / "sys", sysroot)
    devs = sysroot / "bus" / "pci" / "devices"
    for addr, cls in [(a, "0x030200") for a in gpus] + list(others.items()):
        (devs / addr).mkdir(exist_ok=True)
        (devs / addr / "vendor").write_text("0x10de\n")
        (devs / addr / "class").write_text(cls + "\n")
    return sysroot


def _settings(tmp_path: Path, sysroot: Path) -> CollectorSettings:
    kmsg = tmp_path / "kern.log"
    kmsg.write_text("")
    return CollectorSettings(host="n1", sysfs_root=str(sysroot), proc_root=str(FIX / "sysfs-h100" / "proc"),
                             kmsg_path=str(kmsg), state_dir=str(tmp_path / "st"), fsync=False, expected_gpus=3)


class NullSink:
    def send_batch(self, records):
        return len(records)

    def close(self):
        pass


def test_a_gpu_in_sysfs_that_nvml_does_not_list_is_named_by_pci_address(tmp_path, rules):
    # sim GPUs sit at 18 and 2a; c1 is a GPU function the driver never brought up (RmInitAdapter failed);
    # an NVSwitch (0x0680) and a GPU's audio function (0x0403) are not GPUs
    sysroot = _tree(tmp_path, ["0000:18:00.0", "0000:2a:00.0", "0000:c1:00.0"],
                    {"0000:05:00.0": "0x068000", "0000:18:00.1": "0x040300"})
    c = Collector(_settings(tmp_path, sysroot), sink=NullSink(), nvml=SimNvml(2))
    s = c.poll_once()
    c.close()
    missing = [g for g in s.gpus if g.nvml_error == "NOT_IN_NVML"]
    assert [(g.pci_bus_id, g.present, g.uuid) for g in missing] == [("0000:c1:00.0", False, "")]
    assert sum(g.present for g in s.gpus) == 2
    incs = DetectorEngine(rules).feed(s)
    fell = [i for i in incs if i.failure_mode == "gpu_fell_off_bus" and i.detector == "gpu.fell-off.not-present"]
    assert [i.component for i in fell] == ["pci:0000:c1:00.0"]
    assert "NOT_IN_NVML" in fell[0].evidence[0].fact and "0000:c1:00.0" in fell[0].evidence[0].fact


def test_a_gpu_that_vanished_from_nvml_keeps_its_uuid_in_the_cross_check(tmp_path):
    sysroot = _tree(tmp_path, ["0000:18:00.0", "0000:2a:00.0"], {})
    sim = SimNvml(2)
    c = Collector(_settings(tmp_path, sysroot), sink=NullSink(), nvml=sim)
    first = c.poll_once()
    sim.vanish(1)
    s = c.poll_once()
    c.close()
    gone = [g for g in s.gpus if not g.present]
    assert [(g.uuid, g.nvml_error) for g in gone] == [(first.gpus[1].uuid, "NOT_ENUMERATED")]  # listed once


def test_the_pause_file_releases_nvml_and_its_removal_resumes(tmp_path):
    sysroot = _tree(tmp_path, ["0000:18:00.0", "0000:2a:00.0"], {})
    sim = SimNvml(2)
    c = Collector(_settings(tmp_path, sysroot), sink=NullSink(), nvml=sim)
    c.poll_once()
    pause = Path(c.s.nvml_pause_file)
    pause.touch()
    s = c.poll_once()
    assert sim._inited == 0 and sim.registered() == {} and Path(str(pause) + ".released").exists()
    assert s.gpus == [] and any("released" in e.error for e in s.source_errors)
    pause.unlink()
    sim.xid(0, 13)
    c.poll_once()
    sim.xid(1, 31)
    s = c.poll_once()
    c.close()
    assert not Path(str(pause) + ".released").exists()
    assert [x.xid for x in s.gpus[1].xids] == [31] and all(g.present for g in s.gpus)


def test_nvml_unresponsive_for_n_polls_is_one_host_finding(tmp_path, rules):
    """A driver wedged in its lock (every NVML call blocks): the collector's deadline turns each poll
    into "NVML unresponsive", and after the rule's for_samples (rule data, not code) polls in a row
    the engine raises one host-level finding, with the collector's words as evidence."""
    sysroot = _tree(tmp_path, ["0000:18:00.0", "0000:2a:00.0"], {})
    sim = SimNvml(2)
    settings = _settings(tmp_path, sysroot)
    settings.call_timeout = 0.2
    c = Collector(settings, sink=NullSink(), nvml=sim)
    engine = DetectorEngine(rules)
    engine.feed(c.poll_once())  # (the fixture tree's own faults are not this test's business)
    sim.hang_all(1.0)
    n = next(s.params["for_samples"] for s in rules.specs if s.id == "host.nvml.unresponsive")
    per_poll = []
    for _ in range(n):
        s = c.poll_once()
        per_poll.append([i for i in engine.feed(s) if i.component == "host"])
    c.close(flush_timeout=0.1)
    assert all(per_poll[k] == [] for k in range(n - 1))  # not before N polls
    (inc,) = per_poll[-1]
    assert (inc.failure_mode, inc.component, inc.detector) == ("gpu_hw_error", "host", "host.nvml.unresponsive")
    assert "NVML unresponsive" in inc.evidence[0].fact and "drain" in inc.recommended_action


def test_every_gpu_timing_out_is_nvml_unresponsive_and_one_slow_gpu_is_not(rules):
    t = gpu_fn(0, nvml_error="TIMEOUT", ecc=None)

    def all_timeout(s):
        s.gpus = [replace(g, nvml_error="TIMEOUT", ecc=None) for g in s.gpus]
    assert opened(run(rules, [None, all_timeout, all_timeout, all_timeout])) == [("gpu_hw_error", "host.nvml.unresponsive")]
    assert opened(run(rules, [None, t, t, t, t])) == []
    assert opened(run(rules, [None, all_timeout, all_timeout, None, all_timeout, all_timeout])) == []
