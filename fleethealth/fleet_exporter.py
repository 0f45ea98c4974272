"""Collector-style per-host metrics for a whole fleet, from the newest sample of each host.

``fleethealth run`` replays or simulates many hosts in one process; this collector lets Prometheus
scrape them as if each host's collector exporter were up: every series carries ``host`` (and
``rack``). Counters are exported raw, as the collector reads them; Xid events, which arrive as
events rather than counters, are counted here per GPU (starting at 0 for every GPU, so that
``increase()`` sees the first one).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fleethealth.schema import Sample

GPU_INFO = "fleethealth_gpu_info"
ECC = "fleethealth_gpu_ecc_errors"  # counter (_total) {location, type}
REMAPPED = "fleethealth_gpu_remapped_rows"
PCIE_GEN = "fleethealth_gpu_pcie_link_gen"
PCIE_WIDTH = "fleethealth_gpu_pcie_link_width"
PCIE_REPLAY = "fleethealth_gpu_pcie_replay"
NVLINK = "fleethealth_gpu_nvlink_errors"
XID = "fleethealth_gpu_xid_events"
XID_BY_CODE = "fleethealth_gpu_xid_events_by_code"
NET = "fleethealth_net_port_counter"
NET_UP = "fleethealth_net_port_up"
EDAC = "fleethealth_edac_errors"

_ECC_FIELDS = (("dram", "corrected", "dram_corrected_volatile"), ("dram", "uncorrected", "dram_uncorrected_volatile"),
               ("sram", "corrected", "sram_corrected_volatile"), ("sram", "uncorrected", "sram_uncorrected_volatile"))


class FleetSampleExporter:
    """A prometheus-client collector over the newest sample per host (thread-safe)."""

    def __init__(self) -> None:
        self._latest: dict[str, Sample] = {}
        self._xids: dict[tuple[str, str], int] = {}
        self._xid_codes: dict[tuple[str, str, str], int] = {}
        self._lock = threading.Lock()

    def observe(self, s: Sample) -> None:
        with self._lock:
            self._latest[s.host] = s
            for g in s.gpus:
                key = (s.host, str(g.index))
                self._xids.setdefault(key, 0)
                for x in g.xids:
                    self._xids[key] += 1
                    code = (s.host, str(g.index), str(x.xid))
                    self._xid_codes[code] = self._xid_codes.get(code, 0) + 1

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            samples = sorted(self._latest.values(), key=lambda s: s.host)
            xids = dict(self._xids)
            codes = dict(self._xid_codes)
        gl = ["host", "rack", "gpu"]
        info = GaugeMetricFamily(GPU_INFO, "GPU identity (value 1).", labels=[*gl, "uuid", "pci_bus_id", "name"])
        ecc = CounterMetricFamily(ECC, "GPU ECC errors since driver load (volatile) by location and type.",
                                  labels=[*gl, "location", "type"])
        remap = GaugeMetricFamily(REMAPPED, "GPU remapped rows (counts; pending/failure as 0/1).",
                                  labels=[*gl, "kind"])
        gen = GaugeMetricFamily(PCIE_GEN, "GPU PCIe link generation.", labels=[*gl, "which"])
        width = GaugeMetricFamily(PCIE_WIDTH, "GPU PCIe link width.", labels=[*gl, "which"])
        replay = CounterMetricFamily(PCIE_REPLAY, "GPU PCIe replay counter.", labels=gl)
        nvl = CounterMetricFamily(NVLINK, "NVLink error counters per link.", labels=[*gl, "link", "counter"])
        for s in samples:
            for g in s.gpus:
                lab = [s.host, s.rack, str(g.index)]
                info.add_metric([*lab, g.uuid, g.pci_bus_id, g.name], 1)
                if g.ecc is not None:
                    for loc, typ, attr in _ECC_FIELDS:
                        v = getattr(g.ecc, attr)
                        if v is not None:
                            ecc.add_metric([*lab, loc, typ], v)
                r = g.remapped_rows
                if r is not None:
                    for kind in ("correctable", "uncorrectable", "pending", "failure"):
                        v = getattr(r, kind)
                        if v is not None:
                            remap.add_metric([*lab, kind], float(v))
                p = g.pcie
                if p is not None:
                    for fam, cur, mx in ((gen, p.gen_current, p.gen_max), (width, p.width_current, p.width_max)):
                        if cur is not None:
                            fam.add_metric([*lab, "current"], cur)
                        if mx is not None:
                            fam.add_metric([*lab, "max"], mx)
                    if p.replay_counter is not None:
                        replay.add_metric(lab, p.replay_counter)
                n = g.nvlink
                if n is not None:
                    for counter in ("crc_flit", "crc_data", "replay", "recovery"):
                        for link, v in enumerate(getattr(n, counter)):
                            if v is not None:
                                nvl.add_metric([*lab, str(link), counter], v)
        yield from (info, ecc, remap, gen, width, replay, nvl)

        xf = CounterMetricFamily(XID, "Xid events seen per GPU.", labels=["host", "gpu"])
        for (host, gpu), v in sorted(xids.items()):
            xf.add_metric([host, gpu], v)
        yield xf
        xc = CounterMetricFamily(XID_BY_CODE, "Xid events seen per GPU and Xid code.", labels=["host", "gpu", "xid"])
        for (host, gpu, code), v in sorted(codes.items()):
            xc.add_metric([host, gpu, code], v)
        yield xc

        net = CounterMetricFamily(NET, "InfiniBand / RoCE port counters, raw.",
                                  labels=["host", "rack", "device", "port", "counter"])
        up = GaugeMetricFamily(NET_UP, "Port state ACTIVE and physical state LinkUp (1) or not (0).",
                               labels=["host", "rack", "device", "port"])
        edac = CounterMetricFamily(EDAC, "EDAC memory errors per memory controller.",
                                   labels=["host", "rack", "mc", "type"])
        for s in samples:
            for port in s.net_ports:
                lab = [s.host, s.rack, port.device, str(port.port)]
                up.add_metric(lab, 1.0 if port.state.upper() == "ACTIVE" and port.phys_state == "LinkUp" else 0.0)
                for name, v in sorted(port.counters.items()):
                    net.add_metric([*lab, name], v)
            for mc in s.edac:
                for typ, v in (("ce", mc.ce_count), ("ue", mc.ue_count)):
                    if v is not None:
                        edac.add_metric([s.host, s.rack, str(mc.mc), typ], v)
        yield from (net, up, edac)
