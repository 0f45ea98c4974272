"""Shared pytest setup. Service fixtures (kafka_bootstrap, prometheus_url, slurm_conf, ...) live in
tests/services.py so that this file stays small; add other shared fixtures below."""

from tests.services import *  # noqa: F403
