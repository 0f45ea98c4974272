"""The template fast path writes exactly the bytes of the general path (HostState.render -> encode)."""

from __future__ import annotations

from fleethealth.schema import decode_sample, encode
from simulator import fastpath
from simulator.engine import Simulation
from simulator.plan import RunSpec


def _blocks(spec: RunSpec, fast: bool) -> tuple[bytes, object]:
    out: list[bytes] = []
    res = Simulation(spec).run(emit_block=out.append, fast=fast)
    return b"".join(out), res


def test_fast_and_general_paths_agree_byte_for_byte() -> None:
    # many faults of every mode: reboots, lost GPUs, Xids, thermal, AER, EDAC, flaps all cross the fast path
    spec = RunSpec(hosts=16, duration_s=4 * 3600, interval_s=60, seed=21, fault_rate=60, min_per_mode=1)
    fast, rf = _blocks(spec, True)
    slow, rs = _blocks(spec, False)
    assert 0 < rf.general_path_samples < rf.samples // 4  # type: ignore[attr-defined]
    assert rs.general_path_samples == rs.samples  # type: ignore[attr-defined]
    rf.general_path_samples = rs.general_path_samples  # type: ignore[attr-defined]
    assert rf == rs
    assert fast == slow
    lines = fast.split(b"\n")
    assert lines[-1] == b"" and len(lines) - 1 == rf.samples  # type: ignore[attr-defined]
    for raw in lines[:-1]:
        assert encode(decode_sample(raw)) == raw


def test_per_line_emit_matches_blocks() -> None:
    spec = RunSpec(hosts=8, duration_s=1800, interval_s=30, seed=3, fault_rate=500)
    block, _ = _blocks(spec, True)
    lines: list[bytes] = []
    Simulation(spec).run(lines.append)
    assert b"".join(x + b"\n" for x in lines) == block


def test_tables_format_like_repr() -> None:
    tab = fastpath.Tables()
    for k in (0, 1, 10, 660, 4205, 5575, 6899, 19_999):
        assert tab.power[k].startswith(repr(k / 10).encode() + b",")
    for ms in (0, 1, 10, 100, 120, 999):
        ts = round(1_735_689_612 + ms / 1000, 3)
        assert b"1735689612" + tab.frac[ms] == repr(ts).encode() + b',"seq":'
    assert tab.seqs(5000)[4321] == b"4321"
