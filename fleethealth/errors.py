"""Typed errors. Library code raises these; only ``fleetcli.cli`` turns them into exit codes."""

from __future__ import annotations


class FleetHealthError(Exception):
    """Base for errors a user can act on (bad input, bad config, unreachable service)."""

    exit_code = 2


class UserError(FleetHealthError, ValueError):
    """Bad arguments or input; the message says what to change."""


class ServiceUnavailable(FleetHealthError, RuntimeError):
    """A service the command needs (Kafka, Prometheus, Slurm) does not answer."""

    exit_code = 3
