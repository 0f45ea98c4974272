"""Start-up of the commands people run by hand (issue 18's goal: under 0.3 s wall on an idle
machine): best-of-N wall time of a fresh `python -m fleetcli.cli ...` process per command, beside a
bare interpreter as the floor. Printed, never asserted."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.table import Row

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "parsers" / "dmesg-T-xid79-aer.log"


def _wall(args: list[str], repeat: int) -> float:
    best = float("inf")
    with tempfile.TemporaryDirectory() as d:
        for _ in range(repeat):
            t0 = time.perf_counter()
            subprocess.run(args, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            best = min(best, time.perf_counter() - t0)
    return best


def rows(repeat: int = 5) -> list[Row]:
    py = [sys.executable]
    cli = [*py, "-m", "fleetcli.cli"]
    with tempfile.TemporaryDirectory() as d:
        cases = [
            ("python -c pass (the floor)", [*py, "-c", "pass"]),
            ("fleethealth --help", [*cli, "--help"]),
            ("fleethealth --version", [*cli, "--version"]),
            ("fleethealth diagnose FILE", [*cli, "diagnose", str(FIXTURE)]),
            ("fleethealth tickets list", [*cli, "tickets", "--state-db", str(Path(d) / "none.db"), "list"]),
        ]
        return [Row("start-up", name, _wall(args, repeat), "s wall", f"best of {repeat}, fresh process")
                for name, args in cases]


def main() -> None:
    from benchmarks.table import render

    print(render(rows()))


if __name__ == "__main__":
    main()
