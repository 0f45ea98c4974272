"""The ``fleethealth`` command. The only module that exits.

Each subcommand family has a module in ``fleetcli.commands`` (plus ``fleetcli.pipeline`` for
``run`` / ``demo`` / ``fleet-metrics``) with ``register(subparsers)``; handlers take the parsed args
and return an exit code. ``fleetcli`` is the composition root: the only package that imports every
part."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from fleethealth import __version__
from fleethealth.cliutil import EnvValueError, flag
from fleethealth.errors import FleetHealthError
from fleethealth.log import setup_logging

DESCRIPTION = """\
fleethealth finds failing GPUs, host memory, PCIe links and network cables in a GPU training
cluster within seconds, names the failure mode, drains the node before the scheduler puts work
on it again, and opens a repair ticket that carries the evidence.

  collectors (NVML, sysfs, kernel log) -> fleet.telemetry.v1 -> detectors (rules + ML)
    -> fleet.incidents.v1 -> remediation (guards, Slurm/Kubernetes drain, tickets) -> fleet.actions.v1

Run the whole pipeline on one machine with `fleethealth run`; at fleet scale run `collect` on
every GPU host and `detect` / `remediate` as Kafka consumer groups. See README.md.
"""

# Every subcommand: (name, the module that registers it, its one-line help). Order = order in --help.
# Only the module of the command being run is imported, so `fleethealth --help` and `--version` do
# not pay for the parsers, the engine, scikit-learn or the Kafka clients (issue 18; the table and the
# modules' own registrations are held together by tests/spine/test_startup_imports.py).
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("collect", "fleetcli.commands.collect", "run the per-host collector daemon"),
    ("reset-gpu", "fleetcli.commands.collect", "on a GPU host: reset a GPU with NVML released by the collector"),
    ("simulate", "fleetcli.commands.simulate", "write a labelled synthetic fleet recording"),
    ("replay", "fleetcli.commands.simulate", "stream a recording into the bus (and score it)"),
    ("diagnose", "fleetcli.commands.diagnose", "offline doctor for captured tool output and logs"),
    ("train", "fleetcli.commands.train", "fit the ML detectors on simulated labelled fleets"),
    ("detect", "fleetcli.commands.detect", "the streaming detectors (a Kafka consumer group)"),
    ("identity-key", "fleetcli.commands.detect", "print a host's telemetry signing key (from the operator secret)"),
    ("remediate", "fleetcli.commands.remediate", "act on incidents: drain, reset/reboot requests, repair tickets"),
    ("tickets", "fleetcli.commands.remediate", "the repair-ticket store: list, show, close"),
    ("dashboards", "fleetcli.commands.dashboards", "build the Grafana dashboards from code"),
    ("run", "fleetcli.pipeline", "the whole pipeline in one process (simulated fleet or replay)"),
    ("demo", "fleetcli.pipeline", "`run` on the shipped 64-host smoke set, scored, with an HTML report"),
    ("fleet-metrics", "fleetcli.pipeline", "fleet-state and pipeline-health metrics from Kafka (port 9403)"),
    ("import", "fleetcli.commands.prom_import", "import telemetry history from another system (Prometheus)"),
)
PLUGINS = tuple(dict.fromkeys(mod for _, mod, _ in COMMANDS))
_GLOBAL_WITH_VALUE = {"--config", "--log-level", "--log-format"}


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in argv (the first word after the global options), or None."""
    it = iter(argv)
    for a in it:
        if a == "--":
            return next(it, None)
        if a in _GLOBAL_WITH_VALUE:
            next(it, None)
        elif not a.startswith("-"):
            return a
    return None


# The errors a user can act on: one line and an exit code, never a traceback. Named, not imported:
# an exception of one of these classes can only come from a module already imported, so the CLI
# does not load the bus, the config reader (tomllib), the schema or the Xid table just to be able
# to catch their errors (start-up of --help / --version, issue 18).
USER_ERRORS: tuple[tuple[str, str], ...] = (
    ("fleethealth.config", "ConfigError"), ("fleethealth.schema", "ContractError"), ("fleethealth.bus", "BusError"),
    ("fleethealth.xid", "XidTableError"), ("fleethealth.taxonomy", "UnknownFailureMode"),
)


def is_user_error(exc: BaseException) -> bool:
    if isinstance(exc, FleetHealthError):
        return True
    for module, name in USER_ERRORS:
        m = sys.modules.get(module)
        if m is not None and isinstance(exc, getattr(m, name)):
            return True
    return False


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``argv``, only the named command's module is imported (the others
    appear in --help from COMMANDS, without their flags)."""
    p = argparse.ArgumentParser(
        prog="fleethealth", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"fleethealth {__version__}")
    flag(p, "--config", metavar="FILE", help="TOML config file, validated at start-up")
    flag(p, "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log level")
    flag(p, "--log-format", default="text", choices=["json", "text"], help="structured JSON logs or text")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    wanted = _command_of(argv) if argv is not None else None
    target = next((mod for name, mod, _ in COMMANDS if name == wanted), None) if argv is not None else None
    for mod in PLUGINS:
        if argv is not None and mod != target:
            continue
        importlib.import_module(mod).register(sub)
    if argv is not None:
        for name, mod, help_ in COMMANDS:
            if mod != target:
                sub.add_parser(name, help=help_, add_help=False)  # listed in --help; run imports it
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(argv)
    except EnvValueError as exc:
        print(f"fleethealth: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    setup_logging(args.log_level, args.log_format)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if is_user_error(exc):
            print(f"fleethealth {args.command}: error: {exc}", file=sys.stderr)
            return int(getattr(exc, "exit_code", 2))
        logging.getLogger("fleethealth").exception("unexpected failure in %s", args.command)
        return 70


if __name__ == "__main__":
    sys.exit(main())
