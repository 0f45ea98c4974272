"""Subcommands of the detectors part (registered into the fleethealth command)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:  # sub: argparse._SubParsersAction
    _ = argparse  # subcommands are added here by the detectors part
    __import__("detectors.diagnose", fromlist=["register_diagnose"]).register_diagnose(sub)
