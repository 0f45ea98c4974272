"""A small local exporter for the backtest tests: dcgm-exporter and node_exporter text for a few
hosts, in the shape of the shared corpus's captures (HELP/TYPE lines, the label set gpu, UUID,
pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION), with faults that appear part-way.

Paths: ``/<host>/dcgm`` and ``/<host>/node``. Values are a pure function of the seconds since
``t0`` (:func:`dcgm_text`, :func:`node_text`), so Prometheus, the collector and a test all see the
same fleet. The fault times are :data:`FAULTS` (seconds after t0).
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOSTS = ("gpu-node-101", "gpu-node-102")
FAULTY = "gpu-node-101"
N_GPUS = 4
MODEL = "NVIDIA H100 80GB HBM3"
DRIVER = "550.54.15"
# failure -> (seconds after t0, what changes)
FAULTS = {
    "gpu_dram_uce": (8.0, "GPU 2: DCGM_FI_DEV_ECC_DBE_VOL_TOTAL 0 -> 1"),
    "gpu_row_remap_pending": (12.0, "GPU 1: DCGM_FI_DEV_ROW_REMAP_PENDING 0 -> 1"),
    "xid": (16.0, "GPU 3: DCGM_FI_DEV_XID_ERRORS 0 -> 79 (then held at 79)"),
    "net_link_bad_cable": (20.0, "mlx5_1 port 1: node_infiniband_symbol_error_total +4 per second"),
}


def uuid(host: str, i: int) -> str:
    n = int(host.rsplit("-", 1)[1])
    return f"GPU-{n:08x}-1111-2222-3333-{i:012x}"


def pci(i: int) -> str:
    return f"00000000:{0x18 + 0x11 * i:02X}:00.0"


def _at(el: float, fault: str) -> bool:
    return el >= FAULTS[fault][0]


def dcgm_text(host: str, el: float) -> str:
    """dcgm-exporter's /metrics for ``host`` at ``el`` seconds after t0 (a site that enabled the
    ECC and remap-pending fields its default CSV leaves out)."""
    faulty = host == FAULTY
    fams: list[tuple[str, str, str, list[float]]] = []

    def fam(name: str, typ: str, help_: str, values: list[float]) -> None:
        fams.append((name, typ, help_, values))

    fam("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", [40.0 + i for i in range(N_GPUS)])
    fam("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", [350.5 + 10 * i for i in range(N_GPUS)])
    fam("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", [97.0] * N_GPUS)
    fam("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", [1024.0] * N_GPUS)
    fam("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", [0.0] * N_GPUS)
    fam("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.",
        [79.0 if faulty and i == 3 and _at(el, "xid") else 0.0 for i in range(N_GPUS)])
    fam("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.", [0.0] * N_GPUS)
    fam("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.",
        [1.0 if faulty and i == 2 and _at(el, "gpu_dram_uce") else 0.0 for i in range(N_GPUS)])
    fam("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors",
        [0.0] * N_GPUS)
    fam("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors",
        [0.0] * N_GPUS)
    fam("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", [0.0] * N_GPUS)
    fam("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending",
        [1.0 if faulty and i == 1 and _at(el, "gpu_row_remap_pending") else 0.0 for i in range(N_GPUS)])
    out = []
    for name, typ, help_, values in fams:
        out += [f"# HELP {name} {help_}", f"# TYPE {name} {typ}"]
        for i, v in enumerate(values):
            labels = (f'gpu="{i}",UUID="{uuid(host, i)}",pci_bus_id="{pci(i)}",device="nvidia{i}",'
                      f'modelName="{MODEL}",Hostname="{host}",DCGM_FI_DRIVER_VERSION="{DRIVER}"')
            out.append(f"{name}{{{labels}}} {v:g}")
    return "\n".join(out) + "\n"


def node_text(host: str, el: float) -> str:
    faulty = host == FAULTY
    sym = int(4 * (el - FAULTS["net_link_bad_cable"][0])) if faulty and _at(el, "net_link_bad_cable") else 0
    out = ["# HELP node_boot_time_seconds Node boot time, in unixtime.", "# TYPE node_boot_time_seconds gauge",
           "node_boot_time_seconds 1.764547e+09"]
    for name, typ, vals in (
            ("node_infiniband_state_id", "gauge", {"mlx5_0": 4, "mlx5_1": 4}),
            ("node_infiniband_physical_state_id", "gauge", {"mlx5_0": 5, "mlx5_1": 5}),
            ("node_infiniband_rate_bytes_per_second", "gauge", {"mlx5_0": 5e10, "mlx5_1": 5e10}),
            ("node_infiniband_symbol_error_total", "counter", {"mlx5_0": 0, "mlx5_1": sym}),
            ("node_infiniband_link_downed_total", "counter", {"mlx5_0": 0, "mlx5_1": 0}),
            ("node_infiniband_link_error_recovery_total", "counter", {"mlx5_0": 0, "mlx5_1": 0}),
            ("node_infiniband_port_errors_received_total", "counter", {"mlx5_0": 0, "mlx5_1": 0})):
        out += [f"# HELP {name} x", f"# TYPE {name} {typ}"]
        out += [f'{name}{{device="{d}",port="1"}} {v:g}' for d, v in vals.items()]
    out += ["# TYPE node_edac_correctable_errors_total counter", 'node_edac_correctable_errors_total{controller="0"} 0',
            "# TYPE node_edac_uncorrectable_errors_total counter",
            'node_edac_uncorrectable_errors_total{controller="0"} 0',
            "# TYPE node_edac_csrow_correctable_errors_total counter",
            'node_edac_csrow_correctable_errors_total{controller="0",csrow="0"} 0',
            'node_edac_csrow_correctable_errors_total{controller="0",csrow="unknown"} 0',
            "# TYPE node_network_carrier gauge", 'node_network_carrier{device="eno1"} 1']
    return "\n".join(out) + "\n"


class FixtureExporter:
    """Serves the fixture fleet on 127.0.0.1:<port> in a thread; ``t0`` is when the clock starts."""

    def __init__(self, t0: float | None = None) -> None:
        self.t0 = time.time() if t0 is None else t0
        self.hits = 0
        self.agent_hits: dict[str, int] = {}  # host -> scrapes by anything but Prometheus (the collectors)
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                parts = self.path.strip("/").split("/")
                el = time.time() - exporter.t0
                if len(parts) == 2 and parts[0] in HOSTS and parts[1] in ("dcgm", "node"):
                    body = (dcgm_text if parts[1] == "dcgm" else node_text)(parts[0], el).encode()
                    exporter.hits += 1
                    if not self.headers.get("User-Agent", "").startswith("Prometheus"):
                        exporter.agent_hits[parts[0]] = exporter.agent_hits.get(parts[0], 0) + 1
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_error(404)

            def log_message(self, *_a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, host: str, kind: str) -> str:
        return f"http://127.0.0.1:{self.port}/{host}/{kind}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
