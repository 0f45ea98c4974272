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
from fleethealth.bus import BusError
from fleethealth.cliutil import flag
from fleethealth.config import ConfigError
from fleethealth.errors import FleetHealthError
from fleethealth.log import setup_logging
from fleethealth.schema import ContractError
from fleethealth.taxonomy import UnknownFailureMode
from fleethealth.xid import XidTableError

DESCRIPTION = """\
fleethealth finds failing GPUs, host memory, PCIe links and network cables in a GPU training
cluster within seconds, names the failure mode, drains the node before the scheduler puts work
on it again, and opens a repair ticket that carries the evidence.

  collectors (NVML, sysfs, kernel log) -> fleet.telemetry.v1 -> detectors (rules + ML)
    -> fleet.incidents.v1 -> remediation (guards, Slurm/Kubernetes drain, tickets) -> fleet.actions.v1

Run the whole pipeline on one machine with `fleethealth run`; at fleet scale run `collect` on
every GPU host and `detect` / `remediate` as Kafka consumer groups. See README.md.
"""

# Parts that add subcommands. Order = order in --help.
PLUGINS = (
    "fleetcli.commands.collect",
    "fleetcli.commands.simulate",
    "fleetcli.commands.diagnose",
    "fleetcli.commands.train",
    "fleetcli.commands.detect",
    "fleetcli.commands.remediate",
    "fleetcli.commands.dashboards",
    "fleetcli.pipeline",
    "fleetcli.commands.prom_import",
)

USER_ERRORS = (ConfigError, ContractError, BusError, XidTableError, UnknownFailureMode, FleetHealthError)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleethealth", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"fleethealth {__version__}")
    flag(p, "--config", metavar="FILE", help="TOML config file, validated at start-up")
    flag(p, "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log level")
    flag(p, "--log-format", default="text", choices=["json", "text"], help="structured JSON logs or text")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for mod in PLUGINS:
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name and mod.startswith(exc.name):
                continue  # that part is not installed in this build
            raise
        module.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    setup_logging(args.log_level, args.log_format)
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        code = getattr(exc, "exit_code", 2)
        print(f"fleethealth {args.command}: error: {exc}", file=sys.stderr)
        return int(code)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception:
        logging.getLogger("fleethealth").exception("unexpected failure in %s", args.command)
        return 70


if __name__ == "__main__":
    sys.exit(main())
