"""`make bench`: run every benchmark and print one table (figures, never assertions).

Usage: python -m benchmarks [--only NAME ...] [--quick]
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback

from benchmarks.table import Row, machine, render

# (module, kwargs for a full run, kwargs for --quick)
SUITE: list[tuple[str, dict, dict]] = [
    ("benchmarks.bench_contract", {}, {"seconds": 0.5}),
    ("benchmarks.bench_collector", {"polls": 300}, {"polls": 50}),
    ("benchmarks.bench_simulate", {"hosts": 512, "hours": 1.0}, {"hosts": 64, "hours": 0.5}),
    ("benchmarks.bench_detect", {}, {"quick": True}),
    ("benchmarks.bench_kafka_capacity", {}, {"quick": True}),
    ("benchmarks.bench_ml", {}, {"quick": True}),
    ("benchmarks.bench_remediation", {"n": 2000}, {"n": 300}),
    ("benchmarks.bench_kernel_reader", {}, {"n": 4000}),
    ("benchmarks.bench_startup", {}, {"repeat": 2}),
    ("benchmarks.bench_memory", {"mb": 1000.0}, {"mb": 60.0}),
    ("benchmarks.bench_import", {}, {"hosts": 4, "hours": 1.0}),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("--only", nargs="*", default=None, help="run only these (e.g. contract detect)")
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = ap.parse_args(argv)
    rows: list[Row] = []
    failed = []
    for mod, full, quick in SUITE:
        short = mod.rsplit(".", 1)[1].removeprefix("bench_")
        if args.only and short not in args.only:
            continue
        print(f"running {short} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            m = importlib.import_module(mod)
            kw = quick if args.quick else full
            try:
                got = m.rows(**kw)
            except TypeError:  # a module whose rows() takes other arguments: run it with its defaults
                got = m.rows()
            rows.extend(got)
        except Exception:
            traceback.print_exc()
            failed.append(short)
        print(f"  {short}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    print(f"fleethealth benchmarks on {machine()}")
    print(render(rows))
    if failed:
        print(f"\nfailed to run: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
