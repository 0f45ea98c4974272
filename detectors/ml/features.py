"""Windowed per-component features from the sample stream (pure: values in, values out; no I/O).

A :class:`HostFeatureState` holds one host's last counter snapshot and a few accumulators. Each
sample costs a handful of attribute reads (throttle bits, Xid events, lost GPUs are accumulated);
counter deltas and the feature rows are built once per window (``window_s`` of sample time), which
is what keeps the ML path cheap at fleet rates. A window yields a :class:`WindowFeatures`:
one row per GPU, one per network port, one for the host.

Rates are per minute over the window's sample-time span, except for the counters that have a
published operating limit (:mod:`fleethealth.limits`): their features (``*_x``) are the rate as a
multiple of that limit — HBM corrected ECC per GPU, PCIe replays per GPU, NVLink data-path errors of
the GPU's worst link, IB symbol errors per port, corrected errors of the worst DIMM — so 1.0 is the
line the field draws, whatever the poll interval or window, and a busy healthy part sits under it.
Counters are differenced with :func:`detectors.ml.counters.deltas` (the engine's counter_delta; no
reset or wrap spikes); a ``boot_id`` change, a gap
longer than ``max_gap_s`` or the first sample of a host re-baselines without emitting a window.
Samples older than or equal to the host's last timestamp (duplicates, out of order) are skipped
and counted in ``state.skipped``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from operator import attrgetter

import numpy as np

from detectors.engine.state import saturation
from detectors.ml.counters import deltas
from fleethealth.ids import normalise_pci as _normalise_pci
from fleethealth.limits import LIMITS
from fleethealth.schema import GpuSample, NetPort, NvlinkCounters, Sample
from fleethealth.xid import xid_table

FEATURE_SPEC = 2  # bump when a feature's meaning changes: models trained on another spec are refused

XID_BUCKETS = ("RESET_GPU", "CONTACT_SUPPORT", "RESTART_APP", "RESTART_BM", "WORKFLOW_XID_48",
               "WORKFLOW_NVLINK", "OTHER")
XID_LABELS = ("gpu_fell_off_bus", "gpu_dram_uce", "gpu_row_remap_failure", "gpu_sram_uce", "gpu_ecc_sbe_storm",
              "gpu_hw_error", "gpu_nvlink_error", "gpu_gsp_error", "app_error")
THROTTLE_BITS = (("thr_hw_slowdown", 0x8), ("thr_sw_thermal", 0x20), ("thr_hw_thermal", 0x40),
                 ("thr_power_brake", 0x80))
_THR_MASK = 0x8 | 0x20 | 0x40 | 0x80  # the reason bits a feature reads (idle, power cap ... are not faults)

GPU_FEATURES: tuple[str, ...] = (
    "dram_ce_x", "dram_ue", "sram_ce_rate", "sram_ue", "sram_threshold",
    "remap_corr", "remap_uncorr", "remap_pending", "remap_failure",
    "retired_sbe", "retired_dbe", "retired_pending",
    "pcie_replay_x", "pcie_gen_ratio", "pcie_width_ratio", "pcie_degraded_under_load",
    "aer_cor_rate", "aer_uncor",
    "nvlink_crc_rate", "nvlink_replay_rate", "nvlink_recovery_rate", "nvlink_worst_link_x",
    "nvlink_links_inactive",
    "temp_c", "temp_dev", "temp_z", "power_w", "power_dev", "util_pct", "util_dev",
    *(name for name, _ in THROTTLE_BITS),
    *(f"xid_bucket_{b.lower()}" for b in XID_BUCKETS), *(f"xid_{lab}" for lab in XID_LABELS),
    "lost",
)
PORT_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
                 "port_rcv_remote_physical_errors", "port_xmit_discards", "local_link_integrity_errors",
                 "excessive_buffer_overrun_errors")
# the port counters' rate features, in PORT_COUNTERS order (symbol errors against their limit)
PORT_RATES: tuple[str, ...] = tuple("symbol_error_x" if c == "symbol_error" else f"{c}_rate" for c in PORT_COUNTERS)
PORT_FEATURES: tuple[str, ...] = (
    *PORT_RATES, "state_down", "phys_not_linkup", "rate_ratio", "symbol_dev",
)
HOST_FEATURES: tuple[str, ...] = (
    "edac_ce_rate", "edac_ue", "edac_max_dimm_ce_x", "gpus_missing", "kern_mce", "kern_fell_off_bus",
    "kern_aer", "aer_other_cor_rate", "aer_other_uncor",
)
# per-minute rate -> multiple of the counter's limit
X_HBM, X_PCIE, X_NVLINK, X_SYMBOL, X_DIMM = (60.0 / LIMITS[n].per_hour for n in (
    "hbm_ce", "pcie_replays", "nvlink_crc", "ib_symbol_errors", "dimm_ce"))
GI = {n: i for i, n in enumerate(GPU_FEATURES)}
PI = {n: i for i, n in enumerate(PORT_FEATURES)}
HI = {n: i for i, n in enumerate(HOST_FEATURES)}
N_XID = len(XID_BUCKETS) + len(XID_LABELS)
_XID0 = GI["xid_bucket_reset_gpu"]


@cache
def _xid_slots() -> dict[int, tuple[int, int | None]]:
    """Xid -> (bucket slot, label slot) in the Xid block of the GPU row."""
    out: dict[int, tuple[int, int | None]] = {}
    for xid, info in xid_table().items():
        b = info.immediate
        b = "WORKFLOW_NVLINK" if b.startswith("WORKFLOW_NVLINK") else b
        b = "RESTART_BM" if b in ("RESTART_BM", "RESTART_VM") else b
        bslot = XID_BUCKETS.index(b) if b in XID_BUCKETS else XID_BUCKETS.index("OTHER")
        lslot = len(XID_BUCKETS) + XID_LABELS.index(info.failure_mode) if info.failure_mode in XID_LABELS else None
        out[xid] = (bslot, lslot)
    return out


pci_key = cache(_normalise_pci)  # one canonical form for every part (fleethealth.ids), memoised


def gpu_component(g: GpuSample) -> str:
    return g.uuid or f"gpu{g.index}"


@dataclass(slots=True)
class WindowFeatures:
    host: str
    cluster: str
    rack: str
    t0: float
    ts: float
    gpu_ids: list[str]
    gpu: np.ndarray  # (n_gpus, len(GPU_FEATURES))
    port_ids: list[str]
    port: np.ndarray  # (n_ports, len(PORT_FEATURES))
    host_row: np.ndarray  # (len(HOST_FEATURES),)
    dimm: str = "host"  # the DIMM with the most corrected errors in the window, for host findings
    gpu_pci: list[str] = field(default_factory=list)  # pci_key of each GPU row ("" when unknown)


def pci_of_gpu(w: WindowFeatures, gpu: str) -> str:
    """The PCI address of a GPU row of ``w`` (PCIe findings name the device, as the rules do); the
    GPU id itself when the sample did not carry one."""
    try:
        return w.gpu_pci[w.gpu_ids.index(gpu)] or gpu
    except (ValueError, IndexError):
        return gpu


@dataclass(slots=True)
class HostFeatureState:
    boot_id: str | None = None
    last_ts: float = -1.0
    t0: float = 0.0
    gpu_snap: dict[str, list[int | None]] = field(default_factory=dict)
    nvl_snap: dict[str, list[int | None]] = field(default_factory=dict)
    port_snap: dict[str, list[int | None]] = field(default_factory=dict)
    aer_snap: dict[str, list[int]] = field(default_factory=dict)
    edac_snap: dict[str, list[int | None]] = field(default_factory=dict)
    throttle: dict[int, int] = field(default_factory=dict)  # GPU index -> OR of reason bits
    xids: dict[int, list[int]] = field(default_factory=dict)  # GPU index -> Xid slot counts
    lost: set[int] = field(default_factory=set)
    kern: list[int] = field(default_factory=lambda: [0, 0, 0])  # mce, fell_off_bus, aer
    skipped: int = 0
    # what the last window close saw, to skip unchanged parts (see "Unchanged parts" in _close)
    gpu_seen: dict[str, tuple[tuple[object, ...], list[float], float]] = field(default_factory=dict)
    # (parts, GPU ids, the quiet matrix: row[:_STATIC] quiet and zeros after, the PCIe downshift
    # ratios when one is under 1.0 else None)
    gpu_block: tuple[list[tuple[object, ...]], list[str], np.ndarray, list[float] | None] | None = None
    ports_seen: tuple[object, np.ndarray | None, list[str]] = (None, None, [])
    aer_seen: object = None
    edac_seen: object = None
    reuse: bool = True  # False: recompute every part at every close (the reference the tests compare with)
    # the decoder's base (detectors.engine.fastdecode.IncrementalDecoder.base) of the last sample
    # accumulated, when that sample added nothing (no throttle bit, Xid, lost GPU or kernel event): a
    # sample with the same base holds the same GPU fields but its gauges, hence adds nothing either
    quiet_base: object = None
    # the base of the last window's closing sample and what _close read of its GPUs but the gauges
    # (the GPUs' PCI keys, how many answered): the same for a closing sample with that base
    close_base: tuple[object, list[str], int] = (None, [], 0)


def _accumulate(st: HostFeatureState, s: Sample) -> bool:
    """Add the sample's events to the window's accumulators; True when it added nothing."""
    thr = st.throttle
    quiet = not s.kernel_events
    for g in s.gpus:
        r = g.clocks_event_reasons
        if r and r & _THR_MASK:  # only the bits a feature reads are kept
            thr[g.index] = thr.get(g.index, 0) | (r & _THR_MASK)
            quiet = False
        if g.xids:
            quiet = False
            slots = _xid_slots()
            row = st.xids.setdefault(g.index, [0] * N_XID)
            for xe in g.xids:
                b, lab = slots.get(xe.xid, (len(XID_BUCKETS) - 1, None))
                row[b] += 1
                if lab is not None:
                    row[lab] += 1
        if not g.present or g.nvml_error:
            st.lost.add(g.index)
            quiet = False
    if s.kernel_events:
        k = st.kern
        for ev in s.kernel_events:
            if ev.kind == "mce":
                k[0] += 1
            elif ev.kind == "fell_off_bus":
                k[1] += 1
            elif ev.kind == "aer":
                k[2] += 1
    return quiet


def _gpu_counters(g: GpuSample) -> list[int | None]:
    e, rr, rp, p = g.ecc, g.remapped_rows, g.retired_pages, g.pcie
    out: list[int | None] = [None] * 9
    if e is not None:
        out[0] = e.dram_corrected_volatile if e.dram_corrected_volatile is not None else e.dram_corrected_aggregate
        out[1] = e.dram_uncorrected_volatile if e.dram_uncorrected_volatile is not None \
            else e.dram_uncorrected_aggregate
        out[2] = e.sram_corrected_volatile if e.sram_corrected_volatile is not None else e.sram_corrected_aggregate
        out[3] = e.sram_uncorrected_volatile if e.sram_uncorrected_volatile is not None \
            else e.sram_uncorrected_aggregate
    if rr is not None:
        out[4], out[5] = rr.correctable, rr.uncorrectable
    if rp is not None:
        out[6], out[7] = rp.sbe, rp.dbe
    if p is not None and p.replay_counter is not None:
        out[8] = p.replay_counter + ((p.replay_rollover or 0) << 32) if p.replay_rollover else p.replay_counter
    return out


def _data_path(n: NvlinkCounters) -> list[int | None]:
    """Per-link data-path errors: CRC_DATA before Hopper, ECC_DATA on Hopper+ (where CRC_DATA is
    not supported), whichever the link answers."""
    if not n.ecc_data:
        return list(n.crc_data)
    return [c if c is not None else (n.ecc_data[i] if i < len(n.ecc_data) else None) for i, c in enumerate(n.crc_data)]


def _aer_totals(d: dict[str, int], total_key: str) -> int:
    return d[total_key] if total_key in d else sum(d.values())


_NF = len(GPU_FEATURES)
_I_TEMP, _I_POWER, _I_UTIL = GI["temp_c"], GI["power_w"], GI["util_pct"]
_I_THR = GI["thr_hw_slowdown"]
_I_LOST = GI["lost"]


_STATIC = GI["nvlink_links_inactive"] + 1  # row[:_STATIC]: counters and flags; the rest: gauges, events
_I_DEGRADED = GI["pcie_degraded_under_load"]
_gpu_parts = attrgetter("ecc", "remapped_rows", "retired_pages", "pcie", "nvlink")


def _gpu_static(st: HostFeatureState, key: str, g: GpuSample, per_min: float) -> tuple[list[float], float]:
    """Counter rates and state flags of one GPU (``row[:_STATIC]``) and its PCIe downshift ratio;
    advances the GPU's counter snapshots."""
    row = [0.0] * _STATIC
    cur = _gpu_counters(g)
    prev = st.gpu_snap.get(key)
    if prev != cur:
        d = deltas(prev, cur)
        st.gpu_snap[key] = cur
        row[0], row[1], row[2], row[3] = d[0] * per_min * X_HBM, d[1], d[2] * per_min, d[3]
        row[5], row[6], row[9], row[10], row[12] = d[4], d[5], d[6], d[7], d[8] * per_min * X_PCIE
    e, rr, rp, p = g.ecc, g.remapped_rows, g.retired_pages, g.pcie
    if e is not None and e.sram_threshold_exceeded:
        row[4] = 1.0
    if rr is not None and (rr.pending or rr.failure):
        row[7], row[8] = float(bool(rr.pending)), float(bool(rr.failure))
    if rp is not None and rp.pending:
        row[11] = 1.0
    gen_r = width_r = 1.0
    if p is not None:
        # an idle GPU drops its link to gen 1 to save power (not a fault): the generation only
        # counts under load, as in rule pcie.gpu.gen-under-load; width does not drop for power saving
        busy = g.utilization_pct is not None and g.utilization_pct >= 50
        if busy and p.gen_current and p.gen_max and p.gen_current < p.gen_max:
            gen_r = p.gen_current / p.gen_max
        if p.width_current and p.width_max and p.width_current < p.width_max:
            width_r = p.width_current / p.width_max
    row[13], row[14] = gen_r, width_r
    nvl = g.nvlink
    if nvl is not None and nvl.crc_flit:
        nv = [*nvl.crc_flit, *_data_path(nvl), *nvl.replay, *nvl.recovery]
        prev_nv = st.nvl_snap.get(key)
        if prev_nv != nv:
            nd = deltas(prev_nv, nv)
            st.nvl_snap[key] = nv
            n = len(nvl.crc_flit)
            if len(nd) == 4 * n:
                crc = [nd[i] + nd[n + i] for i in range(n)]
                rep, rec = nd[2 * n:3 * n], nd[3 * n:]
                row[18], row[19], row[20] = sum(crc) * per_min, sum(rep) * per_min, sum(rec) * per_min
                row[21] = max(nd[n:2 * n]) * per_min * X_NVLINK  # the worst link's data-path errors
        if False in nvl.active:
            row[22] = float(nvl.active.count(False))
    return row, min(gen_r, width_r)


_RATE_SLOTS = (0, 2, 12, 18, 19, 20, 21)  # rates: zero when the counters did not move
_COUNT_SLOTS = (1, 3, 5, 6, 9, 10)  # counter deltas kept as counts


def _quiet(row: list[float]) -> list[float]:
    """The static part a GPU shows when none of its counters moved (flags and ratios kept)."""
    q = row.copy()
    for i in (*_RATE_SLOTS, *_COUNT_SLOTS):
        q[i] = 0.0
    return q


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2.0


_I_TEMP_DEV, _I_POWER_DEV, _I_UTIL_DEV, _I_TEMP_Z = GI["temp_dev"], GI["power_dev"], GI["util_dev"], GI["temp_z"]
_NAN = math.nan


_gauges = attrgetter("temperature_c", "power_w", "utilization_pct")


def _gauge_columns(gpus: list[GpuSample]) -> list[list[float]]:
    """The gauge columns temp_c, temp_dev, temp_z, power_w, power_dev, util_pct, util_dev
    (contiguous in the row), one value per GPU in each. Deviations are from the host's median GPU;
    a gauge NVML could not read (None, NaN) is 0 with deviation 0 and takes no part in the median.
    When every GPU read both gauges (the usual case) the same arithmetic runs column-wise."""
    if len(gpus) < 2:
        return [list(c) for c in zip(*_gauge_rows(gpus), strict=True)] if gpus else [[] for _ in range(7)]
    temps, powers, utils = map(list, zip(*map(_gauges, gpus), strict=True))
    ts, ps = sum(temps) if None not in temps else _NAN, sum(powers) if None not in powers else _NAN
    if ts != ts or ps != ps:  # a gauge missing or NaN (or an inf - inf sum): GPU by GPU
        return [list(c) for c in zip(*_gauge_rows(gpus), strict=True)]
    utils = [u or 0.0 for u in utils]
    mt, mp, mu = _median(temps), _median(powers), _median(utils)
    scale = max(_median([abs(v - mt) for v in temps]) * 1.4826, 2.0)
    td = [t - mt for t in temps]
    return [temps, td, [d / scale for d in td], powers, [p - mp for p in powers], utils, [u - mu for u in utils]]


def _gauge_rows(gpus: list[GpuSample]) -> list[list[float]]:
    """:func:`_gauge_columns` GPU by GPU (rows), whatever the gauges hold."""
    temps = [g.temperature_c for g in gpus]
    powers = [g.power_w for g in gpus]
    utils = [g.utilization_pct or 0.0 for g in gpus]
    t_ok = [v for v in temps if v is not None and v == v]
    p_ok = [v for v in powers if v is not None and v == v]
    mt = _median(t_ok) if len(t_ok) >= 2 else None
    mp = _median(p_ok) if len(p_ok) >= 2 else None
    mu = _median(utils) if len(utils) >= 2 else None
    scale = max(_median([abs(v - mt) for v in t_ok]) * 1.4826, 2.0) if mt is not None else 1.0
    out = []
    for t, p, u in zip(temps, powers, utils, strict=True):
        if t is None or t != t:
            t = td = 0.0
        else:
            td = t - mt if mt is not None else 0.0
        if p is None or p != p:
            p = pd = 0.0
        else:
            pd = p - mp if mp is not None else 0.0
        out.append([t, td, td / scale, p, pd, u, u - mu if mu is not None else 0.0])
    return out


def _gpu_matrix(st: HostFeatureState, gpus: list[GpuSample], per_min: float,
                aer_d: dict[str, list[int]], same: bool = False) -> tuple[np.ndarray, list[str]]:
    """The window's GPU rows (n_gpus, len(GPU_FEATURES)) and the GPUs' component ids.

    ``row[:_STATIC]`` (counter rates, state flags, PCIe ratios) comes from the host's cached quiet
    block when no GPU's sub-objects changed since the last close; gauges and the window's events
    are written over it column-wise, and the peer columns use the host's median GPU. ``same``: the
    GPUs are the last close's but for their gauges (the decoder's base says so), whose block holds."""
    n = len(gpus)
    block = st.gpu_block
    parts = None if same and block is not None else [_gpu_parts(g) for g in gpus]
    if block is not None and st.reuse and (parts is None or block[0] == parts):
        ids, m, lows = block[1], block[2].copy(), block[3]
    else:  # some GPU's counters or flags changed: per GPU, the changed ones recomputed
        parts = parts if parts is not None else [_gpu_parts(g) for g in gpus]
        ids, rows, lows = [], [], []
        for g, pt in zip(gpus, parts, strict=True):
            key = gpu_component(g)
            seen = st.gpu_seen.get(key)
            if seen is not None and st.reuse and seen[0] == pt:
                row, low = seen[1], seen[2]
            else:
                row, low = _gpu_static(st, key, g, per_min)
                st.gpu_seen[key] = (pt, _quiet(row), low)
            ids.append(key)
            rows.append(row)
            lows.append(low)
        quiet = np.zeros((n, _NF))
        quiet[:, :_STATIC] = np.array([st.gpu_seen[k][1] for k in ids], dtype=np.float64).reshape(n, _STATIC)
        st.gpu_block = (parts, ids, quiet, lows if any(low < 1.0 for low in lows) else None)
        m = np.zeros((n, _NF))
        m[:, :_STATIC] = np.array(rows, dtype=np.float64).reshape(n, _STATIC)
    if n:
        m[:, _I_TEMP:_I_UTIL_DEV + 1] = np.array(_gauge_columns(gpus), dtype=np.float64).T
    if lows is not None and any(low < 1.0 for low in lows):
        for i, (g, low) in enumerate(zip(gpus, lows, strict=True)):
            if (g.utilization_pct or 0.0) >= 30.0 and low < 1.0:  # links downshift at idle by design
                m[i, _I_DEGRADED] = 1.0 - low
    if aer_d:
        for i, g in enumerate(gpus):
            ad = aer_d.get(pci_key(g.pci_bus_id)) if g.pci_bus_id else None
            if ad is not None:
                m[i, 16], m[i, 17] = ad[0] * per_min, ad[1]
    if st.throttle or st.xids or st.lost:
        for i, g in enumerate(gpus):
            bits = st.throttle.get(g.index, 0)
            if bits & 0xE8:
                for j, (_, mask) in enumerate(THROTTLE_BITS):
                    m[i, _I_THR + j] = float(bool(bits & mask))
            xr = st.xids.get(g.index)
            if xr is not None:
                m[i, _XID0:_XID0 + N_XID] = xr
            if g.index in st.lost:  # the closing sample's lost GPUs too: update() accumulated it
                m[i, _I_LOST] = 1.0
    return m, ids


_NP = len(PORT_FEATURES)
_ZERO_PORT = [0.0] * len(PORT_COUNTERS)
_PORT_SATURATION = tuple(saturation(n) for n in PORT_COUNTERS)  # IB widths: detectors/engine/counters.yaml


def _port_row(st: HostFeatureState, p: NetPort, per_min: float) -> list[float]:
    key = f"{p.device}/{p.port}"
    c = p.counters
    cur = [c.get(n) for n in PORT_COUNTERS]
    prev = st.port_snap.get(key)
    if prev != cur:
        d = deltas(prev, cur, _PORT_SATURATION)
        st.port_snap[key] = cur
        row = [x * per_min for x in d]
        row[0] *= X_SYMBOL
        row[2] = float(d[2])  # link_downed: a count, not a rate
    else:
        row = _ZERO_PORT.copy()
    row += [float(p.state.upper() not in ("ACTIVE", "")), float(p.phys_state not in ("LinkUp", "")),
            p.rate_gbps or 0.0, 0.0]
    return row


def _port_peers(rows: list[list[float]]) -> None:
    top = max(r[-2] for r in rows)
    sym = [math.log1p(r[0] + r[1]) for r in rows]
    med = _median(sym)
    for r, v in zip(rows, sym, strict=True):
        r[-2] = r[-2] / top if top > 0 else 1.0
        r[-1] = v - med


def update(st: HostFeatureState, s: Sample, window_s: float = 60.0, max_gap_s: float = 600.0,
           base: object = None) -> WindowFeatures | None:
    """Feed one sample; return the window's features when ``s`` closes a window, else None.
    ``base``: the decoder's base of ``s`` (:attr:`detectors.engine.fastdecode.IncrementalDecoder.base`,
    or None): a sample with the base of the host's last one that added no event adds none either
    (they differ in ts, seq and the GPUs' gauges only), and its per-GPU event scan is skipped."""
    if s.ts <= st.last_ts:
        st.skipped += 1
        return None
    rebase = (st.last_ts < 0 or (s.boot_id != st.boot_id and bool(s.boot_id or st.boot_id))
              or s.ts - st.last_ts > max_gap_s)
    st.last_ts = s.ts
    if rebase:
        _rebaseline(st, s, base)
        return None
    if base is None or base is not st.quiet_base or not st.reuse:
        st.quiet_base = base if _accumulate(st, s) else None
    if s.ts - st.t0 < window_s:
        return None
    per_min = 60.0 / (s.ts - st.t0)
    out = _close(st, s, per_min, base)
    st.t0 = s.ts
    st.throttle.clear()
    st.xids.clear()
    st.lost.clear()
    st.kern = [0, 0, 0]
    return out


def _rebaseline(st: HostFeatureState, s: Sample, base: object = None) -> None:
    fresh = HostFeatureState(boot_id=s.boot_id, last_ts=s.ts, t0=s.ts, skipped=st.skipped, reuse=st.reuse)
    for name in HostFeatureState.__slots__:  # type: ignore[attr-defined]
        setattr(st, name, getattr(fresh, name))
    _close(st, s, 0.0, base)  # takes the snapshots; its rows are discarded


def _close(st: HostFeatureState, s: Sample, per_min: float, base: object = None) -> WindowFeatures:
    """The window's rows. Unchanged parts: a GPU whose ECC / remap / retirement / PCIe / NVLink
    sub-objects equal those of the last close, a port list, AER list or EDAC list equal to the last
    close's, moved no counter, so their deltas are zero and their rows are the cached quiet ones
    (with the incremental decoder these are the same objects and the test is one identity check).
    ``base``: the decoder's base of ``s`` (None: none known); a closing sample with the base of the
    last close's holds that one's GPUs but for their gauges, so their sub-objects are not compared
    and their PCI keys and presence are the last close's."""
    cb = st.close_base
    same = base is not None and base is cb[0] and st.reuse
    aer_d: dict[str, list[int]] = {}
    other_cor = other_uncor = 0.0
    if s.aer != st.aer_seen or not st.reuse:
        st.aer_seen = s.aer
        gpu_addrs = {pci_key(g.pci_bus_id) for g in s.gpus if g.pci_bus_id}
        for a in s.aer:
            k = pci_key(a.pci_addr)
            cur = [_aer_totals(a.correctable, "TOTAL_ERR_COR"),
                   _aer_totals(a.fatal, "TOTAL_ERR_FATAL") + _aer_totals(a.nonfatal, "TOTAL_ERR_NONFATAL")]
            d = deltas(st.aer_snap.get(k), cur)  # type: ignore[arg-type]
            st.aer_snap[k] = cur
            if d[0] or d[1]:
                aer_d[k] = d
                if k not in gpu_addrs:
                    other_cor += d[0] * per_min
                    other_uncor += d[1]
    gpu, gpu_ids = _gpu_matrix(st, s.gpus, per_min, aer_d, same)
    ports_obj, quiet_ports, port_ids = st.ports_seen
    if quiet_ports is not None and st.reuse and s.net_ports == ports_obj:
        port = quiet_ports
    else:
        port_ids = [f"{p.device}/{p.port}" for p in s.net_ports]
        prows = [_port_row(st, p, per_min) for p in s.net_ports]
        if prows:
            _port_peers(prows)
        port = np.array(prows, dtype=np.float64).reshape(len(prows), _NP)
        quiet = port.copy()
        quiet[:, :len(PORT_COUNTERS)] = 0.0
        quiet[:, PI["symbol_dev"]] = 0.0
        quiet.flags.writeable = False  # shared by every window until a port changes
        st.ports_seen = (s.net_ports, quiet, port_ids)
    host = np.zeros(len(HOST_FEATURES))
    best_dimm, best_ce = "host", 0
    if s.edac != st.edac_seen or not st.reuse:
        st.edac_seen = s.edac
        for mc in s.edac:
            cur_mc: list[int | None] = [mc.ce_count, mc.ue_count]
            k = f"mc{mc.mc}"
            d = deltas(st.edac_snap.get(k), cur_mc)
            st.edac_snap[k] = cur_mc
            host[0] += d[0] * per_min
            host[1] += d[1]
            for dimm in mc.dimms:
                dk = f"{k}/{dimm.label}"
                dd = deltas(st.edac_snap.get(dk), [dimm.ce, dimm.ue])
                st.edac_snap[dk] = [dimm.ce, dimm.ue]
                if dd[0] > best_ce:
                    best_dimm, best_ce = dimm.label, dd[0]
    host[2] = best_ce * per_min * X_DIMM
    if same:
        gpu_pci, present = cb[1].copy(), cb[2]
    else:
        gpu_pci = [pci_key(g.pci_bus_id) if g.pci_bus_id else "" for g in s.gpus]
        present = sum(1 for g in s.gpus if g.present and g.nvml_error is None)
        st.close_base = (base, gpu_pci.copy(), present) if base is not None else (None, [], 0)
    host[3] = float(max(0, s.expected_gpus - present)) if s.expected_gpus else 0.0
    host[4], host[5], host[6] = st.kern
    host[7], host[8] = other_cor, other_uncor
    return WindowFeatures(s.host, s.cluster, s.rack, st.t0, s.ts, gpu_ids, gpu, port_ids, port, host, best_dimm,
                          gpu_pci)


class FeatureStream:
    """Per-host feature state for a stream of samples from many hosts.

    ``consumers`` detectors may share one stream (features computed once per sample): the same
    sample object fed again, up to ``consumers`` times in all, returns the window already computed;
    a further feed of it is a duplicate like any other."""

    def __init__(self, window_s: float = 60.0, max_gap_s: float = 600.0, consumers: int = 1,
                 reuse: bool = True) -> None:
        self.window_s = window_s
        self.reuse = reuse
        self.max_gap_s = max_gap_s
        self.consumers = consumers
        self.hosts: dict[str, HostFeatureState] = {}
        self._last: tuple[Sample | None, WindowFeatures | None] = (None, None)
        self._fed = 0

    def feed(self, s: Sample, base: object = None) -> WindowFeatures | None:
        """``base``: the decoder's base of ``s`` (see :func:`update`; None: none known)."""
        if s is self._last[0] and self._fed < self.consumers:
            self._fed += 1
            return self._last[1]
        st = self.hosts.get(s.host)
        if st is None:
            st = self.hosts[s.host] = HostFeatureState(reuse=self.reuse)
        w = update(st, s, self.window_s, self.max_gap_s, base)
        self._last, self._fed = (s, w), 1
        return w

    @property
    def skipped(self) -> int:
        return sum(st.skipped for st in self.hosts.values())

    def reset(self) -> None:
        self.hosts.clear()
        self._last = (None, None)

    def forget_host(self, host: str) -> None:
        self.hosts.pop(host, None)
