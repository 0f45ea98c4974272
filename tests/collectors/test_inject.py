"""`fleethealth collect --simulate --inject MODE[@N]`: every injectable label leaves its evidence in
the sample the collector produces (through the real daemon, simulated NVML and sysfs tree)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetcli.cli import main
from fleethealth.bus import read_values
from fleethealth.errors import UserError
from fleethealth.schema import Sample, decode_sample
from fleethealth.taxonomy import MODES
from simulator import inject


def collect(tmp_path: Path, *extra: str, env: dict[str, str] | None = None,
            monkeypatch: pytest.MonkeyPatch | None = None) -> Sample:
    out = tmp_path / "out.jsonl"
    if env and monkeypatch:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
    rc = main(["--log-level", "warning", "collect", "--simulate", "--once", "--exporter-port", "0", "--host", "sim-1",
               "--sink", f"jsonl:{out}", "--state-dir", str(tmp_path / "state"), *extra])
    assert rc == 0
    values = list(read_values(out))
    assert len(values) == 1
    return decode_sample(values[0])


def xids(s: Sample, gpu: int) -> set[int]:
    return {x.xid for x in s.gpus[gpu].xids}


def aer(s: Sample, gpu: int) -> Any:
    addr = s.gpus[gpu].pci_bus_id.lower()[-12:]  # 00000000:2a:00.0 (NVML) or 0000:2a:00.0 -> sysfs form
    return next(d for d in s.aer if d.pci_addr.lower() == addr)


def port(s: Sample, n: int) -> Any:
    return next(p for p in s.net_ports if p.device == f"mlx5_{n}")


# label -> check(sample, index) on the injected GPU / port
EVIDENCE = {
    "gpu_fell_off_bus": lambda s, i: s.gpus[i].nvml_error == "GPU_IS_LOST" or 79 in xids(s, i),
    "gpu_dram_uce": lambda s, i: (s.gpus[i].ecc.dram_uncorrected_volatile >= 1 and s.gpus[i].remapped_rows.pending
                                  and 94 in xids(s, i)),
    "gpu_sram_uce": lambda s, i: s.gpus[i].ecc.sram_uncorrected_volatile >= 1 and s.gpus[i].ecc.sram_threshold_exceeded,
    "gpu_ecc_sbe_storm": lambda s, i: s.gpus[i].ecc.dram_corrected_volatile >= 5000 and 92 in xids(s, i),
    "gpu_row_remap_pending": lambda s, i: s.gpus[i].remapped_rows.pending,
    "gpu_row_remap_failure": lambda s, i: s.gpus[i].remapped_rows.failure and 64 in xids(s, i),
    "gpu_nvlink_error": lambda s, i: s.gpus[i].nvlink.crc_flit[0] >= 500 and s.gpus[i].nvlink.recovery[0] >= 3,
    "gpu_thermal": lambda s, i: s.gpus[i].temperature_c >= 90 and s.gpus[i].clocks_event_reasons & 0x40,
    "gpu_hw_error": lambda s, i: 62 in xids(s, i),
    "gpu_gsp_error": lambda s, i: 119 in xids(s, i),
    "app_error": lambda s, i: 13 in xids(s, i),
    "pcie_link_degraded": lambda s, i: (s.gpus[i].pcie.gen_current == 1 and s.gpus[i].pcie.width_current == 8
                                        and aer(s, i).link_width_current == 8),
    "pcie_fatal": lambda s, i: sum(aer(s, i).fatal.values()) > 0,
    "host_dram_uce": lambda s, i: s.edac[0].ue_count == 1 and s.edac[0].dimms[0].ue == 1,
    "host_dram_ce_storm": lambda s, i: s.edac[0].ce_count == 5000,
    "net_link_down": lambda s, i: port(s, i).state == "DOWN" and port(s, i).phys_state == "Disabled",
    "net_link_bad_cable": lambda s, i: port(s, i).counters["symbol_error"] >= 5000,
}


def test_every_vocabulary_mode_but_healthy_and_unreachable_is_injectable() -> None:
    assert set(inject.FAULTS) == {str(m) for m in MODES} - {"healthy", "host_unreachable"}
    assert set(EVIDENCE) == set(inject.FAULTS)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Sample:
    return collect(tmp_path_factory.mktemp("healthy"))


@pytest.mark.parametrize("mode", sorted(inject.FAULTS))
def test_injected_mode_shows_in_the_sample(mode: str, tmp_path: Path, healthy: Sample) -> None:
    idx = 3 if not mode.startswith(("host_",)) else 0
    s = collect(tmp_path, "--inject", f"{mode}@{idx}")
    assert EVIDENCE[mode](s, idx), f"{mode}: no evidence in the sample"
    assert not EVIDENCE[mode](healthy, idx), f"{mode}: the healthy host already shows it"
    if not mode.startswith(("host_", "net_")):
        assert not EVIDENCE[mode](s, 2), f"{mode}: leaked onto GPU 2"


def test_env_list_and_flags_combine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = collect(tmp_path, "--inject", "gpu_thermal@1", env={"FLEETHEALTH_INJECT": "gpu_hw_error@5,net_link_down@2"},
                monkeypatch=monkeypatch)
    assert EVIDENCE["gpu_thermal"](s, 1) and EVIDENCE["gpu_hw_error"](s, 5) and EVIDENCE["net_link_down"](s, 2)


def test_unknown_label_lists_supported_ones(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(["collect", "--simulate", "--once", "--exporter-port", "0", "--sink", f"jsonl:{tmp_path}/o.jsonl",
               "--state-dir", str(tmp_path), "--inject", "gpu_dram_uec@1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "unknown failure mode 'gpu_dram_uec'" in err and "gpu_dram_uce" in err and "net_link_bad_cable" in err
    assert not (tmp_path / "o.jsonl").exists() or not (tmp_path / "o.jsonl").read_text()


@pytest.mark.parametrize(("spec", "why"), [("gpu_thermal@8", "out of range 0..7"), ("gpu_thermal@x", "not a GPU"),
                                           ("net_link_down@9", "out of range 0..7"), ("healthy", "unknown")])
def test_bad_specs_are_user_errors(spec: str, why: str) -> None:
    with pytest.raises(UserError, match=why):
        inject.parse([spec], n_gpus=8)


def test_inject_without_simulate_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(["collect", "--once", "--exporter-port", "0", "--sink", "stdout", "--state-dir", str(tmp_path),
               "--inject", "gpu_thermal"])
    assert rc == 2 and "--inject needs --simulate" in capsys.readouterr().err
