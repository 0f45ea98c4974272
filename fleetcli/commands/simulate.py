"""``fleethealth simulate`` and ``fleethealth replay``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from fleethealth.bus import TELEMETRY
from fleethealth.cliutil import flag, kafka_client_flag
from fleethealth.errors import UserError

# the simulator's scenarios (plan.SCENARIOS; a literal here keeps --help free of numpy imports)
REPLAY_WIRES = ("as-recorded", "msgpack", "json")  # simulator.replay.WIRES (a literal: no msgspec for --help)
SCENARIOS = ("default", "flapping-cable", "sbe-storm-no-uce", "driver-update", "hard-cases", "slow-drift",
             "training")

SIM_HELP = """\
Write a labelled synthetic fleet recording: N hosts (8 H100-like GPUs with 18 NVLinks, 8 NDR
InfiniBand ports mlx5_0..7, 16 DIMMs on 8 EDAC controllers; 32 hosts per rack), one contract
telemetry sample per host per interval, sorted by (ts, host), with realistic healthy noise and faults
of every failure mode at rates derived from Llama 3's published interruption table (times
--fault-rate). Same arguments and seed -> byte-identical output.

Beside PATH it writes PATH-stem.truth.jsonl (one ground-truth fault per line: id, host, cluster,
rack, component, component_kind, failure_mode, onset, end, secondary, notes) and PATH-stem.meta.json
(the arguments, counts per mode, expected counts, benign events).

Scenarios: default; flapping-cable (extra long-flapping cables, some fail); sbe-storm-no-uce
(correctable-ECC storms that never become a UCE); driver-update (mid-run, every host reboots into a
new driver: all counters reset, new boot_id, no faults from it).

  fleethealth simulate --hosts 64 --duration 2h --interval 30 --seed 1 --fault-rate 2000 --out smoke.jsonl.gz

Speed (2 cores): a 512-host day at 30 s (1.47 M samples, ~20 GB of JSON) is generated in well under
a minute; writing .jsonl adds the disk; .jsonl.gz is bound by zlib (two worker threads, one gzip
member per 32 MiB chunk; --gzip-level 1 is the fastest).
"""

REPLAY_HELP = """\
Stream a recording (.jsonl or .jsonl.gz) into the bus, key = host: at full speed (--speed 0) or
scaled real time from the samples' ts (--speed 60 = one hour per minute). Invalid lines are counted,
logged and sent to the dead-letter topic; replay carries on. With --score, run the detectors over
the recording and print the scorecard against its ground truth (PATH-stem.truth.jsonl).

  fleethealth replay replay_data/smoke-64h.jsonl.gz --to kafka:127.0.0.1:9092
  fleethealth replay replay_data/smoke-64h.jsonl.gz --score --json --report out/
"""


def register(sub: Any) -> None:
    p = sub.add_parser("simulate", help="write a labelled synthetic fleet recording", description=SIM_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    flag(p, "--hosts", type=int, default=64, help="number of hosts")
    flag(p, "--duration", default="1h", help="length of the recording: 1d, 6h, 30m, 90s")
    flag(p, "--interval", type=float, default=30.0, help="seconds between polls of a host")
    flag(p, "--seed", type=int, default=0, help="random seed (same seed, same bytes)")
    flag(p, "--fault-rate", type=float, default=1.0, help="multiplier on the default (Llama 3-derived) fault rates")
    flag(p, "--min-per-mode", type=int, default=0,
         help="top every failure mode up to at least this many faults (when --fault-rate > 0)")
    flag(p, "--scenario", default="default", choices=list(SCENARIOS),
         help="hard case to add (hard-cases: marginal counter faults beside near-limit healthy noise)")
    flag(p, "--out", required=True, metavar="PATH", help="output .jsonl or .jsonl.gz")
    flag(p, "--gzip-level", type=int, default=1, choices=range(10), metavar="0-9",
         help="gzip level for .jsonl.gz: 1 = fastest (default), 6 = ~40%% smaller at ~2.5x the CPU")
    flag(p, "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_simulate)

    r = sub.add_parser("replay", help="stream a recording into the bus (and score it)", description=REPLAY_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("path", metavar="PATH", help="recording (.jsonl or .jsonl.gz)")
    flag(r, "--to", default="memory", help="bus: memory | jsonl:PATH | kafka[:HOST:PORT]")
    kafka_client_flag(r)
    flag(r, "--topic", default=TELEMETRY, help="topic to publish to")
    flag(r, "--wire", choices=REPLAY_WIRES, default="as-recorded", env="FLEETHEALTH_REPLAY_WIRE",
         help="encoding published: as-recorded (the default: each line's bytes, JSON), msgpack (what "
              "collectors send to Kafka by default) or json. Transcoding costs replay a strict decode and "
              "encode a sample, more CPU than detect saves on msgpack (docs/telemetry.md#wire-format); "
              "samples the strict decoder does not take go as recorded, for detect to refuse the same way")
    flag(r, "--speed", type=float, default=0.0, help="0 = full speed; X = X times real time")
    flag(r, "--limit", type=int, default=None, help="stop after N samples")
    flag(r, "--score", action="store_true", help="run the detectors and print the scorecard")
    flag(r, "--json", action="store_true", help="print the result as JSON")
    flag(r, "--report", metavar="DIR", default=None,
         help="write an HTML report here: the scorecard with --score; without it (no ground truth needed) "
              "every incident that would have been raised, when and on which component")
    flag(r, "--with-models", action="store_true",
         help="with --score or --report: also run the ML detectors shipped in detectors/models")
    flag(r, "--models", type=Path, default=None, metavar="DIR", help="load the ML detectors' models from DIR (what `fleethealth train --out DIR` wrote); implies --with-models")
    flag(r, "--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=cmd_replay)


def _bar(total: int | None, quiet: bool, unit: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, unit_scale=True, file=sys.stderr, disable=quiet or not sys.stderr.isatty())


def cmd_simulate(args: argparse.Namespace) -> int:
    from simulator.engine import simulate
    from simulator.plan import RunSpec, parse_duration

    out = Path(args.out)
    if not (out.name.endswith(".jsonl") or out.name.endswith(".jsonl.gz")):
        raise UserError(f"--out {out}: the recording must end in .jsonl or .jsonl.gz")
    spec = RunSpec(hosts=args.hosts, duration_s=parse_duration(args.duration), interval_s=args.interval,
                   seed=args.seed, fault_rate=args.fault_rate, scenario=args.scenario, min_per_mode=args.min_per_mode)
    spec.check()
    t0 = time.perf_counter()
    with _bar(spec.hosts * spec.ticks, args.quiet, "samples") as bar:
        res = simulate(spec, out, bar.update, gzip_level=args.gzip_level)
    dt = time.perf_counter() - t0
    faults = sum(res.faults.values())
    print(f"wrote {res.samples} samples ({res.dropped_samples} dropped in transit on purpose) and {faults} faults "
          f"to {out} in {dt:.1f} s ({res.samples / dt:.0f} samples/s); truth: {res.truth_path}")
    if res.faults_without_room:
        print(f"note: {res.faults_without_room} drawn faults found no free host window and were left out",
              file=sys.stderr)
    return 0


def _replay_engine(args: argparse.Namespace) -> Any:
    """The engine ``--score`` / ``--report`` run: rules, plus the ML detectors with ``--with-models``
    or ``--models DIR``; None (the default engine) otherwise."""
    models = getattr(args, "models", None)
    if not (getattr(args, "with_models", False) or models is not None):
        return None
    if models is not None and not Path(models).is_dir():
        raise UserError(f"--models {models}: no such folder (point it at what `fleethealth train --out DIR` wrote)")
    from detectors.engine.engine import DetectorEngine
    from detectors.registry import model_detectors

    return DetectorEngine(extra_detectors=model_detectors(models))


def _check_replay_flags(args: argparse.Namespace) -> None:
    """A flag that does nothing in the mode asked for is an error, never silently ignored."""
    judging = args.score or args.report
    if not judging and (getattr(args, "with_models", False) or getattr(args, "models", None) is not None):
        raise UserError("--with-models / --models run the detectors, which only --score or --report do; add one")
    if judging:
        lone = [f for f, on in (("--to", args.to != "memory"), ("--topic", args.topic != TELEMETRY),
                                ("--speed", bool(args.speed)), ("--limit", args.limit is not None),
                                ("--wire", args.wire != "as-recorded")) if on]
        if lone:
            raise UserError(f"{', '.join(lone)} only apply when publishing a recording; with --score / --report "
                            "the recording is read in-process (drop them, or drop --score / --report)")


def cmd_replay(args: argparse.Namespace) -> int:
    path = Path(args.path)
    _check_replay_flags(args)
    if (args.score or args.report) and not path.exists():
        raise UserError(f"{path}: no such recording")
    engine = _replay_engine(args)
    if args.score:
        from detectors.scoring.scoring import score_replay

        return int(score_replay(path, args, engine=engine))
    if args.report:  # no ground truth needed: what would have been raised, when, where
        from detectors.scoring.backtest import backtest, format_text  # type: ignore[import-not-found]

        with _bar(None, args.quiet, "samples") as bar:
            res, eps, page = backtest(path, Path(args.report), progress=bar.update, engine=engine)
        if args.json:
            print(json.dumps({"samples": res.samples, "hosts": len(res.hosts), "invalid": res.invalid,
                              "incidents": [e.as_dict() for e in eps], "report": str(page)}, sort_keys=True))
        else:
            print(format_text(res, eps))
            print(f"report: {page}")
        return 0
    from fleethealth.config import load_config, open_bus
    from simulator.replay import REPLAY_DELIVERY_REPORTS, replay_file

    if args.wire == "msgpack" and args.to.startswith("jsonl:"):
        raise UserError("--wire msgpack: a JSONL bus holds JSON text; publish msgpack to kafka or memory")
    # replay needs to know that everything arrived, not which message did: flush raises otherwise
    bus = open_bus(args.to, load_config(getattr(args, "config", None)), args.kafka_client,
                   delivery_reports=REPLAY_DELIVERY_REPORTS)
    try:
        with _bar(None, args.quiet, "samples") as bar:
            st = replay_file(path, bus, topic=args.topic, speed=args.speed, limit=args.limit, progress=bar.update,
                             wire=args.wire)
    finally:
        bus.close()
    if args.json:
        print(json.dumps(st.as_dict(), sort_keys=True))
    else:
        print(f"replayed {st.published} samples from {st.hosts} hosts to {args.to} topic {st.topic} in "
              f"{st.seconds:.1f} s ({st.rate:.0f} samples/s, {st.wire}"
              + (f", {st.as_recorded} as recorded: no exact {st.wire}" if st.as_recorded else "")
              + f"); {st.invalid} invalid lines skipped"
              + (f"; stopped early: {st.truncated}" if st.truncated else ""))
    return 1 if st.truncated else 0
