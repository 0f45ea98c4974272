"""Helpers for subcommand modules: every flag has an environment variable."""

from __future__ import annotations

import argparse
import os
from typing import Any


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
            kw["default"] = raw.lower() in ("1", "true", "yes", "on")
        elif action in (None, "store"):
            typ = kw.get("type", str)
            kw["default"] = typ(raw) if callable(typ) else raw
    help_text = kw.get("help", "")
    if help_text is not argparse.SUPPRESS:
        d = kw.get("default")
        extra = f" [env: {var}" + (f"; default: {d}" if d not in (None, False, "") else "") + "]"
        kw["help"] = (help_text or "") + extra
    return parser.add_argument(*names, **kw)
