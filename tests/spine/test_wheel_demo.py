"""The built wheel carries what the commands need (ux.md 8: it lacked the models and the demo's
recording, so `fleethealth demo` failed and `--with-models` ran rules only). The wheel is built from
the working tree, installed into a fresh venv (its dependencies come from this interpreter's
site-packages through a .pth file, so nothing is downloaded), and `fleethealth demo` runs from it,
outside the repository."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _build_wheel(out: Path) -> Path:
    no_isolation = subprocess.run([sys.executable, "-c", "import setuptools.command.bdist_wheel"],
                                  capture_output=True).returncode == 0
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)]
    if no_isolation:
        cmd.insert(5, "--no-build-isolation")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    wheels = list(out.glob("fleethealth-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_installed_wheel_runs_demo(tmp_path: Path) -> None:
    if not (ROOT / "replay_data" / "smoke-64h.jsonl.gz").exists():
        pytest.skip("demo dataset not in this checkout")
    wheel = _build_wheel(tmp_path / "dist")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the test interpreter's libraries (sklearn, msgspec, ...), after the wheel's own packages; its
    # editable fleethealth finder is a .pth of that folder, which a .pth-added folder does not run
    (site / "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETHEALTH_", "PYTHONPATH"))}
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run([str(py), "-c", "import fleetcli, detectors.ml as m; print(fleetcli.__file__);"
                            "print(m.MODEL_DIR)"], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout
    assert (Path(where.stdout.split()[1]) / "fault_classifier.skops").exists()
    r = subprocess.run([str(venv / "bin" / "fleethealth"), "demo", "--report", str(work / "rep"), "--quiet",
                        "--metrics-port", "0", "--exporter-port", "0", "--with-models"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode in (0, 1), r.stderr[-3000:]  # 1: the scorecard below the bar, still a full run
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert (work / "rep" / "index.html").exists()
