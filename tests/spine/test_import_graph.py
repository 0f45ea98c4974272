"""The import graph of DESIGN.md's layout, checked on every module of every package.

Every import counts: top-level, function-level (lazy) and ``importlib.import_module("...")`` /
``__import__("...")`` with a literal name. The allowed edges are the table in
``docs/architecture.md`` ("Import rules"); this test reads that table, so the document and the code
cannot drift apart.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fleethealth", "parsers", "collectors", "simulator", "detectors", "remediation", "dashboards",
            "fleetcli")

# package -> the other first-party packages it may import (itself is always allowed)
ALLOWED: dict[str, set[str]] = {
    "fleethealth": set(),
    "parsers": {"fleethealth"},
    "collectors": {"fleethealth", "parsers"},
    "simulator": {"fleethealth", "parsers"},
    "detectors": {"fleethealth", "parsers"},
    "remediation": {"fleethealth"},
    "dashboards": {"fleethealth"},
    "fleetcli": set(PACKAGES) - {"fleetcli"},
}


def imported_modules(src: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, dotted name) of every module ``src`` imports, wherever the import sits."""
    tree = ast.parse(src)
    pkg = module if is_package else module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
            if node.module:
                out.append((node.lineno, ".".join([*base, node.module])))
            else:  # ``from . import x`` / ``from .. import x``: x is a module
                out += [(node.lineno, ".".join([*base, a.name])) for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if fname in ("import_module", "__import__"):
                out.append((node.lineno, node.args[0].value))
    return out


def violations(module: str, src: str, is_package: bool = False) -> list[str]:
    top = module.split(".")[0]
    allowed = ALLOWED[top] | {top}
    bad = []
    for line, name in imported_modules(src, module, is_package):
        target = name.split(".")[0]
        if target in PACKAGES and target not in allowed:
            bad.append(f"{module}:{line} imports {name}")
    return bad


def all_modules() -> list[tuple[str, Path]]:
    mods = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            mods.append((".".join(parts), path))
    return mods


def test_every_package_is_scanned():
    mods = all_modules()
    for pkg in PACKAGES:
        assert any(m.split(".")[0] == pkg for m, _ in mods), f"no modules found under {pkg}/"
    assert len(mods) > 100


def test_import_graph_follows_the_layout():
    bad: list[str] = []
    for module, path in all_modules():
        is_pkg = path.name == "__init__.py"
        name = module.removesuffix(".__init__")
        bad += violations(name, path.read_text(), is_pkg)
    assert not bad, "imports against the layout (docs/architecture.md, 'Import rules'):\n" + "\n".join(bad)


@pytest.mark.parametrize("module,src,expect", [
    ("fleethealth.bus", "def f():\n    from detectors.engine import engine\n", "fleethealth.bus:2 imports detectors.engine"),
    ("fleethealth.bus", "import importlib\nimportlib.import_module('collectors.daemon')\n",
     "fleethealth.bus:2 imports collectors.daemon"),
    ("detectors.ml.source", "def f():\n    from simulator.engine import simulate\n",
     "detectors.ml.source:2 imports simulator.engine"),
    ("detectors.registry", "__import__('fleetcli.cli')\n", "detectors.registry:1 imports fleetcli.cli"),
    ("collectors.daemon", "import remediation.worker\n", "collectors.daemon:1 imports remediation.worker"),
    ("simulator.engine", "from .. import detectors\n", "simulator.engine:1 imports detectors"),
])
def test_checker_catches_each_kind_of_import(module, src, expect):
    assert violations(module, src) == [expect]


def test_checker_allows_what_the_layout_allows():
    assert violations("detectors.diagnose.doctor", "from parsers import load\nfrom fleethealth import xid\n") == []
    assert violations("fleetcli.run_parts", "def f():\n    from simulator.engine import Simulation\n") == []
    assert violations("simulator.klog", "from .topology import GpuSpec\n") == []


def test_architecture_doc_draws_the_same_graph():
    text = (ROOT / "docs" / "architecture.md").read_text()
    m = re.search(r"^## Import rules\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, "docs/architecture.md has no '## Import rules' section"
    doc: dict[str, set[str]] = {}
    for row in re.findall(r"^\| `(\w+)/` \| (.*?) \|", m.group(1), re.M):
        pkg, deps = row
        doc[pkg] = set(re.findall(r"`(\w+)`", deps))
    assert doc == ALLOWED
