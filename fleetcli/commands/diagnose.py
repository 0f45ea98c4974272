"""``fleethealth diagnose PATH...``: the offline doctor (:mod:`detectors.diagnose.doctor`) as a subcommand."""

from __future__ import annotations

from typing import Any

from fleethealth.cliutil import flag


def _handler(args: Any) -> int:
    from detectors.diagnose.doctor import run  # here, not at registration: `--help` stays light

    return run(args.paths, as_json=args.json, host=args.host, rules_path=args.rules)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "diagnose", help="offline doctor for captured tool output and logs",
        description="Read captured artifacts (nvidia-smi -q / -q -x / table, nvidia-smi nvlink, dcgmi, "
                    "dcgm-exporter scrapes, kernel logs, mcelog / ras-mc-ctl, ibstat / ibstatus / perfquery / "
                    "ibqueryerrors / ibnetdiscover, ethtool, lspci -vvv, sysfs snapshot folders), detect each "
                    "format from its content, and print every finding: failure mode, component, evidence "
                    "line, NVIDIA's bucket where a Xid is involved, recommended action. A file holding several "
                    "captures (a bug report, a pasted session) is split; text in no known format is read for "
                    "kernel lines; gzip is detected by content; a folder is walked and each file reported; "
                    "'-' reads standard input. Exit 0 healthy, 1 findings, 2 an input could not be read, "
                    "3 no evidence (nothing in the input could show a fault: not the same as healthy).")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="capture files (gzip or not), folders of them, sysfs snapshot folders, or - for stdin")
    flag(p, "--json", action="store_true", help="one JSON object per finding per line")
    flag(p, "--host", metavar="NAME", help="host name to put in findings (default: unknown)")
    flag(p, "--rules", metavar="FILE", env="FLEETHEALTH_DIAGNOSE_RULES",
         help="rule file or folder of rule files (default: the shipped detectors/engine/rules/, the streaming "
              "detectors' own rules, applied to the capture in snapshot mode)")
    p.set_defaults(func=_handler)
