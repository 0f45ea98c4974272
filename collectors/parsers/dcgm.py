"""``dcgmi diag`` tables, ``nv-hostengine`` health log lines, nv-fabricmanager logs (pure).

``dcgmi diag`` wraps cell text at a fixed width (splitting words); cells are re-joined before
matching. Diag results are treated as *inconclusive* evidence: a PASS does not prove NVLink health
and a PCIe-test FAIL that only complains about NVLink links on a PCIe card is not a link fault, so
they come back as facts for the doctor to weigh, not as verdicts.
"""

from __future__ import annotations

import re

from collectors.parsers.base import Fact, Parsed, ParseError, new_parsed

_ROW = re.compile(r"^\|\s?(?P<name>[^|]*?)\s*\|\s?(?P<val>[^|]*?)\s*\|?\s*$")


def parse_diag(text: str) -> Parsed:
    out = new_parsed("dcgmi-diag")
    rows: list[list[str]] = []
    for line in text.splitlines():
        m = _ROW.match(line.rstrip())
        if m is None or line.startswith("+") or line.startswith("|---") or line.startswith("|=="):
            continue
        name, val = m["name"].strip(), m["val"]
        if name:
            rows.append([name, val.strip()])
        elif rows:
            rows[-1][1] += val.strip() if rows[-1][1].endswith(("-", "/")) else val  # keep wrapped words whole
    if not rows:
        raise ParseError("dcgmi-diag", "no '| test | result |' rows")
    for name, val in rows:
        low = val.lower()
        if name in ("Warning", "Info"):
            out.facts.append(Fact("diag_note", name.lower(), {"text": val}, f"| {name} | {val}"))
        elif "fail" in low:
            out.facts.append(Fact("diag_fail", name, {"text": val}, f"| {name} | {val}"))
        elif "pass" in low:
            out.facts.append(Fact("diag_pass", name, {"text": val}, f"| {name} | {val}"))
    return out


_HEALTH = re.compile(r"\[\[Health\]\] Detected an? (?P<level>\w+) in health system (?P<system>[\w ]+?):\s*"
                     r"'?(?P<msg>.*)$")
_HEALTH_GPU = re.compile(r"\bGPU (?P<gpu>\d+)\b")


def parse_hostengine(text: str) -> Parsed:
    out = new_parsed("dcgm-hostengine-log")
    for line in text.splitlines():
        m = _HEALTH.search(line)
        if m is None:
            continue
        g = _HEALTH_GPU.search(m["msg"])
        out.facts.append(Fact("dcgm_health", f"gpu{g['gpu']}" if g else "gpu", {
            "level": m["level"].upper(), "system": m["system"].strip().lower(), "msg": m["msg"]}, line.strip()))
    if not out.facts:
        raise ParseError("dcgm-hostengine-log", "no '[[Health]] Detected ...' line")
    return out


_FM = re.compile(r"^\[(?P<ts>[^\]]+)\] \[(?P<level>[A-Z]+)\] \[tid \d+\] (?P<msg>.*)$")


def parse_fabricmanager(text: str) -> Parsed:
    out = new_parsed("fabricmanager-log")
    seen = 0
    for line in text.splitlines():
        m = _FM.match(line)
        if m is None:
            continue
        seen += 1
        if m["level"] in ("ERROR", "FATAL") and re.search(r"fatal|SXid|NVLink|training failed|degraded",
                                                          m["msg"], re.I):
            out.facts.append(Fact("fm_error", "nvswitch", {"level": m["level"], "msg": m["msg"]}, line.strip()))
    if not seen:
        raise ParseError("fabricmanager-log", "no '[date] [LEVEL] [tid N]' line")
    return out
