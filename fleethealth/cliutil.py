"""Helpers for subcommand modules: every flag has an environment variable."""

from __future__ import annotations

import argparse
import os
from typing import Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class EnvValueError(ValueError):
    """A ``FLEETHEALTH_*`` variable holds a value its flag cannot take (the CLI prints this one line
    and exits 2, before any command runs: ``--version`` and ``--help`` included)."""


KAFKA_CLIENTS = ("confluent", "kafka-python")  # fleethealth.config.kafka_client chooses among them
WIRE_FORMATS = ("msgpack", "json")  # telemetry encodings on Kafka; fleethealth.config.kafka_wire chooses


def kafka_client_flag(parser: argparse.ArgumentParser | Any) -> argparse.Action:
    """``--kafka-client`` (env FLEETHEALTH_KAFKA_CLIENT) for the commands that talk to Kafka."""
    return flag(parser, "--kafka-client", choices=KAFKA_CLIENTS, default=None,
                help="Kafka client library: confluent (librdkafka; the default) or kafka-python (pure "
                     "Python); else [kafka].client of the config (docs/scaling.md has the figures)")


def kafka_wire_flag(parser: argparse.ArgumentParser | Any) -> argparse.Action:
    """``--kafka-wire`` (env FLEETHEALTH_KAFKA_WIRE) for the commands that publish telemetry to Kafka."""
    return flag(parser, "--kafka-wire", choices=WIRE_FORMATS, default=None,
                help="encoding of the samples published to Kafka: msgpack (the default: 21 %% smaller, "
                     "cheaper to decode) or json; else [kafka].wire of the config. Consumers read both "
                     "(by the bytes, not by a header); stdout and JSONL sinks always write JSON")


def env_name(flag: str) -> str:
    return "FLEETHEALTH_" + flag.lstrip("-").upper().replace("-", "_")


def flag(parser: argparse.ArgumentParser | Any, *names: str, env: str | None = None, **kw: Any) -> argparse.Action:
    """``parser.add_argument`` whose default comes from ``FLEETHEALTH_<FLAG>`` (or ``env``)."""
    long = next((n for n in names if n.startswith("--")), names[0])
    var = env or env_name(long)
    if var in os.environ:
        raw = os.environ[var]
        action = kw.get("action")
        if action == "store_true":
            if raw.strip().lower() not in _TRUE + _FALSE:
                raise EnvValueError(f"{var}={raw!r} is not a yes/no value (use one of 1, true, yes, on, 0, "
                                    "false, no, off), or unset it")
            kw["default"] = raw.strip().lower() in _TRUE
        elif action in (None, "store"):
            typ = kw.get("type", str)
            try:
                value = typ(raw) if callable(typ) else raw
            except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
                raise EnvValueError(f"{var}={raw!r} is not a valid value for {long}: {exc}; fix or unset "
                                    "it") from None
            choices = kw.get("choices")
            if choices is not None and value not in choices:
                raise EnvValueError(f"{var}={raw!r} is not one of {', '.join(map(str, choices))}; fix or "
                                    "unset it")
            kw["default"] = value
    help_text = kw.get("help", "")
    if help_text is not argparse.SUPPRESS:
        d = kw.get("default")
        extra = f" [env: {var}" + (f"; default: {d}" if d not in (None, False, "") else "") + "]"
        kw["help"] = (help_text or "") + extra
    return parser.add_argument(*names, **kw)
