"""Fixtures for the fault drills (tests/drills)."""

from tests.drills.private_kafka import private_kafka  # noqa: F401
