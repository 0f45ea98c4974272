"""Operator hooks: GPU reset and reboot requests (and alerts) are handed to a command or webhook
the config names; fleethealth never resets or reboots anything itself.

A command is an argv template run without a shell, with a timeout; exit 0 = accepted. A webhook
gets the action as JSON; 2xx = accepted. Either way the outcome and the hook's own words (stderr,
HTTP status) are returned for the audit record.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from typing import Any

import requests

from remediation.settings import HookSettings


@dataclass(frozen=True, slots=True)
class HookResult:
    ok: bool
    configured: bool
    detail: str


class OperatorHooks:
    def __init__(self, settings: HookSettings) -> None:
        self.s = settings

    def configured(self, name: str) -> bool:
        return getattr(self.s, name, None) is not None

    def call(self, name: str, fields: dict[str, str], payload: dict[str, Any]) -> HookResult:
        spec = getattr(self.s, name, None)
        if spec is None:
            return HookResult(False, False, f"no operator hook configured for {name} ([remediation.hooks].{name})")
        if isinstance(spec, str):
            try:
                r = requests.post(spec, data=json.dumps(payload, sort_keys=True), timeout=self.s.timeout_s,
                                  headers={"Content-Type": "application/json"})
            except requests.RequestException as exc:
                return HookResult(False, True, f"webhook {spec}: {type(exc).__name__}: {exc}"[:1000])
            ok = 200 <= r.status_code < 300
            return HookResult(ok, True, f"webhook {spec}: HTTP {r.status_code} {r.text[:300]}")
        try:
            argv = [a.format(**fields) for a in spec]
        except (KeyError, IndexError, ValueError) as exc:
            return HookResult(False, True, f"hook {name}: bad template {spec!r}: {exc}")
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=self.s.timeout_s, check=False)
        except FileNotFoundError:
            return HookResult(False, True, f"hook {name}: command not found: {argv[0]}")
        except subprocess.TimeoutExpired:
            return HookResult(False, True, f"hook {name}: {argv[0]} timed out after {self.s.timeout_s:.0f}s")
        words = (p.stdout.strip() + (" | stderr: " + p.stderr.strip() if p.stderr.strip() else ""))[:1000]
        return HookResult(p.returncode == 0, True, f"{argv[0]} exit {p.returncode}: {words}")
