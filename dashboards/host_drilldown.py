"""Host drill-down: one host's GPUs, PCIe links, NVLinks, network ports and DIMMs, with Xid events
as annotations. Templated by ``$host``; reads the collector exporter's metrics
(``collectors/metrics.tsv``; every series carries a ``host`` label).
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from dashboards.panels import DATASOURCE, dashboard, host_variable, row, table, timeseries

UID = "fleethealth-host-drilldown"
TITLE = "fleethealth / Host drill-down"

# Collector metric names (must match collectors/metrics.tsv; tests/dashboards checks).
ECC = "fleethealth_gpu_ecc_errors_total"
REMAPPED = "fleethealth_gpu_remapped_rows"
PCIE_GEN = "fleethealth_gpu_pcie_link_gen"
PCIE_WIDTH = "fleethealth_gpu_pcie_link_width"
PCIE_REPLAY = "fleethealth_gpu_pcie_replay_total"
NVLINK = "fleethealth_gpu_nvlink_errors_total"
NET = "fleethealth_net_port_counter_total"
EDAC = "fleethealth_edac_errors_total"
XID = "fleethealth_gpu_xid_events_total"  # per GPU, starts at 0
XID_BY_CODE = "fleethealth_gpu_xid_events_by_code_total"
HOST_VAR_METRIC = "fleethealth_gpu_info"

H = '{host="$host"}'
NET_ERRORS = '{host="$host", counter=~".*(error|downed|discard|recovery).*"}'
RATE = "[$__rate_interval]"


CORRECTED = '{host="$host", type="corrected"}'
UNCORRECTED = '{host="$host", type="uncorrected"}'


def build() -> Dashboard:
    xid_annotation = {
        "name": "Xid events",
        "datasource": DATASOURCE,
        "enable": True,
        "iconColor": "red",
        "expr": f"sum by (gpu) (increase({XID}{H}{RATE})) > 0",
        "step": "15s",
        "titleFormat": "Xid on GPU {{gpu}}",
        "textFormat": "GPU {{gpu}}: Xid event (codes in the Xid table)",
        "tagKeys": "gpu",
        "useValueForTime": False,
    }
    panels = [
        row("GPU memory"),
        timeseries("ECC corrected errors / s by GPU and location",
                   (f'sum by (gpu, location) (rate({ECC}{CORRECTED}{RATE}))',
                    "GPU {{gpu}} {{location}}")),
        timeseries("ECC uncorrected errors by GPU and location",
                   (f'sum by (gpu, location) ({ECC}{UNCORRECTED})',
                    "GPU {{gpu}} {{location}}")),
        timeseries("Remapped rows", (f"sum by (gpu, kind) ({REMAPPED}{H})", "GPU {{gpu}} {{kind}}"), width=12),
        table("Xid events by GPU", (f"sum by (gpu, xid) ({XID_BY_CODE}{H})", ""), width=12),
        row("PCIe and NVLink"),
        timeseries("PCIe link generation (current vs max)", (f"max by (gpu, which) ({PCIE_GEN}{H})",
                                                             "GPU {{gpu}} {{which}}"), width=8),
        timeseries("PCIe link width (current vs max)", (f"max by (gpu, which) ({PCIE_WIDTH}{H})",
                                                        "GPU {{gpu}} {{which}}"), width=8),
        timeseries("PCIe replays / s", (f"sum by (gpu) (rate({PCIE_REPLAY}{H}{RATE}))", "GPU {{gpu}}"),
                   width=8),
        timeseries("NVLink errors / s", (f"sum by (gpu, counter) (rate({NVLINK}{H}{RATE}))",
                                         "GPU {{gpu}} {{counter}}"), width=24),
        row("Network and host memory"),
        timeseries("InfiniBand / RoCE port errors / s",
                   (f"sum by (device, port, counter) (rate({NET}{NET_ERRORS}{RATE}))", "{{device}}/{{port}} {{counter}}")),
        timeseries("EDAC errors / s by memory controller",
                   (f"sum by (mc, type) (rate({EDAC}{H}{RATE}))", "mc{{mc}} {{type}}")),
    ]
    return dashboard(UID, TITLE, "One host: GPU ECC, remapped rows, PCIe, NVLink, network ports, EDAC, Xids.",
                     panels, templates=[host_variable(HOST_VAR_METRIC)], annotations=[xid_annotation],
                     tags=["host"])
