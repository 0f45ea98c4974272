"""The common poll, assembled from bytes: a quiet host's line is a per-host template with a few numbers.

Most polls of most hosts change nothing but the timestamp, the sequence number and each GPU's
temperature, power and utilisation. For such a host the line is cut once into constant fragments
(everything :meth:`HostState.render` would encode) and the per-poll numbers, formatted in bulk
through lookup tables, are spliced in between. The result is byte-identical to
``encode(Sample(...))`` (the simulator tests compare both paths and re-encode every line).

A template is valid while the host is untouched: the engine drops it whenever an event, a fault
process or a background counter draw reaches the host, and whenever the host has pending kernel
events, Xids, a lost GPU or a fault-forced temperature or clock reason (those polls take the general
path). It is rebuilt on the next poll that is clean again.
"""

from __future__ import annotations

import msgspec
import numpy as np

from fleethealth.schema import Sample, encode

from .state import CLK_GPU_IDLE, GpuState, HostState
from .topology import COLLECTOR_VERSION, GPUS_PER_HOST

_TS, _SEQ = 0.5, 1
_CUT_TS = b'"ts":0.5,"seq":1,'
_GPUS = b'"@@gpus@@"'
SLOTS = 5 + 4 * GPUS_PER_HOST  # [prefix, ts seconds, ts fraction + ',"seq":', seq, head0, T0, P0, U0, head1, ..., U7, suffix]
TEMP_MAX = 256
POWER_DECI_MAX = 20_000  # 2 kW in tenths of a watt


class Tables:
    """Pre-formatted number fragments, each with the constant JSON that follows it."""

    def __init__(self) -> None:
        self.temp = [b"%d.0,\"power_w\":" % t for t in range(TEMP_MAX)]
        self.power = [repr(k / 10).encode() + b',"utilization_pct":' for k in range(POWER_DECI_MAX)]
        self.util = [b'%d.0,"clocks_event_reasons":%d}' % (u, CLK_GPU_IDLE if u == 0 else 0) for u in range(101)]
        # a timestamp rounded to the millisecond: repr() is "<seconds>.<millis without trailing zeros>"
        self.frac = [(b".%03d" % m).rstrip(b"0").ljust(2, b"0") + b',"seq":' for m in range(1000)]
        self.seq = np.array([b"%d" % i for i in range(4096)], dtype=object)

    def seqs(self, upto: int) -> np.ndarray:
        """Sequence numbers as bytes, indexable up to ``upto``."""
        if upto >= len(self.seq):
            self.seq = np.array([b"%d" % i for i in range(2 * upto + 1)], dtype=object)
        return self.seq


def build(hs: HostState) -> tuple[list[bytes], list[bytes]] | None:
    """(busy, idle) fragment lists for ``hs`` in its current state, or None when this host's next poll
    carries anything beyond the per-poll numbers."""
    if hs.events:
        return None
    for g in hs.gpus:
        if g.lost or g.xids or g.thermal_add or g.clk_fault:
            return None
    sp = hs.spec
    line = encode(Sample(host=sp.name, cluster=sp.cluster, rack=sp.rack, ts=_TS, seq=_SEQ,
                         collector_version=COLLECTOR_VERSION, boot_id=hs.boot_id, driver_version=hs.driver,
                         expected_gpus=GPUS_PER_HOST, gpus=msgspec.Raw(b"[" + _GPUS + b"]"),  # type: ignore[arg-type]
                         net_ports=hs.render_ports(), aer=hs._render_aer(), edac=hs._render_edac()))  # type: ignore[arg-type]
    pre, rest = line.split(_CUT_TS, 1)
    mid, suffix = rest.split(_GPUS, 1)
    hs.tmpl_mid = mid
    out = []
    for gen in (5, 1):
        parts = [pre + b'"ts":', b"", b"", b""]
        for g in hs.gpus:
            parts += [gpu_head(g, gen, mid), b"", b"", b""]
        parts.append(suffix)
        out.append(parts)
    return out[0], out[1]


def gpu_head(g: GpuState, gen: int, mid: bytes) -> bytes:
    """GPU ``g``'s constant fragment: its encoded head with what precedes it and ``,"temperature_c":``."""
    return (b"," + mid if g.spec.index == 0 else b",") + g.head(gen) + b',"temperature_c":'


_EMPTY = b""
_NL = b"\n"


class Assembler:
    """One interval's lines for the whole fleet, in (ts, host) order, mostly without a Python loop per host.

    Per host it keeps the busy and idle fragment rows of its template (``rows[0]``/``rows[1]``, one
    row per host, the last column the newline) and whether the row is valid; per poll the number
    columns are filled from the tables by numpy fancy indexing, the rows reordered by (ts, host) and
    joined once. Hosts without a valid template go through :meth:`HostState.render`.
    """

    def __init__(self, hosts: list[HostState], fast: bool = True) -> None:
        self.hosts = hosts
        self.fast = fast
        H = len(hosts)
        self.tab = Tables()
        self.temp = np.array(self.tab.temp, dtype=object)
        self.power = np.array(self.tab.power, dtype=object)
        self.util = np.array(self.tab.util, dtype=object)
        self.frac = np.array(self.tab.frac, dtype=object)
        self.rows = np.full((2 * H, SLOTS + 1), _EMPTY, dtype=object)  # busy templates, then idle ones
        self.valid = np.zeros(H, dtype=bool)
        self.seq = np.array([hs.seq for hs in hosts], dtype=np.int64)
        self.idx = np.arange(H)
        self.quiet_until = np.array([hs.quiet_until for hs in hosts], dtype=np.int64)
        self.blank = np.full(SLOTS + 1, _EMPTY, dtype=object)
        self.stale: list[tuple[int, int]] = []
        self.general = 0  # lines rendered through HostState.render

    def touch(self, h: int) -> None:
        """Host ``h``'s state is about to change: its template is stale."""
        self.valid[h] = False

    def touch_gpu(self, h: int, i: int) -> None:
        """Only GPU ``i``'s counters of host ``h`` are about to change (a background draw)."""
        if self.valid[h]:
            self.stale.append((h, i))

    def poll(self, t: int, ts: np.ndarray, temp: np.ndarray, power: np.ndarray, util: np.ndarray,
             busy: np.ndarray, miss: np.ndarray, touched: list[int]) -> tuple[int, int, np.ndarray]:
        """(samples, dropped, fragment rows in output order): join ``rows.ravel()`` for the block."""
        hosts = self.hosts
        H = len(hosts)
        for h in touched:  # only events and fault processes change quiet_until
            self.quiet_until[h] = hosts[h].quiet_until
        live = self.quiet_until <= t
        dropped = 0
        emit = live.copy()
        for h in np.flatnonzero(live & miss).tolist():
            hs = hosts[h]
            if not hs.events:  # lost in transit: a gap in seq
                self.seq[h] += 1
                dropped += 1
                emit[h] = False
                for g in hs.gpus:
                    g.xids = []
        for h, i in self.stale:  # refresh single GPU columns of still-valid templates
            if self.valid[h]:
                hs = hosts[h]
                g = hs.gpus[i]
                self.rows[h, 4 + 4 * i] = gpu_head(g, 5, hs.tmpl_mid)
                self.rows[H + h, 4 + 4 * i] = gpu_head(g, 1, hs.tmpl_mid)
        self.stale = []
        deci = np.rint(power * 10).astype(np.int64)
        ok = (self.fast and int(temp.min()) >= 0 and int(temp.max()) < TEMP_MAX and int(deci.min()) >= 0
              and int(deci.max()) < POWER_DECI_MAX and bool((deci / 10 == power).all()))
        slow: list[tuple[int, bytes]] = []
        for h in np.flatnonzero(emit & ~self.valid).tolist() if ok else np.flatnonzero(emit).tolist():
            hs = hosts[h]
            if ok and (tm := build(hs)) is not None:
                self.rows[h, :-1], self.rows[H + h, :-1] = tm
                self.rows[h, -1] = self.rows[H + h, -1] = _NL
                self.valid[h] = True
                continue
            hs.seq = int(self.seq[h])
            self.general += 1
            slow.append((h, hs.render(float(ts[h]), temp[h].tolist(), power[h].tolist(), util[h].tolist())))
        self.seq[emit] += 1
        order = np.lexsort((self.idx, ts))
        order = order[emit[order]]
        out = self.rows[np.where(busy[order], order, order + H)]
        if ok:
            tso = ts[order]
            ms = np.rint(tso * 1000).astype(np.int64)
            if len(ms) and bool((ms / 1000 == tso).all()) and int(ms.min()) >= 0 and int(ms.max()) < 10**15:
                sec, frac = np.divmod(ms, 1000)
                uniq, inv = np.unique(sec, return_inverse=True)
                out[:, 1] = np.array([b"%d" % x for x in uniq.tolist()], dtype=object)[inv]
                out[:, 2] = self.frac[frac]
            else:
                out[:, 1] = [repr(x).encode() for x in tso.tolist()]
                out[:, 2] = b',"seq":'
            seqo = self.seq[order]
            out[:, 3] = self.tab.seqs(int(seqo.max()) if len(seqo) else 0)[seqo]
            out[:, 5:-2:4] = self.temp[temp[order]]
            out[:, 6:-2:4] = self.power[deci[order]]
            out[:, 7:-2:4] = self.util[util[order]]
        if slow:
            pos = np.empty(len(self.idx), dtype=np.int64)
            pos[order] = np.arange(len(order))
            for h, line in slow:
                r = out[pos[h]]
                r[:] = self.blank
                r[0], r[-1] = line, _NL
        return len(order), dropped, out
