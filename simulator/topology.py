"""The simulated fleet's fixed shape: hosts, racks, GPUs, InfiniBand ports, DIMMs.

An HGX H100-like host: 8 GPUs (18 NVLinks each) behind PCIe switches, 8 ConnectX-7 InfiniBand
ports (``mlx5_0`` .. ``mlx5_7``, 400 Gb/s NDR) and 16 DIMMs on 8 EDAC memory controllers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GPUS_PER_HOST = 8
NVLINKS_PER_GPU = 18
PORTS_PER_HOST = 8
MCS_PER_HOST = 8
DIMMS_PER_MC = 2
HOSTS_PER_RACK = 32
GPU_NAME = "NVIDIA H100 80GB HBM3"
GPU_PCI_ID = "10de:2330"
NDR_GBPS = 400.0
DRIVER_VERSION = "550.90.07"
UPDATED_DRIVER_VERSION = "550.127.08"
COLLECTOR_VERSION = "fleetsim-0.1.0"
# PCI buses of the 8 GPUs and 8 HCAs on a DGX/HGX H100 board.
GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
HCA_BUSES = (0x1A, 0x3C, 0x4D, 0x5E, 0x9C, 0xBC, 0xCC, 0xDC)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    index: int
    bus: int

    @property
    def nvml_bus_id(self) -> str:  # NVML's 8-hex-digit domain form
        return f"00000000:{self.bus:02X}:00.0"

    @property
    def pci_addr(self) -> str:  # sysfs / AER form
        return f"0000:{self.bus:02x}:00.0"

    @property
    def xid_pci(self) -> str:  # the form NVRM prints in Xid lines
        return f"0000:{self.bus:02x}:00"

    @property
    def upstream_port(self) -> str:  # the PCIe switch downstream port above the GPU
        return f"0000:{self.bus - 1:02x}:00.0"


@dataclass(frozen=True, slots=True)
class HostSpec:
    index: int
    name: str
    cluster: str
    rack: str
    gpus: tuple[GpuSpec, ...]
    ports: tuple[str, ...]  # "mlx5_0" ...
    dimms: tuple[tuple[int, str], ...]  # (mc, label)

    def port_component(self, p: int) -> str:
        return f"{self.ports[p]}/1"


def host_name(i: int, n: int) -> str:
    width = max(3, len(str(n)))
    return f"gpu-node-{i + 1:0{width}d}"


def dimm_labels() -> tuple[tuple[int, str], ...]:
    out = []
    for mc in range(MCS_PER_HOST):
        sock, imc = divmod(mc, MCS_PER_HOST // 2)
        for ch in range(DIMMS_PER_MC):
            out.append((mc, f"CPU_SrcID#{sock}_MC#{imc}_Chan#{ch}_DIMM#0"))
    return tuple(out)


def build_fleet(hosts: int, cluster: str = "sim") -> list[HostSpec]:
    gpus = tuple(GpuSpec(i, b) for i, b in enumerate(GPU_BUSES))
    ports = tuple(f"mlx5_{i}" for i in range(PORTS_PER_HOST))
    dimms = dimm_labels()
    return [
        HostSpec(i, host_name(i, hosts), cluster, f"rack-{i // HOSTS_PER_RACK:02d}", gpus, ports, dimms)
        for i in range(hosts)
    ]


def make_uuid(rng: np.random.Generator) -> str:
    h = rng.bytes(16).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def make_boot_id(rng: np.random.Generator) -> str:
    h = rng.bytes(16).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
