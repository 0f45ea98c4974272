"""Features: counter resets, wraps, saturation, reboots, duplicates never make spikes."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from detectors.engine.state import saturation
from detectors.ml.counters import deltas, increment
from detectors.ml.features import GI, GPU_FEATURES, PI, FeatureStream
from fleethealth.schema import EccCounters, GpuSample, NetPort, NvlinkCounters, PcieLink, Sample

T0 = 1_767_225_600.0


@pytest.mark.parametrize(("old", "new", "want"), [
    (5, 9, 4),  # normal rise
    (9, 9, 0),  # unchanged
    (255, 255, 0),  # saturated 8-bit IB counter stays pegged
    (4_290_000_000, 3, 2**32 - 4_290_000_000 + 3),  # 32-bit wrap
    (2**64 - 10, 5, 15),  # 64-bit wrap
    (120, 3, 0),  # reset (driver reload, counter cleared): re-baseline, no spike
    (3_000_000_000, 2_999_000_000, 0),  # backwards but not near the limit: reset, not a wrap
    (None, 5, 0), (5, None, 0),
])
def test_counter_increment(old: int | None, new: int | None, want: int) -> None:
    assert increment(old, new) == want
    assert deltas([old, 0], [new, 0]) == [want, 0]


def test_port_counters_saturate_at_their_width() -> None:
    """The widths of detectors/engine/counters.yaml: a 4-bit counter stops at 15, an 8-bit one at 255;
    pegged, it adds nothing; cleared from its peg, it re-baselines (no spike)."""
    sat = [saturation("local_link_integrity_errors"), saturation("link_downed")]
    assert deltas([12, 250], [15, 255], sat) == [3, 5]
    assert deltas([15, 255], [15, 255], sat) == [0, 0]
    assert deltas([15, 255], [2, 7], sat) == [0, 0]


def _sample(i: int, *, ce: int = 0, ue: int = 0, sym: int = 0, boot: str = "b0", crc: int = 0,
            ts: float | None = None) -> Sample:
    gpus = [GpuSample(index=k, uuid=f"GPU-{k}", pci_bus_id=f"00000000:{0x18 + k:02X}:00.0",
                      ecc=EccCounters(dram_corrected_volatile=ce if k == 0 else 0,
                                      dram_uncorrected_volatile=ue if k == 0 else 0),
                      pcie=PcieLink(gen_current=5, gen_max=5, width_current=16, width_max=16, replay_counter=0),
                      nvlink=NvlinkCounters(active=[True] * 4, crc_flit=[crc, 0, 0, 0], crc_data=[0] * 4,
                                            replay=[0] * 4, recovery=[0] * 4),
                      temperature_c=50.0 + k * 0.3, power_w=300.0, utilization_pct=90.0) for k in range(4)]
    ports = [NetPort(device=f"mlx5_{p}", port=1, state="ACTIVE", phys_state="LinkUp", rate_gbps=400.0,
                     counters={"symbol_error": sym if p == 0 else 0, "link_downed": 0}) for p in range(4)]
    return Sample(host="h1", ts=ts if ts is not None else T0 + 10 * i, seq=i, collector_version="t", boot_id=boot,
                  gpus=gpus, net_ports=ports, expected_gpus=4)


def _windows(samples: list[Sample]) -> list:
    fs = FeatureStream(window_s=60.0)
    return [w for s in samples if (w := fs.feed(s)) is not None]


def test_steady_rise_gives_a_steady_rate() -> None:
    ws = _windows([_sample(i, ce=10 * i) for i in range(40)])  # 10 CE per 10 s = 3,600/h = 36x the 100/h limit
    rates = [w.gpu[0, GI["dram_ce_x"]] for w in ws]
    assert rates and all(r == pytest.approx(36.0) for r in rates)
    assert all(w.gpu[1:, GI["dram_ce_x"]].max() == 0 for w in ws)


def test_limited_counters_are_multiples_of_their_published_limit() -> None:
    """A rate at exactly the limit (fleethealth.limits) reads 1.0, whatever the window: HBM CE
    100/h, IB symbol errors 10/h, NVLink data errors 600/h on the worst link."""
    def at(i: int) -> Sample:  # one sample a minute: 100/60 CE, 10/60 symbol errors, 10 NVLink data errors
        s = _sample(i, ce=i * 100 // 60, sym=i * 10 // 60, ts=T0 + 60 * i)
        for g in s.gpus:
            g.nvlink = NvlinkCounters(active=[True] * 4, crc_flit=[0] * 4, crc_data=[10 * i if g.index == 0 else 0,
                                                                                     0, 0, 0],
                                      replay=[0] * 4, recovery=[0] * 4)
        return s

    for window in (60.0, 3600.0):
        fs = FeatureStream(window_s=window)
        ws = [w for i in range(0, 3 * 3600 // 60 + 1) if (w := fs.feed(at(i))) is not None]
        last = ws[-1]
        assert last.gpu[0, GI["nvlink_worst_link_x"]] == pytest.approx(1.0)
        if window == 3600.0:
            assert last.gpu[0, GI["dram_ce_x"]] == pytest.approx(1.0, abs=0.02)
            assert last.port[0, PI["symbol_error_x"]] == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("boot_changes", [True, False])
def test_reset_makes_no_spike(boot_changes: bool) -> None:
    """A reboot (new boot_id) or a driver reload (same boot, counters back to 0) mid-stream."""
    samples = [_sample(i, ce=1_000_000 + i, ue=7, sym=50_000 + i, crc=9_000 + i) for i in range(20)]
    samples += [_sample(i, ce=i - 20, ue=0, sym=i - 20, crc=i - 20, boot="b1" if boot_changes else "b0")
                for i in range(20, 40)]
    ws = _windows(samples)
    g, p = np.vstack([w.gpu for w in ws]), np.vstack([w.port for w in ws])
    assert g[:, GI["dram_ce_x"]].max() <= 3.6 + 1e-9  # 1 per 10 s (360/h = 3.6x), never the million
    assert g[:, GI["dram_ue"]].max() == 0
    assert g[:, GI["nvlink_crc_rate"]].max() <= 6.0 + 1e-9
    assert p[:, PI["symbol_error_x"]].max() <= 36.0 + 1e-9  # 1 per 10 s: 360/h against 10/h


def test_32bit_wrap_counts_the_increments() -> None:
    base = 2**32 - 25
    samples = [_sample(i, sym=(base + 5 * i) % 2**32) for i in range(14)]
    ws = _windows(samples)
    rates = [w.port[0, PI["symbol_error_x"]] for w in ws]
    assert rates == [pytest.approx(180.0)] * len(rates)  # 5 per 10 s across the wrap: 1,800/h, 180x the limit


def test_duplicates_and_out_of_order_are_skipped() -> None:
    base = [_sample(i, ce=i) for i in range(20)]
    noisy = []
    for s in base:
        noisy += [s, s]  # duplicate
        if s.seq > 2:
            noisy.append(_sample(s.seq - 2, ce=0))  # late, old sample with a lower counter
    fs = FeatureStream(window_s=60.0)
    got = [w for s in noisy if (w := fs.feed(s)) is not None]
    want = _windows(base)
    assert [w.ts for w in got] == [w.ts for w in want]
    assert all(np.array_equal(a.gpu, b.gpu) for a, b in zip(got, want, strict=True))
    assert fs.skipped == len(noisy) - len(base)


def test_temperature_peer_deviation() -> None:
    s = _sample(0)
    hot = msgspec.structs.replace(s.gpus[2], temperature_c=70.0)
    samples = [msgspec.structs.replace(_sample(i), gpus=[*s.gpus[:2], hot, *s.gpus[3:]]) for i in range(8)]
    w = _windows(samples)[0]
    assert w.gpu[2, GI["temp_dev"]] > 19.0
    assert abs(w.gpu[0, GI["temp_dev"]]) < 1.0
    assert w.gpu[2, GI["temp_z"]] > 4.0


def test_feature_rows_have_the_declared_width_and_no_nan() -> None:
    s = _sample(0)
    blank = [msgspec.structs.replace(g, temperature_c=None, power_w=None, ecc=None, pcie=None, nvlink=None)
             for g in s.gpus]
    ws = _windows([msgspec.structs.replace(_sample(i), gpus=blank) for i in range(10)])
    assert ws and ws[0].gpu.shape == (4, len(GPU_FEATURES))
    assert not np.isnan(ws[0].gpu).any()


def test_empty_sample_is_fine() -> None:
    fs = FeatureStream()
    out = [fs.feed(Sample(host="h", ts=T0 + 10 * i, seq=i, collector_version="t")) for i in range(10)]
    ws = [w for w in out if w is not None]
    assert ws and ws[0].gpu.shape[0] == 0 and ws[0].port.shape[0] == 0


def test_an_idle_gpu_at_pcie_gen1_is_not_degraded_but_a_busy_one_is() -> None:
    """At idle the GPU drops its link to gen 1 to save power (review nvml.md §3): the feature read
    that as degradation on every idle GPU of a real host."""
    def at(i: int, util: float) -> Sample:
        s = _sample(i)
        for g in s.gpus:
            g.pcie = PcieLink(gen_current=1, gen_max=5, width_current=16, width_max=16, replay_counter=0)
            g.utilization_pct = util
        return s

    idle = _windows([at(i, 0.0) for i in range(20)])
    busy = _windows([at(i, 95.0) for i in range(20)])
    assert idle and all(w.gpu[:, GI["pcie_gen_ratio"]].min() == 1.0 for w in idle)
    assert busy and all(w.gpu[:, GI["pcie_gen_ratio"]].max() == pytest.approx(0.2) for w in busy)


def test_hopper_nvlink_data_errors_count_from_ecc_data() -> None:
    def hopper(i: int) -> Sample:
        s = _sample(i)
        for g in s.gpus:
            g.nvlink = NvlinkCounters(active=[True] * 4, crc_flit=[0] * 4, crc_data=[None] * 4, replay=[0] * 4,
                                      recovery=[0] * 4, ecc_data=[60 * i if g.index == 0 else 0, 0, 0, 0])
        return s

    ws = _windows([hopper(i) for i in range(30)])
    assert ws and all(w.gpu[0, GI["nvlink_crc_rate"]] > 0 for w in ws[1:])
    assert all(w.gpu[1:, GI["nvlink_crc_rate"]].max() == 0 for w in ws)
