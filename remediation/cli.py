"""Subcommands of the remediation part (registered into the fleethealth command)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:  # sub: argparse._SubParsersAction
    _ = argparse  # subcommands are added here by the remediation part
