"""``fleethealth import prometheus`` throughput and memory, against a real (private) Prometheus.

A fleet history in dcgm-exporter + node_exporter shape (tests/backtest/fixture_exporter.py: 4 GPUs
and 2 IB ports per host) is written as OpenMetrics with timestamps, turned into TSDB blocks by
``promtool tsdb create-blocks-from openmetrics``, and served by a private Prometheus; the importer
then runs as a child process (its peak RSS is the child's ``ru_maxrss``) at two ``--max-points``
bounds. Figures only, never assertions.

  python -m benchmarks --only import
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.table import Row

REPO = Path(__file__).resolve().parents[1]
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")


_CHILD = """
import cProfile, json, pstats, sys
from pathlib import Path
from fleetcli.commands.prom_import import ImportSpec, PromClient, run_import
spec = ImportSpec(url="{url}", start={start}, end={end}, step={step}, max_points={max_points})
prof = cProfile.Profile() if "{profile}" else None
if prof: prof.enable()
st = run_import(spec, Path("{out}"), PromClient("{url}"), force=True)
if prof:
    prof.disable(); pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
d = st.as_dict()
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec (it would report the parent's peak)
d["rss_kb"] = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:"))
print(json.dumps(d))
"""


def write_history(path: Path, hosts: int, hours: float, interval: float, end: float) -> int:
    from tests.backtest.fixture_exporter import dcgm_text, node_text

    names = [f"gpu-node-{101 + i}" for i in range(hosts)]
    steps = int(hours * 3600 / interval)
    start = end - steps * interval
    fams: dict[str, list[str]] = {}
    for h in names:
        for k in range(steps):
            ts = start + k * interval
            el = k * interval / 600.0  # the fixture's faults land in the first few hours
            for text, inst in ((dcgm_text(h, el), f"{h}:9400"), (node_text(h, el), f"{h}:9100")):
                for line in text.splitlines():
                    m = _LINE.match(line)
                    if not m:
                        continue
                    labels = m.group(2) or "{}"
                    labels = labels[:-1] + ("," if labels != "{}" else "") + f'instance="{inst}"}}'
                    fams.setdefault(m.group(1), []).append(f"{m.group(1)}{labels} {m.group(3)} {ts:.3f}")
    n = 0
    with open(path, "w") as fh:
        for name, lines in fams.items():
            fh.write(f"# TYPE {name} unknown\n")
            fh.write("\n".join(lines) + "\n")
            n += len(lines)
        fh.write("# EOF\n")
    return n


def rows(hosts: int = 16, hours: float = 6.0, interval: float = 30.0) -> list[Row]:
    from tests.backtest.private_prometheus import PrivatePrometheus

    out: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-import-") as td:
        root = Path(td)
        end = time.time() - 3600
        om = root / "history.om"
        stored = write_history(om, hosts, hours, interval, end)
        (root / "prom").mkdir()
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(om),
                        str(root / "prom" / "tsdb")], check=True, capture_output=True)
        om.unlink()
        prom = PrivatePrometheus(root / "prom", [])
        try:
            for max_points in (100_000, 1_000_000):
                dst = root / f"out-{max_points}.jsonl.gz"
                child = _CHILD.format(url=prom.url, start=end - hours * 3600, end=end, step=interval, out=str(dst),
                                      max_points=max_points, profile=os.environ.get("BENCH_IMPORT_PROFILE", ""))
                r = subprocess.run([sys.executable, "-c", child], cwd=REPO, capture_output=True, text=True)
                if r.returncode != 0:
                    raise RuntimeError(r.stderr[-3000:])
                if os.environ.get("BENCH_IMPORT_PROFILE"):
                    print(r.stderr[-6000:], file=sys.stderr)
                d = json.loads(r.stdout.strip().splitlines()[-1])
                cover = (f"{hosts} hosts x {hours:g} h at {interval:g} s: {d['points']:,} of {stored:,} stored points in {d['chunks']} "
                         f"chunks, --max-points {max_points:,}, one core")
                out.append(Row("import prometheus", f"points/s (--max-points {max_points:,})",
                               d["points"] / d["seconds"], "points/s", cover))
                out.append(Row("import prometheus", f"host-samples/s (--max-points {max_points:,})",
                               d["samples"] / d["seconds"], "samples/s", cover))
                out.append(Row("import prometheus", f"peak RSS (--max-points {max_points:,})", d["rss_kb"] / 1024,
                               "MiB", "the importing process (VmHWM), without the CLI's start-up imports"))
        finally:
            prom.stop()
    return out


if __name__ == "__main__":
    from benchmarks.table import render

    print(render(rows()))
