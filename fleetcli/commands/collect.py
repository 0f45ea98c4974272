"""Subcommands of the collectors part: ``fleethealth collect``."""

from __future__ import annotations

import argparse
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from fleethealth.cliutil import flag, kafka_client_flag, kafka_wire_flag
from fleethealth.errors import ServiceUnavailable, UserError

log = logging.getLogger("fleethealth.collect")
MIN_INTERVAL = 0.1  # seconds: a smaller --interval (0 included) would busy-loop a core
DEFAULT_PORT, DEFAULT_ADDRESS = 9404, "127.0.0.1"  # as collectors.exporter (not imported: keep startup light)

COLLECT_HELP = """\
Run the per-host collector: every --interval seconds read NVML (per-GPU ECC by location, remapped
rows, retired pages, PCIe, NVLink, temperature, power, throttle reasons, Xid events), sysfs (PCIe
AER and link, InfiniBand/RoCE ports, EDAC) and the kernel log (Xid, fallen off the bus, AER, EDAC,
MCE lines), and publish one sample per poll to the sink. Samples are spooled on disk first and
sent in order, so a Kafka outage loses nothing (up to --spool-max-mb). Prometheus metrics are
served on --exporter-address:--exporter-port (127.0.0.1:9404 by default; 9400 is dcgm-exporter's).
SIGTERM drains the spool (up to --drain-timeout while the sink takes records; a few seconds when
it is down: the rest stays spooled for the next start) and saves the sequence number. A daemon needs an explicit --sink (or
FLEETHEALTH_SINK): without one it refuses to start (exit 2) instead of writing JSON to stdout;
--once alone prints to stdout. Exit 2 also for a taken exporter port.

  fleethealth collect --simulate --once --sink stdout      # one simulated 8-GPU sample, no GPU needed
  fleethealth collect --simulate --inject gpu_dram_uce@3 --once --sink stdout   # ... with a fault
  fleethealth collect --sink kafka:10.0.0.5:9092 --expected-gpus 8
"""


RESET_HELP = """\
On a GPU host: reset one GPU with NVML released by the collector. nvidia-smi -r refuses while an NVML
client holds the GPU, and the collector is one. This creates the collector's pause file
(STATE_DIR/nvml.pause) exclusively, waits until the collector writes nvml.pause.released (it has
freed its event set and shut NVML down), runs the reset command, and removes the pause file
afterwards whatever happened; the collector takes NVML back at its next poll. Refused (exit 1,
nothing reset) when another reset holds the pause or the collector does not confirm in --wait
seconds; exit 2 for a GPU id that is not an index, a GPU-UUID or a PCI address. The GPU id reaches
the reset command as one argument, never through a shell. The remediation's reset_gpu hook runs it
on the host, e.g. ["srun", "-w", "{node}", "fleethealth", "reset-gpu", "{component}"].

  fleethealth reset-gpu GPU-5d3c2a1e-0000-4c2a-9b1e-000000000000
  fleethealth reset-gpu 3 --reset-command "nvidia-smi -r -i {gpu}"
"""
_GPU_ID = re.compile(r"^(?:\d{1,2}|GPU-[0-9a-fA-F-]{8,64}|[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])$")


def register(sub: Any) -> None:  # sub: argparse._SubParsersAction
    r = sub.add_parser("reset-gpu", help="reset a GPU with NVML released by the collector", description=RESET_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("gpu", help="GPU index, UUID (GPU-...) or PCI address (0000:3b:00.0)")
    flag(r, "--state-dir", default="/var/lib/fleethealth", help="the collector's --state-dir (its nvml.pause)")
    flag(r, "--nvml-pause-file", default=None, help="the collector's pause file (default STATE_DIR/nvml.pause)")
    flag(r, "--wait", type=float, default=60.0, metavar="S", help="seconds to wait for the collector to let go")
    flag(r, "--reset-command", default="nvidia-smi -r -i {gpu}",
         help="the reset, split like a shell would (no shell runs it); {gpu} is the GPU id")
    flag(r, "--reset-timeout", type=float, default=300.0, metavar="S", help="seconds the reset may take")
    r.set_defaults(func=run_reset_gpu)
    p = sub.add_parser("collect", help="run the per-host collector daemon", description=COLLECT_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    flag(p, "--simulate", action="store_true", help="use the simulated NVML and a built-in simulated host tree")
    flag(p, "--once", action="store_true", help="take one sample, deliver it, exit")
    flag(p, "--sink", default=None, help="kafka | kafka:HOST:PORT | stdout | jsonl:PATH (required unless --once; "
         "Kafka: with the config's [kafka] bootstrap, client_id, compression and security (SASL/TLS) settings)")
    flag(p, "--identity-key", metavar="FILE", help="this host's key (fleethealth identity-key HOST, hex, mode 600): "
         "every Kafka record is signed with it, for detect --identity-secret")
    kafka_client_flag(p)
    kafka_wire_flag(p)
    flag(p, "--topic", default="fleet.telemetry.v1", help="Kafka / JSONL topic for samples")
    flag(p, "--interval", type=float, default=10.0, help=f"seconds between polls (at least {MIN_INTERVAL:g})")
    flag(p, "--jitter", type=float, default=0.0, help="random extra delay per poll, 0..S seconds")
    flag(p, "--polls", type=int, default=0, help="stop after this many polls (0 = run until SIGTERM)")
    flag(p, "--drain-timeout", type=float, default=60.0, metavar="S",
         help="on stop, keep sending what is spooled for up to S seconds while the sink takes it")
    flag(p, "--host", default=socket.gethostname(), help="host name in samples (the Kafka key)")
    flag(p, "--cluster", default="default", help="cluster name in samples")
    flag(p, "--rack", default="", help="rack name in samples")
    flag(p, "--expected-gpus", type=int, default=0, help="GPUs this host should have (0 = do not check)")
    flag(p, "--sysfs-root", default=None, help="sysfs root to read (default /sys; a fixture tree in tests)")
    flag(p, "--proc-root", default=None, help="procfs root for boot_id and btime (default /proc)")
    flag(p, "--kmsg-file", default=None, help="kernel log to follow: /dev/kmsg (default), a log file, or 'journal' "
         "(journalctl -k -f, for hosts where /dev/kmsg cannot be read)")
    flag(p, "--state-dir", default=None, help="sequence number, kernel-log position (default /var/lib/fleethealth)")
    flag(p, "--spool-dir", default=None, help="on-disk spool (default STATE_DIR/spool)")
    flag(p, "--spool-max-mb", type=float, default=256.0, help="spool bound; past it the oldest samples drop")
    flag(p, "--nvml-timeout", type=float, default=2.0, help="deadline for one GPU's NVML reads, seconds")
    flag(p, "--exporter-port", type=int, default=DEFAULT_PORT, help="Prometheus exporter port (0 disables)")
    flag(p, "--exporter-address", default=DEFAULT_ADDRESS,
         help="address the exporter binds: 127.0.0.1 (this host only), 0.0.0.0 / :: (every interface, "
              "for a central Prometheus), or one interface's address")
    p.add_argument("--source", action="append", default=[], metavar="KIND=URL",
                   help="scrape a local exporter instead of a builtin reader, repeatable: dcgm-exporter=URL "
                        "(GPUs, instead of NVML), node-exporter=URL (InfiniBand ports, EDAC, boot id, instead "
                        "of the sysfs readers) [env: FLEETHEALTH_SOURCE, comma-separated]")
    flag(p, "--scrape-timeout", type=float, default=5.0, help="deadline of one --source scrape, seconds")
    flag(p, "--sim-gpus", type=int, default=8, help="GPUs on the simulated host")
    flag(p, "--sim-seed", type=int, default=0, help="seed of the simulated host")
    p.add_argument("--inject", action="append", default=[], metavar="MODE[@GPU]",
                   help="with --simulate: inject a failure mode (vocabulary label) on GPU N (0 by default; "
                        "IB port N for net_*) before the first poll; repeatable "
                        "[env: FLEETHEALTH_INJECT, comma-separated]")
    p.set_defaults(func=run_collect)


def _sink(spec: str, topic: str, config: str | None = None, identity_key: str | None = None,
          kafka_client: str | None = None, kafka_wire: str | None = None) -> Any:
    from collectors.sinks import JsonlSink, KafkaSink, StdoutSink

    if identity_key and not (spec == "kafka" or spec.startswith("kafka:")):
        raise UserError("--identity-key signs Kafka records (headers): use it with --sink kafka")
    wire = _wire(spec, kafka_wire, config)

    if spec == "stdout":
        return StdoutSink()
    if spec.startswith("jsonl:"):
        if not spec[6:]:
            raise UserError("--sink jsonl: needs a path, e.g. jsonl:out/telemetry.jsonl")
        return JsonlSink(spec[6:], topic)
    if spec == "kafka" or spec.startswith("kafka:"):
        from fleethealth.config import kafka_client as choose_client
        from fleethealth.config import kafka_settings, load_config
        from fleethealth.identity import read_key_file

        cfg = load_config(config)
        ks = kafka_settings(cfg)
        bootstrap = spec[6:] if spec.startswith("kafka:") else ks.bootstrap
        key = read_key_file(identity_key, "--identity-key") if identity_key else None
        return KafkaSink(bootstrap, topic, identity_key=key, security=ks.security, compression=ks.compression,
                         client_id=f"{ks.client_id}-collector", client=choose_client(kafka_client, cfg),
                         wire=wire)
    raise UserError(f"unknown --sink {spec!r}: use kafka[:HOST:PORT], stdout or jsonl:PATH")


def _wire(spec: str, kafka_wire: str | None, config: str | None) -> str:
    """The sink's encoding, checked before anything starts: --kafka-wire / [kafka].wire on Kafka,
    JSON elsewhere (a --kafka-wire there does nothing: an error)."""
    if not (spec == "kafka" or spec.startswith("kafka:")):
        if kafka_wire:
            raise UserError(f"--kafka-wire {kafka_wire} (or FLEETHEALTH_KAFKA_WIRE) sets the encoding on Kafka; "
                            "stdout and JSONL sinks always write JSON: drop it, or use --sink kafka")
        return "json"
    from fleethealth.config import kafka_wire as choose_wire
    from fleethealth.config import load_config

    return choose_wire(kafka_wire, load_config(config))


def _inject(args: argparse.Namespace, nvml: Any, sys_root: Path, kmsg: Path) -> None:
    from simulator import inject

    specs = [*args.inject, os.environ.get("FLEETHEALTH_INJECT", "")]
    for inj in inject.parse(specs, args.sim_gpus):
        inject.apply([inj], nvml, sys_root, kmsg)
        log.info("injected %s on %s %d", inj.mode, inject.component_kind(inj.mode), inj.gpu)


def run_reset_gpu(args: argparse.Namespace) -> int:
    from fleethealth.nvml_pause import NvmlPauseError, nvml_paused

    if not _GPU_ID.match(args.gpu):
        raise UserError(f"{args.gpu!r} is not a GPU index, a GPU-UUID or a PCI address")
    try:
        argv = [a.replace("{gpu}", args.gpu) for a in shlex.split(args.reset_command)]
    except ValueError as exc:
        raise UserError(f"--reset-command: {exc}") from exc
    if not argv:
        raise UserError("--reset-command is empty")
    pause = args.nvml_pause_file or str(Path(args.state_dir) / "nvml.pause")
    try:
        with nvml_paused(pause, wait_s=args.wait, owner=f"reset-gpu {args.gpu}"):
            try:
                p = subprocess.run(argv, capture_output=True, text=True, timeout=args.reset_timeout, check=False)
            except FileNotFoundError:
                print(f"reset-gpu {args.gpu}: command not found: {argv[0]}")
                return 1
            except subprocess.TimeoutExpired:
                print(f"reset-gpu {args.gpu}: {argv[0]} did not finish in {args.reset_timeout:g}s")
                return 1
    except NvmlPauseError as exc:
        print(f"reset-gpu {args.gpu}: not reset: {exc}")
        return 1
    words = " ".join((p.stdout.strip() + " " + p.stderr.strip()).split())[:500]
    print(f"reset-gpu {args.gpu}: {argv[0]} exit {p.returncode} (NVML released around it){': ' + words if words else ''}")
    return 0 if p.returncode == 0 else 1


def run_collect(args: argparse.Namespace) -> int:
    from collectors.daemon import Collector, CollectorSettings
    from collectors.exporter import SampleMetrics, load_catalog, start_exporter

    if args.interval < MIN_INTERVAL:
        raise UserError(f"--interval {args.interval:g}: must be at least {MIN_INTERVAL:g} s")
    sink_spec = args.sink or ("stdout" if args.once else None)
    if sink_spec is None:
        raise UserError("collect needs a sink: --sink kafka[:HOST:PORT] | jsonl:PATH | stdout (or FLEETHEALTH_SINK); "
                        "it does not write samples to stdout (the journal) unless told to")
    _wire(sink_spec, args.kafka_wire, getattr(args, "config", None))  # a bad value: one line, nothing started
    state_dir = args.state_dir
    made_tmp = False
    sysfs, proc, kmsg = args.sysfs_root, args.proc_root, args.kmsg_file
    nvml: Any
    specs = _source_specs(args)
    if args.simulate and specs:
        raise UserError("--source scrapes a real exporter; it does not combine with --simulate")
    sources = [spec for spec in specs if spec[0] == "dcgm-exporter"]
    if args.simulate:
        from simulator.host import build_sim_host
        from simulator.nvml import SimNvml

        if not state_dir:
            state_dir, made_tmp = tempfile.mkdtemp(prefix="fleethealth-sim-"), True
        paths = build_sim_host(Path(state_dir) / "simhost", n_gpus=args.sim_gpus)
        sysfs, proc, kmsg = sysfs or str(paths["sys"]), proc or str(paths["proc"]), kmsg or str(paths["kmsg"])
        nvml = SimNvml(args.sim_gpus, seed=args.sim_seed, host=args.host)
        expected = args.expected_gpus or args.sim_gpus
        _inject(args, nvml, paths["sys"], paths["kmsg"])
    elif sources:
        nvml, expected = None, args.expected_gpus  # dcgm-exporter stands in for NVML
        if args.inject or os.environ.get("FLEETHEALTH_INJECT"):
            raise UserError("--inject needs --simulate (faults go into the simulated host)")
    else:
        if args.inject or os.environ.get("FLEETHEALTH_INJECT"):
            raise UserError("--inject needs --simulate (faults go into the simulated host)")
        try:
            import pynvml
        except ImportError as exc:
            raise ServiceUnavailable("pynvml (nvidia-ml-py) is not installed; use --simulate") from exc
        nvml, expected = pynvml, args.expected_gpus
    settings = CollectorSettings(
        host=args.host, cluster=args.cluster, rack=args.rack, expected_gpus=expected, interval=args.interval,
        jitter=args.jitter, sysfs_root=sysfs or "/sys", proc_root=proc or "/proc", kmsg_path=kmsg or "/dev/kmsg",
        state_dir=state_dir or "/var/lib/fleethealth", spool_dir=args.spool_dir,
        spool_max_bytes=int(args.spool_max_mb * (1 << 20)), call_timeout=args.nvml_timeout,
    )
    try:
        Path(settings.state_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create --state-dir {settings.state_dir}: {exc}") from exc
    if not args.simulate:
        _warn_missing_paths(settings)
    metrics = SampleMetrics(load_catalog())
    server = start_exporter(metrics, 0 if args.once else args.exporter_port, args.exporter_address)
    from collectors.prom_source import PromScrapeSource

    scrapers = [PromScrapeSource(kind, url, timeout=args.scrape_timeout, state_dir=settings.state_dir)
                for kind, url in specs]
    try:
        sink = _sink(sink_spec, args.topic, getattr(args, "config", None), args.identity_key, args.kafka_client,
                     args.kafka_wire)
    except BaseException:
        if server is not None:
            server.shutdown()
        raise
    collector = Collector(settings, sink=sink, nvml=nvml, on_sample=metrics.update, sources=scrapers)
    metrics.stats_fn = lambda: _stats(collector)
    if server is not None:
        log.info("exporter listening", extra={"address": args.exporter_address, "port": args.exporter_port})
    stop = threading.Event()

    def _term(signum: int, _frame: Any) -> None:
        log.info("stopping on signal", extra={"signal": signum})
        stop.set()

    old = signal.signal(signal.SIGTERM, _term)
    try:
        if args.simulate:
            sim = nvml

            def _on_sample(s: Any) -> None:
                metrics.update(s)
                sim.tick()

            collector.on_sample = _on_sample
        collector.run(stop, max_polls=1 if args.once else (args.polls or None))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
        ok = collector.drain(timeout=args.drain_timeout)
        left = collector.pending()
        collector.close(flush_timeout=0)
        if server is not None:
            server.shutdown()
    if not ok:
        log.warning("samples left in the spool; they are sent on the next start", extra={"spooled": left})
    log.info("collector stopped", extra={"polls": collector.stats.polls, "next_seq": collector.seq})
    if made_tmp and ok:
        shutil.rmtree(state_dir, ignore_errors=True)  # a --simulate run without --state-dir leaves nothing behind
    return 0 if ok or not args.once else 3


def _warn_missing_paths(s: Any) -> None:
    """A wrong --kmsg-file / --sysfs-root / --proc-root reads nothing, silently, poll after poll:
    say so once at start."""
    if s.kmsg_path and s.kmsg_path != "journal" and not os.path.exists(s.kmsg_path):
        log.warning("kernel log %s does not exist: no kernel-log events will be collected "
                    "(--kmsg-file PATH or 'journal')", s.kmsg_path)
    if not os.path.isdir(os.path.join(s.sysfs_root, "bus", "pci", "devices")):
        log.warning("%s has no bus/pci/devices: no PCIe AER/link data and no GPU cross-check (--sysfs-root)",
                    s.sysfs_root)
    if not os.path.exists(os.path.join(s.proc_root, "sys", "kernel", "random", "boot_id")):
        log.warning("%s has no sys/kernel/random/boot_id: reboots will not be recognised (--proc-root)", s.proc_root)


def _source_specs(args: argparse.Namespace) -> list[tuple[str, str]]:
    from collectors.prom_source import parse_source_spec

    raw = [*args.source, *(x for x in os.environ.get("FLEETHEALTH_SOURCE", "").split(",") if x.strip())]
    out = []
    for spec in raw:
        try:
            out.append(parse_source_spec(spec.strip()))
        except ValueError as exc:
            raise UserError(str(exc)) from None
    kinds = [k for k, _ in out]
    if len(kinds) != len(set(kinds)):
        raise UserError("--source: one dcgm-exporter and one node-exporter at most")
    return out


def _stats(c: Any) -> dict[str, Any]:
    s = c.stats
    return {
        "last_poll_seconds": s.last_poll_seconds, "source_errors": dict(s.source_errors),
        "spool_depth": c.pending(), "spool_dropped": c.spool.dropped + s.memory_dropped,
        "spool_corrupt": c.spool.corrupt, "spool_write_errors": c.spool.write_errors + s.state_write_errors, "polls": s.polls,
        "samples_sent": s.samples_sent, "last_sample_ts": s.last_sample_ts,
    }
