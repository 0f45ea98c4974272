"""One fault model (simulator/faultmodel.py) for every producer of simulated faults.

Each kind of the catalogue is produced by the fleet engine, by ``collect --simulate --inject`` and by
the test fixtures, and each producer's output is held to the same catalogue signature:
- the fixtures: here, every stageable kind; and through them the ML tests' fleet (tests/ml/synth.py);
- the fleet engine: here, on the shared every-mode run (tests/simulator/conftest.py), and with its
  kernel lines in test_evidence.py;
- inject: tests/collectors/test_inject.py, through the real collector, every injectable kind.
A second definition of what a fault looks like (a table or an if/elif chain over failure modes in
the simulator, the tests, the scripts or the benchmarks) fails test_no_second_fault_definition.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fleethealth.taxonomy import FAULT_LABELS, PRECURSORS
from simulator import faultmodel, faults, fixtures, inject
from simulator.faultmodel import CATALOGUE

ROOT = Path(__file__).resolve().parents[2]
STAGEABLE = sorted(m for m, k in CATALOGUE.items() if k.stageable)
# the engine's kinds with a precursor take its length (faults.inject); the rest are in faults.SIMPLE
ENGINE_WITH_PRECURSOR = {"gpu_dram_uce", "gpu_row_remap_failure", "host_dram_uce"}


def test_the_catalogue_is_the_vocabulary_and_every_producer_takes_it() -> None:
    assert set(CATALOGUE) == set(FAULT_LABELS)
    assert set(faults.SIMPLE) | ENGINE_WITH_PRECURSOR == set(CATALOGUE)
    assert not set(faults.SIMPLE) & ENGINE_WITH_PRECURSOR
    assert {m: k.duration_s for m, k in CATALOGUE.items()} == faults.DURATION
    assert {m: k.component for m, k in CATALOGUE.items()} == faults.KIND
    assert set(PRECURSORS) == ENGINE_WITH_PRECURSOR
    assert set(inject.FAULTS) == set(STAGEABLE) == set(CATALOGUE) - {"host_unreachable"}


def _index(mode: str) -> int:
    return 5 if CATALOGUE[mode].component == "dimm" else 3


@pytest.mark.parametrize("mode", STAGEABLE)
def test_fixtures_stage_every_kind_with_its_whole_signature(mode: str) -> None:
    kind = CATALOGUE[mode].component
    healthy = fixtures.sample()
    i = _index(mode)
    comp = faultmodel.component_name(kind, healthy, i)
    staged = fixtures.fault(healthy, mode, i)
    assert faultmodel.missing(mode, comp, healthy, [staged], optional=True) == []
    assert faultmodel.missing(mode, comp, None, [healthy]), "the healthy sample already shows it"
    other = faultmodel.component_name(kind, healthy, 2)
    assert faultmodel.missing(mode, other, healthy, [staged]), "leaked onto component 2"
    assert fixtures.fault(healthy, mode, i) == staged and healthy == fixtures.sample(), "not pure"


@pytest.mark.parametrize("mode", STAGEABLE)
def test_a_host_series_keeps_an_injected_fault(mode: str) -> None:
    series = fixtures.HostSeries()
    first = series.advance()
    series.inject(mode, _index(mode))
    staged, later = series.advance(), series.advance()
    comp = faultmodel.component_name(CATALOGUE[mode].component, first, _index(mode))
    assert faultmodel.missing(mode, comp, first, [staged], optional=True) == []
    # states and counters stay (a counter that fell back would read as a reset); Xids were one event
    assert all(w.startswith("no Xid") for w in faultmodel.missing(mode, comp, first, [later]))


def test_the_engine_leaves_every_kind_signature(every_mode_run) -> None:  # type: ignore[no-untyped-def]
    run, iv, seen, problems = every_mode_run, every_mode_run.spec.interval_s, set(), []
    for t in run.truth:
        samples, m = run.by_host[t["host"]], t["failure_mode"]
        before = [s for s in samples if s.ts < t["onset"]]
        win = [s for s in samples if t["onset"] <= s.ts < t["end"] + (0 if m == "host_unreachable" else iv)]
        why = faultmodel.missing(m, t["component"], before[-1] if before else None, win)
        if why:
            problems.append((t["id"], m, why))
        seen.add(m)
    assert not problems
    assert seen == set(CATALOGUE)


def test_the_ml_test_fleet_stages_the_catalogue() -> None:
    from tests.ml.synth import MODES, fleet

    samples, truth = fleet(3, hosts=len(MODES), duration_s=300.0, faults=len(MODES))
    assert len(truth) == len(MODES)
    for f in truth:
        mine = [s for s in samples if s.host == f.host]
        before = [s for s in mine if s.ts < f.start]
        win = [s for s in mine if f.start <= s.ts < (f.end or 1e12)]
        assert faultmodel.missing(f.failure_mode, f.component, before[-1], win, optional=True) == [], f


def test_stage_refuses_a_kind_with_no_sample_and_an_unknown_one() -> None:
    with pytest.raises(ValueError, match="host_unreachable"):
        fixtures.fault(fixtures.sample(), "host_unreachable")
    with pytest.raises(ValueError, match="unknown failure mode 'gpu_dram_uec'"):
        fixtures.fault(fixtures.sample(), "gpu_dram_uec")


# Where a table of failure modes is allowed, and why it is not a second fault definition.
ALLOWED = {
    "simulator/faultmodel.py": "the catalogue",
    "simulator/faults.py": "the fleet engine's dynamics per kind, registered against the catalogue (first test)",
    "simulator/rates.py": "how often each mode happens (Llama 3's table), not what it looks like",
    "tests/backtest/fixture_exporter.py": "dcgm-exporter metric text for the backtest, not the contract: "
                                          "the faults are DCGM fields, the importer's input",
    "tests/simulator/test_fault_model.py": "this test",
}


def _definitions(path: Path) -> list[str]:
    """Dict literals keyed by 3+ failure modes, and if/elif chains testing 3+ failure modes."""
    labels = set(FAULT_LABELS)
    text = path.read_text(encoding="utf-8")
    if sum(f'"{m}"' in text for m in labels) < 3:  # cheap: most files name fewer than 3 modes
        return []
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in labels}
            if len(keys) >= 3:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}: a table keyed by {sorted(keys)[:3]}...")
        elif isinstance(node, ast.FunctionDef):
            tested = {c.value for n in ast.walk(node) if isinstance(n, ast.If) for c in ast.walk(n.test)
                      if isinstance(c, ast.Constant) and c.value in labels}
            if len(tested) >= 3:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name} branches on {sorted(tested)[:3]}...")
    return out


def test_no_second_fault_definition() -> None:
    found = []
    for top in ("simulator", "tests", "scripts", "benchmarks"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if str(path.relative_to(ROOT)) not in ALLOWED:
                found += _definitions(path)
    assert not found, ("what a fault looks like is defined once, in simulator/faultmodel.py; stage it with "
                       "simulator.fixtures.fault / HostSeries.inject or check it with faultmodel.missing:\n"
                       + "\n".join(found))
    for rel in ALLOWED:
        assert (ROOT / rel).exists(), f"ALLOWED names {rel}, which is gone"
