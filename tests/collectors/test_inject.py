"""`fleethealth collect --simulate --inject MODE[@N]`: every injectable label leaves its whole
signature (the one fault model's, simulator/faultmodel.py) in the sample the collector produces
(through the real daemon, simulated NVML and sysfs tree), and only on the component named."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetcli.cli import main
from fleethealth.bus import read_values
from fleethealth.errors import UserError
from fleethealth.schema import Sample, decode_sample
from fleethealth.taxonomy import MODES
from simulator import faultmodel, inject


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


def shows(mode: str, s: Sample, i: int, before: Sample | None = None) -> bool:
    """The sample carries ``mode``'s whole signature (the one fault model's, severe marks included)
    on component ``i``."""
    comp = faultmodel.component_name(faultmodel.CATALOGUE[mode].component, s, i)
    return not faultmodel.missing(mode, comp, before, [s], optional=True)


def test_every_vocabulary_mode_but_healthy_and_unreachable_is_injectable() -> None:
    assert set(inject.FAULTS) == {str(m) for m in MODES} - {"healthy", "host_unreachable"}


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Sample:
    return collect(tmp_path_factory.mktemp("healthy"))


@pytest.mark.parametrize("mode", sorted(inject.FAULTS))
def test_injected_mode_shows_in_the_sample(mode: str, tmp_path: Path, healthy: Sample) -> None:
    idx = 3 if not mode.startswith(("host_",)) else 5  # DIMM 5: mc1, dimm1
    s = collect(tmp_path, "--inject", f"{mode}@{idx}")
    comp = faultmodel.component_name(faultmodel.CATALOGUE[mode].component, healthy, idx)  # a lost GPU names none
    assert not faultmodel.missing(mode, comp, healthy, [s], optional=True), f"{mode}: not all of its signature"
    assert not shows(mode, healthy, idx), f"{mode}: the healthy host already shows it"
    assert not shows(mode, s, 2, before=healthy), f"{mode}: leaked onto component 2"


def test_env_list_and_flags_combine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = collect(tmp_path, "--inject", "gpu_thermal@1", env={"FLEETHEALTH_INJECT": "gpu_hw_error@5,net_link_down@2"},
                monkeypatch=monkeypatch)
    assert shows("gpu_thermal", s, 1) and shows("gpu_hw_error", s, 5) and shows("net_link_down", s, 2)


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
