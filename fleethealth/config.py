"""Configuration files (TOML), validated at start-up.

A config file is a table of sections (``[kafka]``, ``[collector]``, ``[detector]``, ``[remediation]``
...). Each part of the pipeline owns a msgspec struct for its section and reads it with
:func:`section`; any fault names the file and the key (``fleethealth.toml: [collector].interval_s:
Expected `float`, got `str```). The file is chosen by ``--config`` or ``FLEETHEALTH_CONFIG``.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from fleethealth.bus import Bus, InProcessBus, JsonlBus
from fleethealth.cliutil import KAFKA_CLIENTS, WIRE_FORMATS

T = TypeVar("T")
KNOWN_SECTIONS = frozenset({
    "fleet", "kafka", "collector", "exporter", "simulate", "detector", "remediation", "slurm",
    "kubernetes", "tickets", "guards", "webhook", "dashboards", "run", "common_cause", "jobs", "verify",
})


class ConfigError(ValueError):
    """A config file or value that cannot be used; the message names file and key."""


class Config:
    def __init__(self, raw: dict[str, Any], path: Path | None) -> None:
        self.raw = raw
        self.path = path

    @property
    def name(self) -> str:
        return str(self.path) if self.path else "<defaults>"

    def section(self, name: str, typ: type[T]) -> T:
        return section(self, name, typ)


def load_config(path: str | Path | None = None) -> Config:
    """Read and check a config file. ``None`` -> ``$FLEETHEALTH_CONFIG`` or built-in defaults."""
    if path is None:
        path = os.environ.get("FLEETHEALTH_CONFIG") or None
    if path is None:
        return Config({}, None)
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text (UTF-8) TOML file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the config file: {exc.strerror or exc}") from None
    unknown = set(raw) - KNOWN_SECTIONS
    if unknown:
        raise ConfigError(f"{p}: unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(KNOWN_SECTIONS))}")
    for k, v in raw.items():
        if not isinstance(v, dict):
            raise ConfigError(f"{p}: [{k}] must be a table, not a {type(v).__name__}")
    return Config(raw, p)


def section(cfg: Config, name: str, typ: type[T]) -> T:
    data = cfg.raw.get(name, {})
    try:
        return msgspec.convert(data, typ, strict=False)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        where = ""
        if " - at `$" in msg:
            msg, _, at = msg.rpartition(" - at `$")
            where = at.rstrip("`")
        raise ConfigError(f"{cfg.name}: [{name}]{where}: {msg}") from None


class KafkaSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    bootstrap: str = "127.0.0.1:9092"
    client_id: str = "fleethealth"
    compression: str | None = "auto"  # lz4 when installed, else gzip; "none" or null for none
    security: dict[str, Any] = {}
    client: str = ""  # kafka-python | confluent; empty: --kafka-client / FLEETHEALTH_KAFKA_CLIENT / the default
    wire: str = ""  # msgpack | json: how samples are encoded on Kafka; empty: --kafka-wire / FLEETHEALTH_KAFKA_WIRE / the default


DEFAULT_KAFKA_CLIENT = "confluent"  # by the figures in docs/scaling.md (benchmarks/bench_kafka_capacity.py)


def kafka_client(name: str | None, cfg: Config | None = None) -> str:
    """The Kafka client to use: ``name`` (the --kafka-client flag, which carries its env var), else
    ``[kafka].client``, else the default."""
    chosen = name or section(cfg or Config({}, None), "kafka", KafkaSettings).client or DEFAULT_KAFKA_CLIENT
    if chosen not in KAFKA_CLIENTS:
        raise ConfigError(f"Kafka client {chosen!r}: use one of {', '.join(KAFKA_CLIENTS)}")
    return chosen


# msgpack: a sample is 10.9 KB instead of 13.8 KB of JSON, and the detect worker spends 13-40 us less
# on it (benchmarks/bench_kafka_capacity.py has the rows side by side; docs/telemetry.md). JSON stays the
# format of stdout, JSONL files and recordings (read by people); consumers read both.
DEFAULT_KAFKA_WIRE = "msgpack"


def kafka_wire(name: str | None, cfg: Config | None = None) -> str:
    """How telemetry is encoded on Kafka: ``name`` (the --kafka-wire flag, which carries its env
    var), else ``[kafka].wire``, else the default. Only the producer's choice: a consumer decides
    by the bytes it decodes, never by a claim in a header (fleethealth.schema)."""
    chosen = name or section(cfg or Config({}, None), "kafka", KafkaSettings).wire or DEFAULT_KAFKA_WIRE
    if chosen not in WIRE_FORMATS:
        where = f"{cfg.name}: [kafka].wire" if cfg is not None and not name else "Kafka wire format"
        raise ConfigError(f"{where} {chosen!r}: use one of {', '.join(WIRE_FORMATS)}")
    return chosen


def kafka_bus(bootstrap: str, client: str | None = None, cfg: Config | None = None, **kw: Any) -> Any:
    """A Kafka bus over the chosen client (:func:`kafka_client`); ``kw`` as KafkaBus takes them."""
    chosen = kafka_client(client, cfg)
    if chosen == "confluent":
        try:
            import confluent_kafka  # noqa: F401
        except ImportError as exc:
            if client or (cfg is not None and section(cfg, "kafka", KafkaSettings).client):
                raise ConfigError(f"Kafka client confluent: confluent-kafka is not installed ({exc}); "
                                  "pip install confluent-kafka, or use --kafka-client kafka-python") from None
            # the default, in an environment installed before it became a dependency
            import logging

            logging.getLogger(__name__).warning("confluent-kafka is not installed (a dependency: pip install -e .); "
                                                "using kafka-python")
            chosen = "kafka-python"
    if chosen == "confluent":
        from fleethealth.kafka_confluent import ConfluentBus

        return ConfluentBus(bootstrap, **kw)
    from fleethealth.kafka_bus import KafkaBus

    return KafkaBus(bootstrap, **kw)


def kafka_settings(cfg: Config | None = None) -> KafkaSettings:
    s = section(cfg or Config({}, None), "kafka", KafkaSettings)
    env = os.environ.get("FLEETHEALTH_KAFKA")
    if env:
        s.bootstrap = env
    return s


def open_bus(spec: str, cfg: Config | None = None, client: str | None = None, *,
             delivery_reports: str = "each") -> Bus:
    """``memory`` | ``jsonl:PATH`` | ``kafka`` | ``kafka:HOST:PORT[,HOST:PORT]`` (over ``client``,
    see :func:`kafka_client`; ``delivery_reports`` as :data:`fleethealth.bus.DELIVERY_REPORTS` says)."""
    if spec in ("memory", "inprocess", "embedded"):
        return InProcessBus()
    if spec.startswith("jsonl:"):
        path = spec[len("jsonl:") :]
        if not path:
            raise ConfigError("bus spec 'jsonl:' needs a path, e.g. jsonl:out/telemetry.jsonl")
        return JsonlBus(Path(path))
    if spec == "kafka" or spec.startswith("kafka:"):
        ks = kafka_settings(cfg)
        bootstrap = spec[len("kafka:") :] if spec.startswith("kafka:") else ks.bootstrap
        bus: Bus = kafka_bus(bootstrap, client, cfg, client_id=ks.client_id, compression=ks.compression,
                             security=ks.security, delivery_reports=delivery_reports)
        return bus
    raise ConfigError(f"unknown bus {spec!r}: use memory, jsonl:PATH or kafka[:HOST:PORT]")
