"""Peak RSS over a large recording (issue 18's goal: under 300 MB for any recording size; the JSONL
bus once held the whole file: 2.29 GB for 634 MB). A recording of about ``mb`` MB is generated under
the system temp folder from the shipped 128-host day, copies laid end to end (timestamps and
sequence numbers moved on, so the detectors see a longer day, not duplicates), then each command
runs in a fresh process and its peak RSS is read from wait4. The file is deleted afterwards; never
committed. Printed, never asserted."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from benchmarks.table import Row
from fleethealth.bus import iter_jsonl

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "replay_data" / "fleet-128h-1d.jsonl.gz"


def generate(out: Path, mb: float) -> tuple[int, int]:
    """Write about ``mb`` MB of JSONL to ``out``; returns (samples, bytes)."""
    # streamed, never held: the parent's own RSS would show in a forked child's peak (wait4)
    first_ts = last_ts = None
    count = 0
    for _, raw in iter_jsonl(SOURCE):
        ts = float(msgspec.json.decode(raw)["ts"])
        first_ts = ts if first_ts is None else first_ts
        last_ts, count = ts, count + 1
    assert first_ts is not None and last_ts is not None
    span = last_ts - first_ts + 60.0
    n = size = copy = 0
    with open(out, "wb") as fh:
        while size < mb * 1e6:
            for _, raw in iter_jsonl(SOURCE):
                d = msgspec.json.decode(raw)
                d["ts"] = float(d["ts"]) + copy * span
                if isinstance(d.get("seq"), int):
                    d["seq"] += copy * count
                b = msgspec.json.encode(d) + b"\n"
                fh.write(b)
                size += len(b)
                n += 1
            copy += 1
    return n, size


def _peak_rss_mb(args: list[str], cwd: str) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHEALTH_")}
    t0 = time.perf_counter()
    p = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return ru.ru_maxrss / 1024, time.perf_counter() - t0


def rows(mb: float = 1000.0) -> list[Row]:
    cli = [sys.executable, "-m", "fleetcli.cli"]
    out: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="fleethealth-bench-mem-") as d:
        big = Path(d) / "big.jsonl"
        n, size = generate(big, mb)
        covers = f"{size / 1e9:.2f} GB, {n:,} samples, 128 hosts; peak RSS of a fresh process"
        cases = [
            ("replay FILE --to jsonl:OUT", [*cli, "replay", str(big), "--to", f"jsonl:{d}/copy.jsonl", "--quiet"]),
            ("detect --bus jsonl:FILE", [*cli, "detect", "--bus", f"jsonl:{big}", "--exit-when-idle",
                                         "--from-beginning", "--metrics-port", "0"]),
            ("replay FILE --report DIR", [*cli, "replay", str(big), "--report", f"{d}/rep", "--quiet"]),
        ]
        for name, args in cases:
            rss, wall = _peak_rss_mb(args, d)
            out.append(Row("memory", name, rss, "MB peak RSS", f"{covers}; {wall:.0f} s wall"))
            Path(d, "copy.jsonl").unlink(missing_ok=True)
    return out


def main() -> None:
    from benchmarks.table import render

    mb = float(sys.argv[1]) if len(sys.argv) > 1 else 1000.0
    print(render(rows(mb)))


if __name__ == "__main__":
    main()
