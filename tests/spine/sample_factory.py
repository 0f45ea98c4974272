"""Build realistic contract samples for spine tests."""

from __future__ import annotations

from fleethealth.schema import (
    EccCounters,
    GpuSample,
    NetPort,
    NvlinkCounters,
    PcieLink,
    RemappedRows,
    Sample,
)


def gpu(i: int) -> GpuSample:
    return GpuSample(
        index=i, uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
        name="NVIDIA H100 80GB HBM3",
        ecc=EccCounters(dram_corrected_volatile=i, dram_uncorrected_volatile=0, sram_corrected_volatile=0,
                        sram_uncorrected_volatile=0, dram_corrected_aggregate=10 + i, dram_uncorrected_aggregate=0),
        remapped_rows=RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False),
        pcie=PcieLink(gen_current=5, gen_max=5, width_current=16, width_max=16, replay_counter=9),
        nvlink=NvlinkCounters(active=[True] * 18, crc_flit=[0] * 18, crc_data=[0] * 18, replay=[0] * 18,
                              recovery=[0] * 18),
        temperature_c=41.0 + i, power_w=120.5, utilization_pct=0.0, clocks_event_reasons=1,
    )


def sample(host: str = "gpu-node-001", seq: int = 1, ts: float = 1_764_000_000.0, gpus: int = 8) -> Sample:
    return Sample(
        host=host, cluster="c1", rack="r01", ts=ts, seq=seq, collector_version="0.1.0", boot_id="b-1",
        driver_version="550.54.15", expected_gpus=gpus,
        gpus=[gpu(i) for i in range(gpus)],
        net_ports=[NetPort(device=f"mlx5_{i}", port=1, state="ACTIVE", phys_state="LinkUp", rate_gbps=400.0,
                           counters={"symbol_error": 0, "link_error_recovery": 0, "link_downed": 0,
                                     "port_rcv_errors": 0}) for i in range(8)],
    )
