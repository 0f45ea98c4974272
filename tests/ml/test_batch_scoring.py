"""The ML hot path's shortcuts change nothing: reused feature parts, batched peer scoring, and the
persistence a state mode needs before the classifier names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from detectors.engine.fastdecode import IncrementalDecoder
from detectors.ml import MODEL_DIR, load_peer, load_supervised
from detectors.ml.features import GI, HI, FeatureStream, WindowFeatures
from detectors.ml.supervised import STATE_MODES
from fleethealth.bus import iter_jsonl
from fleethealth.schema import GpuSample, NetPort, Sample, decode_sample, encode_packed
from simulator.engine import simulate
from simulator.plan import RunSpec
from tests.ml.synth import fleet

T0 = 1_767_225_600.0


@pytest.fixture(scope="module")
def faulty_fleet(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """A simulated 12-host hour, fault-dense: every counter kind moves somewhere."""
    out = tmp_path_factory.mktemp("fleet") / "f.jsonl"
    simulate(RunSpec(hosts=12, duration_s=3600.0, interval_s=10.0, seed=5, fault_rate=3000.0, min_per_mode=1), out)
    return [raw for _, raw in iter_jsonl(out)]


def _windows(stream: FeatureStream, samples: list[Sample]) -> list[WindowFeatures]:
    return [w for s in samples if (w := stream.feed(s)) is not None]


def _same(a: WindowFeatures, b: WindowFeatures) -> bool:
    return (a.host, a.ts, a.gpu_ids, a.port_ids, a.dimm, a.gpu_pci) == (b.host, b.ts, b.gpu_ids, b.port_ids, b.dimm,
                                                                      b.gpu_pci) \
        and all(np.array_equal(x, y, equal_nan=True) for x, y in ((a.gpu, b.gpu), (a.port, b.port),
                                                                 (a.host_row, b.host_row)))


def test_reused_parts_give_the_recomputed_features(faulty_fleet: list[bytes]) -> None:
    """Unchanged GPUs / ports / AER / EDAC take cached quiet rows: with the incremental decoder's
    shared objects (identity) and with strictly decoded ones (equality), the windows are exactly
    those recomputed from scratch at every close."""
    strict = [decode_sample(b) for b in faulty_fleet]
    dec = IncrementalDecoder()
    shared = [dec.decode(b) for b in faulty_fleet]
    dec = IncrementalDecoder()
    packed, bases = [], []  # msgpack (the wire's default), where the decoder hands out bases
    for b in faulty_fleet:
        packed.append(dec.decode(encode_packed(decode_sample(b))))
        bases.append(dec.base)
    ref = _windows(FeatureStream(reuse=False), strict)
    moved = sum(1 for w in ref if w.gpu[:, :23].any() or w.port[:, :8].any() or w.host_row.any())
    assert len(ref) > 500 and moved > 50  # counters really move in this fleet
    events = sum(1 for w in ref if w.gpu[:, GI["thr_hw_slowdown"]:].any() or w.host_row[HI["kern_mce"]:].any())
    assert events > 20  # and throttle bits, Xids, lost GPUs, kernel events are accumulated
    # the decoder's bases: FeatureStream.feed(s, base) skips what a host's repeated base proves unchanged
    last: dict[str, object] = {}
    repeats = 0
    for s, base in zip(packed, bases, strict=True):
        repeats += base is not None and last.get(s.host) is base
        last[s.host] = base
    assert repeats > 1000
    with_bases = FeatureStream()
    based = [w for s, base in zip(packed, bases, strict=True) if (w := with_bases.feed(s, base)) is not None]
    for got in (_windows(FeatureStream(), shared), _windows(FeatureStream(), strict), based):
        assert len(got) == len(ref)
        bad = [(w.host, w.ts) for w, r in zip(got, ref, strict=True) if not _same(w, r)]
        assert bad == []


def test_quiet_rows_are_shared_read_only(faulty_fleet: list[bytes]) -> None:
    dec = IncrementalDecoder()
    ws = _windows(FeatureStream(), [dec.decode(b) for b in faulty_fleet])
    shared = [w.port for w in ws if not w.port.flags.writeable]
    assert shared  # quiet port matrices are reused between windows ...
    with pytest.raises(ValueError):
        shared[0][0, 0] = 1.0  # ... and nothing may write into them


def _key(f) -> tuple:  # type: ignore[no-untyped-def]
    return (f.host, f.component, f.failure_mode, f.ts, f.confidence, [e.fact for e in f.evidence])


def test_peer_batches_score_like_one_window_at_a_time(model_dir: Path) -> None:
    """GPU and port rows: identical findings whatever the batch; rack rows compare with the rack
    as the batch leaves it (documented), so they are compared apart."""
    samples, _ = fleet(43, hosts=16, duration_s=5400.0, faults=12,
                       modes=("gpu_thermal", "gpu_ecc_sbe_storm", "net_link_bad_cable", "gpu_nvlink_error"))
    ws = _windows(FeatureStream(), samples)
    one, many = load_peer(model_dir), load_peer(model_dir)
    want = [f for w in ws for f in one.score_window(w)]
    got = [f for i in range(0, len(ws), 97) for f in many.score_batch(ws[i:i + 97])]
    comp = [f for f in want if f.component != "host"]
    assert comp, "the synthetic faults should put components out of line with their peers"
    assert sorted(map(_key, comp)) == sorted(_key(f) for f in got if f.component != "host")
    assert many.stats["batches"] * 20 < one.stats["batches"]


def _window_s() -> float:
    """The shipped classifier's window: samples this far apart each close one window."""
    from detectors.ml.model_io import read_sidecar

    return float(read_sidecar(MODEL_DIR, "fault_classifier").get("window_s", 60.0))


def _host(i: int, *, down: bool = False, downs: int = 0, interval: float | None = None) -> Sample:
    interval = _window_s() if interval is None else interval
    gpus = [GpuSample(index=k, uuid=f"GPU-{k}", temperature_c=55.0 + k * 0.2, power_w=400.0, utilization_pct=90.0)
            for k in range(8)]
    ports = [NetPort(device=f"mlx5_{p}", port=1, state="DOWN" if (down and p == 3) else "ACTIVE",
                     phys_state="Polling" if (down and p == 3) else "LinkUp", rate_gbps=400.0,
                     counters={"symbol_error": 0, "link_downed": downs if p == 3 else 0}) for p in range(8)]
    return Sample(host="h-flap", ts=T0 + interval * i, seq=i, collector_version="t", boot_id="b", gpus=gpus,
                  net_ports=ports, expected_gpus=8)


def _classify(samples: list[Sample]) -> list:
    det = load_supervised(MODEL_DIR)
    out = [f for s in samples for f in det.feed(s)]
    return out + det.flush()


@pytest.mark.skipif(not (MODEL_DIR / "fault_classifier.json").exists(), reason="no shipped classifier")
def test_one_window_of_a_state_mode_is_not_a_finding() -> None:
    """A switch reboot bounces a link for one poll (one window, one link_downed): the shipped
    classifier's top class for that row is net_link_down, but a state mode must persist."""
    assert "net_link_down" in STATE_MODES
    flap = [_host(i, down=i == 5, downs=int(i >= 5)) for i in range(12)]
    assert _classify(flap) == []
    stuck = [_host(i, down=i >= 5, downs=int(i >= 5)) for i in range(12)]
    found = [f for f in _classify(stuck) if f.failure_mode == "net_link_down"]
    assert found and found[0].component == "mlx5_3/1"
    assert found[0].ts == T0 + _window_s() * 6  # the second window of the outage, not the first


@pytest.mark.skipif(not (MODEL_DIR / "fault_classifier.json").exists(), reason="no shipped classifier")
def test_an_event_mode_is_named_in_its_one_window() -> None:
    """A DRAM UCE leaves one window: it must not wait for a second."""
    from fleethealth.schema import EccCounters, RemappedRows, XidEvent

    samples = []
    for i in range(10):
        s = _host(i)
        for g in s.gpus:
            g.ecc = EccCounters(dram_uncorrected_volatile=0, dram_uncorrected_aggregate=0)
            g.remapped_rows = RemappedRows(uncorrectable=0)
        if i >= 5:
            g = s.gpus[2]
            g.ecc = EccCounters(dram_uncorrected_volatile=1, dram_uncorrected_aggregate=1)
            g.remapped_rows = RemappedRows(uncorrectable=1, pending=True)
            if i == 5:
                g.xids = [XidEvent(xid=48, ts=s.ts - 5.0, message="Xid 48: DBE"),
                          XidEvent(xid=63, ts=s.ts - 4.0, message="Xid 63: row remapping")]
        samples.append(msgspec.structs.replace(s))
    found = [f for f in _classify(samples) if f.failure_mode == "gpu_dram_uce"]
    assert found and found[0].component == "GPU-2" and found[0].ts == T0 + _window_s() * 5


@pytest.mark.skipif(not (MODEL_DIR / "peer_anomaly.json").exists(), reason="no shipped peer model")
def test_peer_pcie_findings_name_the_pci_address_like_the_rules() -> None:
    """A GPU whose PCIe replay rate leaves its peers': the finding names the device's PCI address
    (as the rules and the ground truth do), not the GPU UUID, or the scorecard counts it false."""
    from fleethealth.schema import PcieLink

    samples = []
    for i in range(40):
        s = _host(i, interval=10.0)
        for g in s.gpus:
            g.pci_bus_id = f"00000000:{0x18 + 16 * g.index:02X}:00.0"
            bad = g.index == 5 and i >= 10
            g.pcie = PcieLink(gen_current=5, gen_max=5, width_current=8 if bad else 16, width_max=16,
                              replay_counter=60 * (i - 10) if bad else 0)
        samples.append(s)
    peer = load_peer()
    w = _windows(FeatureStream(), samples)[-1]
    dev = peer.deviations(w)["gpu"][1]
    model = peer.models["gpu"]
    j = model.names.index("pcie_replay_x_dev")
    assert abs(dev[5, j]) > model.limit[j]  # out of the envelope: what the forest is asked to confirm
    f = peer._finding(w, "gpu", w.gpu_ids[5], dev[5], model, j, 3)
    assert f.failure_mode == "pcie_link_degraded" and f.component == "0000:68:00.0"
    t = peer._finding(w, "gpu", w.gpu_ids[5], dev[5], model, model.names.index("temp_adj"), 3)
    assert t.failure_mode == "gpu_thermal" and t.component == "GPU-5"  # GPU modes keep the GPU


def _worker_run(faulty_fleet: list[bytes], grouped: bool, suite) -> tuple[list[bytes], dict]:  # type: ignore[no-untyped-def]
    from detectors.engine.engine import DetectorEngine
    from detectors.worker.worker import DetectWorker
    from fleethealth.bus import INCIDENTS, TELEMETRY, InProcessBus

    bus = InProcessBus(partitions=1)
    for raw in faulty_fleet:
        bus.publish(TELEMETRY, decode_sample(raw).host, raw)
    suite.reset()
    runs: dict[str, Any] = {"run": 0, "longest": 0, "last": ""}

    class Engine(DetectorEngine):  # notes the longest run of one host's samples fed in a row
        def feed(self, sample, base=None):  # type: ignore[no-untyped-def]
            runs["run"] = runs["run"] + 1 if sample.host == runs["last"] else 1
            runs["last"], runs["longest"] = sample.host, max(runs["longest"], runs["run"])
            return super().feed(sample, base)

    engine = Engine(extra_detectors=[suite])
    assert engine.order_free
    w = DetectWorker(bus, engine, poll_timeout=0.0, idle_tick=False, max_records=500, group_hosts=grouped,
                     clock=lambda: T0 + 86_400.0)
    w.run(max_idle_polls=1)
    got = bus.consumer([INCIDENTS], "check").poll(timeout=0, max_records=100_000)
    return [r.value for r in got], {"samples": w.stats.samples, "run": runs["longest"], "stats": dict(engine.stats),
                                    "ml": [dict(m.stats) for m in suite.members], "racks": {
        k: sorted((h, t, v.tolist()) for h, (t, v) in view.hosts.items()) for k, view in suite.members[1].racks.items()}}


def test_grouped_feeding_with_the_models_gives_what_record_order_gives(faulty_fleet: list[bytes]) -> None:
    """The detect worker feeds model engines grouped by host too: the ML suite only buffers windows,
    the engine scores them where record order reaches a fleet-time epoch (every 120 s here) and at
    each poll batch's end, and a batch is scored in (window end, host) order. Byte-identical
    incidents in the same order as record order, with several hosts' model findings and the rack
    comparison in play."""
    from detectors.ml import MLSuite, load_ml_detectors
    from fleethealth.schema import decode_incident

    if not (MODEL_DIR / "peer_anomaly.json").exists() or not (MODEL_DIR / "fault_classifier.json").exists():
        pytest.skip("no shipped models")
    suite = MLSuite(load_ml_detectors())  # loaded once: the models take seconds
    for m in suite.members:
        m.batch_s = 120.0
    first = faulty_fleet[:len(faulty_fleet) // 3]  # 20 minutes: five hosts' model findings, two runs in ~5 s
    grouped, in_order = _worker_run(first, True, suite), _worker_run(first, False, suite)
    assert grouped[1].pop("run") >= 4 and in_order[1].pop("run") == 1
    assert grouped == in_order
    model = [i for i in map(decode_incident, grouped[0])
             if i.detector.startswith("model:") or "classifier p(" in str(i.evidence)]
    assert len({i.host for i in model}) >= 3, [(i.host, i.failure_mode) for i in model]
    classifier, peer = grouped[1]["ml"]
    assert classifier["gated"] and peer["confirmed"] and grouped[1]["racks"]
