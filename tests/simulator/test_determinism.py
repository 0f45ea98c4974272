"""Same seed -> byte-identical files; a different seed -> different; every line is the contract."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from fleethealth.errors import UserError
from fleethealth.recordings import side_path, truth_path
from fleethealth.schema import decode_sample, encode
from simulator.engine import simulate
from simulator.plan import RunSpec, parse_duration


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _spec(seed: int) -> RunSpec:
    return RunSpec(hosts=6, duration_s=1800, interval_s=60, seed=seed, fault_rate=3000)


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz"])
def test_same_seed_is_byte_identical(tmp_path: Path, name: str) -> None:
    one, two = tmp_path / "1" / name, tmp_path / "2" / name
    simulate(_spec(7), one)
    simulate(_spec(7), two)
    assert _digest(one) == _digest(two)
    assert _digest(truth_path(one)) == _digest(truth_path(two))
    assert _digest(side_path(one, "meta.json")) == _digest(side_path(two, "meta.json"))
    assert one.stat().st_size > 10_000


def test_gzip_holds_the_same_lines_as_plain(tmp_path: Path) -> None:
    import gzip

    simulate(_spec(7), tmp_path / "p.jsonl")
    simulate(_spec(7), tmp_path / "z.jsonl.gz")
    assert gzip.decompress((tmp_path / "z.jsonl.gz").read_bytes()) == (tmp_path / "p.jsonl").read_bytes()


def test_different_seed_differs(tmp_path: Path) -> None:
    simulate(_spec(7), tmp_path / "a.jsonl")
    simulate(_spec(8), tmp_path / "b.jsonl")
    assert _digest(tmp_path / "a.jsonl") != _digest(tmp_path / "b.jsonl")


def test_every_line_is_the_contract_encoding(every_mode_run) -> None:  # type: ignore[no-untyped-def]
    """The cached-fragment writer must produce exactly what fleethealth.schema.encode produces."""
    for raw in every_mode_run.raw:
        assert encode(decode_sample(raw)) == raw


def test_sorted_by_ts_then_host_and_seq_increases(every_mode_run) -> None:  # type: ignore[no-untyped-def]
    keys = [(s.ts, s.host) for s in every_mode_run.samples]
    assert keys == sorted(keys)
    for samples in every_mode_run.by_host.values():
        seqs = [s.seq for s in samples]
        assert all(b > a for a, b in zip(seqs, seqs[1:], strict=False))
    assert every_mode_run.result.samples == len(every_mode_run.samples)


def test_fleet_shape(every_mode_run) -> None:  # type: ignore[no-untyped-def]
    s = every_mode_run.samples[0]
    assert s.expected_gpus == 8 and len(s.net_ports) == 8 and len(s.edac) == 8
    assert [p.device for p in s.net_ports] == [f"mlx5_{i}" for i in range(8)]
    assert all(p.rate_gbps == 400.0 for p in s.net_ports)
    g = next(x for x in s.gpus if x.present)
    assert g.nvlink is not None and len(g.nvlink.crc_flit) == 18
    assert {x.rack for x in every_mode_run.samples} == {"rack-00"}
    assert len(every_mode_run.by_host) == 24


def test_healthy_noise_is_present(every_mode_run) -> None:  # type: ignore[no-untyped-def]
    """Idle GPUs train down to PCIe gen1 and report GpuIdle; CE counts differ between GPUs."""
    gens = {g.pcie.gen_current for s in every_mode_run.samples for g in s.gpus if g.pcie}
    assert gens == {1, 5}
    idle = [g for s in every_mode_run.samples for g in s.gpus if g.utilization_pct == 0.0]
    assert idle and all(g.clocks_event_reasons & 0x1 for g in idle)
    ce = {g.ecc.dram_corrected_volatile for s in every_mode_run.samples[:200] for g in s.gpus if g.ecc}
    assert len(ce) > 3


@pytest.mark.parametrize(("text", "seconds"), [("1d", 86400), ("6h", 21600), ("30m", 1800), ("45", 45)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_parse_duration_rejects_garbage() -> None:
    with pytest.raises(UserError, match="cannot read duration"):
        parse_duration("soon")


def test_bad_arguments_are_user_errors() -> None:
    with pytest.raises(UserError, match="scenario"):
        RunSpec(hosts=2, duration_s=600, interval_s=60, seed=1, scenario="nope").check()
    with pytest.raises(UserError, match="hosts"):
        RunSpec(hosts=0, duration_s=600, interval_s=60, seed=1).check()


def test_cli_simulate_and_bad_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fleetcli.cli import main

    out = tmp_path / "x.jsonl.gz"
    assert main(["simulate", "--hosts", "2", "--duration", "10m", "--interval", "60", "--seed", "1",
                 "--out", str(out), "--quiet"]) == 0
    assert out.exists() and truth_path(out).exists()
    assert "wrote" in capsys.readouterr().out
    assert main(["simulate", "--hosts", "2", "--duration", "10m", "--out", str(tmp_path / "x.csv")]) == 2
    assert "must end in .jsonl" in capsys.readouterr().err
