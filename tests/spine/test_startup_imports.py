"""The commands people run by hand start without the heavy libraries (issue 18: start-up was 2-5 s
because scikit-learn, pandas and the Kafka clients were imported to register subcommands).

Each command runs in a fresh interpreter; the test lists which heavy modules ended up imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "parsers" / "dmesg-T-xid79-aer.log"
HEAVY = ("sklearn", "pandas", "numpy", "scipy", "kafka", "confluent_kafka", "matplotlib", "grafanalib",
         "kubernetes", "skops", "requests", "tqdm")

PROBE = """
import json, sys
from fleetcli.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("HEAVY=" + json.dumps(sorted({m.split('.')[0] for m in sys.modules} & set(MODULES))))
"""


def _probe(modules: tuple[str, ...]) -> str:
    return PROBE.replace("MODULES", repr(modules))


def heavy_imports(args: list[str], tmp_path: Path) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _probe(HEAVY), *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    line = [x for x in out.stdout.splitlines() if x.startswith("HEAVY=")]
    assert line, out.stdout + out.stderr
    return json.loads(line[-1][len("HEAVY="):])


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["diagnose", "--help"], ["tickets", "list"]],
                         ids=lambda a: " ".join(a))
def test_hand_run_commands_import_nothing_heavy(args: list[str], tmp_path: Path) -> None:
    if args[:2] == ["tickets", "list"]:
        args = ["tickets", "--state-db", str(tmp_path / "absent.db"), "list"]
    assert heavy_imports(args, tmp_path) == []


def test_diagnose_a_kernel_log_imports_nothing_heavy(tmp_path: Path) -> None:
    assert FIXTURE.exists()
    assert heavy_imports(["diagnose", str(FIXTURE)], tmp_path) == []


@pytest.mark.parametrize("action", [["list"], ["list", "--json"], ["show", "1"]], ids=" ".join)
def test_tickets_read_only_creates_nothing(action: list[str], tmp_path: Path) -> None:
    db = tmp_path / "sub" / "tickets.db"
    for args in (["tickets", "--state-db", str(db), *action], ["tickets", *action]):  # explicit, default path
        out = subprocess.run([sys.executable, "-m", "fleetcli.cli", *args], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == (2 if action[0] == "show" else 0), out.stderr
        assert "Traceback" not in out.stderr and "nothing was created" in out.stderr, out.stderr
        assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


@pytest.mark.parametrize("args", [["--help"], ["--version"]], ids=lambda a: " ".join(a))
def test_top_level_help_imports_no_part(args: list[str], tmp_path: Path) -> None:
    """`fleethealth --help` lists every command from fleetcli.cli.COMMANDS without importing them."""
    probe = _probe(("detectors", "parsers", "remediation", "simulator", "collectors", "dashboards",
                    "prometheus_client"))
    out = subprocess.run([sys.executable, "-c", probe, *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip().endswith("HEAVY=[]"), out.stdout[-400:] + out.stderr


def test_command_table_matches_what_the_modules_register() -> None:
    import argparse
    import importlib

    from fleetcli.cli import COMMANDS

    table = {name: mod for name, mod, _ in COMMANDS}
    registered: dict[str, str] = {}
    for mod in dict.fromkeys(table.values()):
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(mod).register(sub)
        registered.update(dict.fromkeys(sub.choices, mod))
    assert registered == table


def test_diagnose_a_kernel_log_imports_only_its_parsers(tmp_path: Path) -> None:
    """The parsers package imports a tool's parser the first time its format is asked for: a kernel
    log compiles neither the nvidia-smi, DCGM, InfiniBand nor the Prometheus-map regexes, nor the
    machine-check ones when it holds no machine-check line."""
    others = ("parsers.nvsmi_text", "parsers.nvsmi_xml", "parsers.nvsmi_table", "parsers.dcgm",
              "parsers.infiniband", "parsers.ethtool", "parsers.prom", "parsers.prom_map", "parsers.lspci",
              "parsers.sysfs_snapshot", "parsers.nvlink", "parsers.mce")
    probe = PROBE.replace("{m.split('.')[0] for m in sys.modules}", "set(sys.modules)").replace(
        "MODULES", repr(others + ("parsers.kernel",)))
    out = subprocess.run([sys.executable, "-c", probe, "diagnose", str(FIXTURE)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    line = [x for x in out.stdout.splitlines() if x.startswith("HEAVY=")]
    assert line, out.stdout + out.stderr
    assert json.loads(line[-1][len("HEAVY="):]) == ["parsers.kernel"]


def test_lazy_parser_table_resolves_every_format() -> None:
    from parsers import PARSERS

    assert len(PARSERS) == len(list(PARSERS)) >= 20
    assert all(callable(PARSERS[fmt]) for fmt in PARSERS)
    assert "kernel-log" in PARSERS and "no-such-format" not in PARSERS
