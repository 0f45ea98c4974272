"""The fleet engine: every failure mode appears, and each fault leaves its catalogue signature
(simulator/faultmodel.py) and the engine's own kernel lines in the telemetry."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fleethealth.schema import GpuSample, Sample
from fleethealth.taxonomy import FAULT_LABELS
from simulator import faultmodel


def _gpu(s: Sample, uuid: str) -> GpuSample | None:
    return next((g for g in s.gpus if g.uuid == uuid), None)


def _gpu_by_pci(s: Sample, addr: str) -> GpuSample | None:
    bus = addr.split(":")[1].upper()
    return next((g for g in s.gpus if g.pci_bus_id.split(":")[1] == bus), None)


def _xids(win: list[Sample], uuid: str) -> set[int]:
    return {x.xid for s in win for g in s.gpus if g.uuid == uuid for x in g.xids}


def _lines(win: list[Sample]) -> list[str]:
    return [e.line for s in win for e in s.kernel_events]


def _ecc(s: Sample, uuid: str, field: str) -> int:
    g = _gpu(s, uuid)
    return getattr(g.ecc, field) if g and g.ecc else 0


def _rises(before: Sample | None, win: list[Sample], value: Callable[[Sample], int]) -> int:
    start = value(before) if before is not None else 0
    return max((value(s) for s in win), default=start) - start


def _port(s: Sample, comp: str):  # type: ignore[no-untyped-def]
    dev = comp.split("/")[0]
    return next(p for p in s.net_ports if p.device == dev)


def _dimm(s: Sample, label: str):  # type: ignore[no-untyped-def]
    return next(d for mc in s.edac for d in mc.dimms if d.label == label)


def check(t: dict, before: Sample | None, win: list[Sample], after: list[Sample]) -> str | None:
    """None when the evidence is there, else what is missing: the one fault model's signature
    (simulator/faultmodel.py) with the kernel lines the fleet engine writes, and the repair."""
    m, c = t["failure_mode"], t["component"]
    why = faultmodel.missing(m, c, before, win, klog=True)
    if why:
        return "; ".join(why)
    if m == "gpu_row_remap_pending" and after and any((g := _gpu(s, c)) and g.remapped_rows.pending for s in after[:1]):
        return "pending did not clear after the reset"
    return None


def test_every_mode_has_its_evidence(every_mode_run) -> None:  # type: ignore[no-untyped-def]
    run = every_mode_run
    iv = run.spec.interval_s
    seen = set()
    problems = []
    for t in run.truth:
        samples = run.by_host[t["host"]]
        before = [s for s in samples if s.ts < t["onset"]]
        win = [s for s in samples if t["onset"] <= s.ts < t["end"] + (0 if t["failure_mode"] == "host_unreachable" else iv)]
        after = [s for s in samples if s.ts >= t["end"] + iv]
        if not win and t["failure_mode"] != "host_unreachable":
            problems.append((t["id"], t["failure_mode"], "no samples in the window"))
            continue
        why = check(t, before[-1] if before else None, win, after)
        if why:
            problems.append((t["id"], t["failure_mode"], why))
        seen.add(t["failure_mode"])
    assert not problems, problems
    assert seen == set(FAULT_LABELS)


def test_co_occurrences(every_mode_run) -> None:  # type: ignore[no-untyped-def]
    """Xid 48 with Xid 63 or 64; Xid 79 with AER uncorrectable on the same GPU in some faults."""
    lines = [e.line for s in every_mode_run.samples for e in s.kernel_events]
    assert any(": 63, " in ln for ln in lines) and any(": 48, " in ln for ln in lines)
    aer79 = [t for t in every_mode_run.truth if t["failure_mode"] == "gpu_fell_off_bus" and "pcie_fatal" in t["secondary"]]
    assert aer79 or len([t for t in every_mode_run.truth if t["failure_mode"] == "gpu_fell_off_bus"]) < 3


def test_benign_noise_is_not_in_the_truth(every_mode_run) -> None:  # type: ignore[no-untyped-def]
    """Reboots and maintenance (new boot_id, quiet hosts) happen outside any labelled fault."""
    import json

    meta = json.loads(every_mode_run.out.with_name("every.meta.json").read_text())
    assert set(meta["benign_events"]) >= {"reboot", "maintenance", "driver_reload", "single_link_flap"}


@pytest.mark.parametrize("scenario", ["flapping-cable", "sbe-storm-no-uce"])
def test_hard_case_scenarios(tmp_path, scenario: str) -> None:  # type: ignore[no-untyped-def]
    import json

    from fleethealth.bus import read_values
    from fleethealth.recordings import truth_path
    from fleethealth.schema import decode_sample
    from simulator.engine import simulate
    from simulator.plan import RunSpec

    out = tmp_path / "s.jsonl"
    simulate(RunSpec(hosts=8, duration_s=4 * 3600, interval_s=120, seed=2, fault_rate=1, scenario=scenario), out)
    truth = [json.loads(x) for x in truth_path(out).read_text().splitlines()]
    samples = [decode_sample(b) for b in read_values(out)]
    if scenario == "flapping-cable":
        cables = [t for t in truth if t["failure_mode"] == "net_link_bad_cable"]
        assert len(cables) >= 2
        for t in cables:
            downs = [_port(s, t["component"]).counters["link_downed"] for s in samples if s.host == t["host"]
                     and s.ts < t["end"]]
            assert max(downs) - downs[0] >= 2, "flapped more than once"
    else:
        storms = [t for t in truth if t["failure_mode"] == "gpu_ecc_sbe_storm"]
        assert len(storms) >= 2
        assert not [t for t in truth if t["failure_mode"] in ("gpu_dram_uce", "gpu_row_remap_failure")
                    and (t["host"], t["component"]) in {(s["host"], s["component"]) for s in storms}]
        for t in storms:
            ue = [_ecc(s, t["component"], "dram_uncorrected_volatile") for s in samples if s.host == t["host"]]
            assert max(ue) == 0


def test_slow_drift_creeps_and_ramps(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """slow-drift: a creeping cable's error rate rises through its fault and never flaps; every HBM
    UCE comes after a corrected-error ramp."""
    import json

    from fleethealth.bus import read_values
    from fleethealth.recordings import truth_path
    from fleethealth.schema import decode_sample
    from simulator.engine import simulate
    from simulator.plan import RunSpec

    out = tmp_path / "d.jsonl"
    simulate(RunSpec(hosts=12, duration_s=10 * 3600, interval_s=120, seed=3, scenario="slow-drift"), out)
    truth = [json.loads(x) for x in truth_path(out).read_text().splitlines()]
    samples = [decode_sample(b) for b in read_values(out)]
    cables = [t for t in truth if t["failure_mode"] == "net_link_bad_cable"]
    uces = [t for t in truth if t["failure_mode"] == "gpu_dram_uce"]
    assert len(cables) >= 2 and len(uces) >= 2
    for t in cables:
        win = [s for s in samples if s.host == t["host"] and t["onset"] <= s.ts < t["end"]]
        sym = [_port(s, t["component"]).counters["symbol_error"] for s in win]
        half = len(sym) // 2
        assert sym[-1] - sym[half] > sym[half] - sym[0], "the error rate does not creep up"
        assert len({_port(s, t["component"]).counters["link_downed"] for s in win}) == 1, "a creeping cable flapped"
    for t in uces:
        assert "correctable-ECC ramp" in t["notes"], t["notes"]
