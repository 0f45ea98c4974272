"""Host drill-down: one host's GPUs, PCIe links, NVLinks, network ports and DIMMs, with Xid events
as annotations. Templated by ``$host``; reads the collector exporter's metrics, named in
``collectors/metrics.tsv`` (``fleethealth collect`` on each host, or ``fleethealth run`` for a
whole simulated / replayed fleet; tests/dashboards checks every name against the catalogue).
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from dashboards.panels import DATASOURCE, dashboard, host_variable, row, table, timeseries

UID = "fleethealth-host-drilldown"
TITLE = "fleethealth / Host drill-down"

PRESENT = "fleethealth_gpu_present"
ECC = "fleethealth_gpu_ecc_errors_total"
REMAPPED = "fleethealth_gpu_remapped_rows"
REMAP_PENDING = "fleethealth_gpu_remap_pending"
REMAP_FAILURE = "fleethealth_gpu_remap_failure"
PCIE_GEN = "fleethealth_gpu_pcie_link_gen"
PCIE_WIDTH = "fleethealth_gpu_pcie_link_width"
PCIE_REPLAY = "fleethealth_gpu_pcie_replay_total"
NVLINK = "fleethealth_gpu_nvlink_errors_total"
NET = "fleethealth_net_port_errors_total"
EDAC = "fleethealth_edac_errors_total"
XID = "fleethealth_gpu_xid_events_total"

H = '{cluster=~"$cluster", host="$host"}'
CORRECTED = '{cluster=~"$cluster", host="$host", scope="volatile", type="corrected"}'
UNCORRECTED = '{cluster=~"$cluster", host="$host", scope="volatile", type="uncorrected"}'
NET_ERRORS = '{cluster=~"$cluster", host="$host", counter=~".*(err|downed|discard|recovery).*"}'
RATE = "[$__rate_interval]"


def build() -> Dashboard:
    # A Xid counter series appears with its first event, so "new series" counts as an event too.
    xid_new = f"({XID}{H} unless {XID}{H} offset $__rate_interval)"
    xid_annotation = {
        "name": "Xid events",
        "datasource": DATASOURCE,
        "enable": True,
        "iconColor": "red",
        "expr": f"sum by (gpu, xid) ((increase({XID}{H}{RATE}) > 0) or {xid_new})",
        "step": "15s",
        "titleFormat": "Xid {{xid}}",
        "textFormat": "GPU {{gpu}}: Xid {{xid}}",
        "tagKeys": "gpu,xid",
        "useValueForTime": False,
    }
    panels = [
        row("GPU memory"),
        timeseries("ECC corrected errors / s by GPU and location",
                   (f"sum by (gpu, location) (rate({ECC}{CORRECTED}{RATE}))", "GPU {{gpu}} {{location}}")),
        timeseries("ECC uncorrected errors by GPU and location (since driver load)",
                   (f"sum by (gpu, location) ({ECC}{UNCORRECTED})", "GPU {{gpu}} {{location}}")),
        timeseries("Remapped rows", (f"sum by (gpu, kind) ({REMAPPED}{H})", "GPU {{gpu}} {{kind}}"),
                   (f"max by (gpu) ({REMAP_PENDING}{H})", "GPU {{gpu}} remap pending"),
                   (f"max by (gpu) ({REMAP_FAILURE}{H})", "GPU {{gpu}} remap failed")),
        table("Xid events by GPU", (f"sum by (gpu, xid) ({XID}{H})", "")),
        row("PCIe and NVLink"),
        timeseries("PCIe link generation (current vs max)", (f"max by (gpu, kind) ({PCIE_GEN}{H})",
                                                             "GPU {{gpu}} {{kind}}"), width=8),
        timeseries("PCIe link width (current vs max)", (f"max by (gpu, kind) ({PCIE_WIDTH}{H})",
                                                        "GPU {{gpu}} {{kind}}"), width=8),
        timeseries("PCIe replays / s", (f"sum by (gpu) (rate({PCIE_REPLAY}{H}{RATE}))", "GPU {{gpu}}"), width=8),
        timeseries("NVLink errors / s", (f"sum by (gpu, counter) (rate({NVLINK}{H}{RATE}))",
                                         "GPU {{gpu}} {{counter}}"), width=24),
        row("Network and host memory"),
        timeseries("InfiniBand / RoCE port errors / s",
                   (f"sum by (device, port, counter) (rate({NET}{NET_ERRORS}{RATE}))",
                    "{{device}}/{{port}} {{counter}}")),
        timeseries("EDAC errors / s by memory controller",
                   (f"sum by (mc, type) (rate({EDAC}{H}{RATE}))", "mc{{mc}} {{type}}")),
    ]
    return dashboard(UID, TITLE, "One host: GPU ECC, remapped rows, PCIe, NVLink, network ports, EDAC, Xids.",
                     panels, templates=[host_variable(PRESENT)], annotations=[xid_annotation], tags=["host"])
