"""``fleethealth train``: fit the ML detectors on simulated labelled fleets."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from fleetcli.commands.simulate import SCENARIOS
from fleethealth.cliutil import flag
from fleethealth.errors import UserError

log = logging.getLogger("fleethealth.train")

TRAIN_HELP = """\
Simulate labelled fleets (one per --seed, with the fleet simulator), extract windowed
per-component features, fit the supervised classifier (one HistGradientBoosting model per GPU /
network port / host) and the unsupervised peer-comparison detector (healthy envelope +
IsolationForest on deviations from a component's peers), then measure both on a fleet simulated
with --holdout-seed (never used in training) and print the metrics.

Models are written to --out as skops archives (no code runs on load; types are checked against an
allow-list) with a JSON sidecar: version, feature names, training seeds and sizes, sklearn
version, metrics. The fleets are simulated with --scenario training by default: the default
fault mix beside many healthy near-limit parts, which the models must learn to leave alone. The
shipped models in detectors/models/ were made with (seeds no shipped recording uses):

  fleethealth train --hosts 32 --duration 4h --interval 10 --seed 21 --seed 22 --seed 23 --seed 24 \\
      --holdout-seed 99 --fault-rate 2000 --min-per-mode 3 --window 120 --out detectors/models/
"""


def _duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    try:
        return float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad duration {text!r}: use 90s, 30m, 6h, 1d") from None


def register(sub: Any) -> None:
    p = sub.add_parser("train", help="fit the ML detectors on simulated labelled fleets", description=TRAIN_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    flag(p, "--hosts", type=int, default=32, help="hosts per simulated training fleet")
    flag(p, "--duration", type=_duration, default=4 * 3600.0, help="length of each training fleet: 90s, 30m, 6h, 1d")
    flag(p, "--interval", type=float, default=10.0, help="seconds between samples of one host")
    flag(p, "--seed", type=int, action="append", dest="seeds",
         help="a training fleet's seed (repeat for several; default 1 and 2)")
    flag(p, "--holdout-seed", type=int, default=99, help="seed of the validation fleet, never trained on")
    flag(p, "--fault-rate", type=float, default=2000.0,
         help="multiplier on the default fault rates (training needs many faults)")
    flag(p, "--min-per-mode", type=int, default=2, help="at least this many faults of every mode per fleet")
    flag(p, "--scenario", default="training", choices=list(SCENARIOS),
         help="simulator scenario of the training and held-out fleets (default 'training': the default fault "
              "mix beside many healthy near-limit parts)")
    flag(p, "--window", type=float, default=60.0, help="feature window, seconds of sample time")
    flag(p, "--threshold", type=float, default=0.9, help="minimum class probability for a classifier finding")
    flag(p, "--out", type=Path, default=Path("detectors/models"), help="folder for the model files")
    flag(p, "--json", action="store_true", help="print the validation metrics as JSON")
    flag(p, "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from detectors.ml.model_io import save_model
    from detectors.ml.source import read_recording
    from detectors.ml.train import PEER_NAME, SUPERVISED_NAME, TrainConfig, train
    from simulator.engine import simulate
    from simulator.plan import RunSpec

    seeds = tuple(args.seeds or (1, 2))
    if args.holdout_seed in seeds:
        raise UserError(f"--holdout-seed {args.holdout_seed} is also a training seed; pick one never trained on")
    if args.hosts < 4:
        raise UserError("--hosts must be at least 4 (peer comparison needs a rack)")
    cfg = TrainConfig(hosts=args.hosts, duration_s=args.duration, interval_s=args.interval, seeds=seeds,
                      holdout_seed=args.holdout_seed, fault_rate=args.fault_rate, scenario=args.scenario,
                      window_s=args.window,
                      threshold=args.threshold,
                      command="fleethealth " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    per_fleet = args.hosts * int(args.duration // args.interval)
    bar = tqdm(total=per_fleet * (len(seeds) + 1), unit="samples", unit_scale=True, file=sys.stderr,
               disable=args.quiet or not sys.stderr.isatty(), desc="simulate + features")

    tmp = Path(tempfile.mkdtemp(prefix="fleethealth-train-"))

    def load(seed: int) -> Any:
        """Simulate one labelled fleet (at least ``--min-per-mode`` faults of every mode) into a
        temporary recording and read it back as windows + ground truth."""
        bar.set_postfix_str(f"seed {seed}")
        out = tmp / f"seed{seed}.jsonl.gz"
        spec = RunSpec(hosts=cfg.hosts, duration_s=cfg.duration_s, interval_s=cfg.interval_s, seed=seed,
                       fault_rate=cfg.fault_rate, min_per_mode=args.min_per_mode, scenario=cfg.scenario)
        spec.check()
        simulate(spec, out)
        try:
            return read_recording(out, cfg.window_s, tick=lambda: bar.update(1))
        finally:
            out.unlink(missing_ok=True)

    try:
        with bar:
            res = train(cfg, load)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    save_model(args.out, SUPERVISED_NAME, res.supervised, res.supervised_meta)
    save_model(args.out, PEER_NAME, res.peer, res.peer_meta)
    m = res.metrics
    if args.json:
        print(json.dumps(m, indent=2, sort_keys=True))
        return 0
    print(f"held-out seed {cfg.holdout_seed}: {m['windows']} windows from {m['samples']} samples")
    print(f"{'failure mode':<24}{'precision':>10}{'recall':>8}{'faults':>8}{'true win':>10}{'false win':>10}")
    for mode, r in m["per_mode"].items():
        prec = "-" if r["precision"] is None else f"{r['precision']:.3f}"
        rec = "-" if r["recall"] is None else f"{r['recall']:.3f}"
        print(f"{mode:<24}{prec:>10}{rec:>8}{r['support']:>8}{r['true_windows']:>10}{r['false_windows']:>10}")
    print(f"classifier: window precision {m['precision']}, fault recall {m['recall']}; "
          f"healthy hosts with findings: {m['healthy_hosts_with_findings']}")
    print(f"peer detector findings: {m['peer_findings']}")
    print(f"models written to {args.out}/{SUPERVISED_NAME}.skops, {PEER_NAME}.skops (+ .json sidecars)")
    return 0
