"""Start-up of the commands people run by hand (issue 18's goal: under 0.3 s wall on an idle
machine): best-of-N wall time and CPU time (user + system, from wait4) of a fresh
`python -m fleetcli.cli ...` process per command, beside a bare interpreter as the floor, and the
load average while it ran (wall time on a busy machine says little; CPU time says more).

The children run as an installed tree does: bytecode cached (``PYTHONDONTWRITEBYTECODE`` is dropped
for them and a warm-up run writes it), and with a private ``fleethealth.datacache`` folder:
``diagnose FILE (first run)`` is a cold cache (rule files parsed with PyYAML and stored),
``diagnose FILE`` every later run (rules read back, no YAML). Printed, never asserted."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.table import Row

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "parsers" / "dmesg-T-xid79-aer.log"


def _run(args: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one fresh process."""
    t0 = time.perf_counter()
    p = subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, _, ru = os.wait4(p.pid, 0)
    return time.perf_counter() - t0, ru.ru_utime + ru.ru_stime


def rows(repeat: int = 5) -> list[Row]:
    py = [sys.executable]
    cli = [*py, "-m", "fleetcli.cli"]
    out: list[Row] = []
    with tempfile.TemporaryDirectory() as d:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["FLEETHEALTH_CACHE_DIR"] = str(Path(d) / "cache")
        diagnose = [*cli, "diagnose", str(FIXTURE)]
        cases = [
            ("python -c pass (the floor)", [*py, "-c", "pass"]),
            ("fleethealth --help", [*cli, "--help"]),
            ("fleethealth --version", [*cli, "--version"]),
            ("fleethealth diagnose FILE", diagnose),
            ("fleethealth tickets list", [*cli, "tickets", "--state-db", str(Path(d) / "none.db"), "list"]),
        ]
        for _, args in cases:
            _run(args, d, {**env, "FLEETHEALTH_CACHE_DIR": "off"})  # bytecode written, nothing cached
        load0 = os.getloadavg()[0]
        wall, cpu = _run(diagnose, d, env)  # the first run with an empty cache
        out.append(Row("start-up", "fleethealth diagnose FILE (first run)", wall, "s wall",
                       f"cold cache: rules parsed and stored; {cpu:.3f} s CPU"))
        for name, args in cases:
            runs = [_run(args, d, env) for _ in range(repeat)]
            out.append(Row("start-up", name, min(w for w, _ in runs), "s wall",
                           f"best of {repeat}, fresh process; {min(c for _, c in runs):.3f} s CPU"))
        load = f"load average {load0:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
        out.append(Row("start-up", "machine load while measured", os.getloadavg()[0], "1-min load", load))
    return out


def main() -> None:
    from benchmarks.table import render

    print(render(rows()))


if __name__ == "__main__":
    main()
