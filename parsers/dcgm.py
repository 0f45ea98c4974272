"""``dcgmi diag`` tables, ``nv-hostengine`` health log lines, nv-fabricmanager logs (pure).

``dcgmi diag`` wraps cell text at a fixed width (splitting words); cells are re-joined before
matching. Diag results are treated as *inconclusive* evidence: a PASS does not prove NVLink health
and a PCIe-test FAIL that only complains about NVLink links on a PCIe card is not a link fault, so
they come back as facts for the doctor to weigh, not as verdicts.
"""

from __future__ import annotations

import json
import re

from parsers.base import Fact, Parsed, ParseError, new_parsed, to_count

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


# ----------------------------------------------------------------------------- dcgmi health
_H_GPU = re.compile(r"^(?:->\s*(?P<a>\d{1,4})|GPU(?: ID)?:?\s*(?P<b>\d{1,4}))$")
_H_SYSTEM = re.compile(r"^(?:->\s*)?(?P<sys>[A-Za-z][\w ]{0,40}?) system:?$", re.I)
_H_INLINE = re.compile(r"^(?P<sys>[A-Za-z][\w ]{0,40}?) system: (?P<level>\w+)$", re.I)
_GOOD = ("healthy", "pass", "ok", "")


def parse_health(text: str) -> Parsed:
    """``dcgmi health -c`` as a table or as JSON (``-j``): the overall verdict and, per GPU and
    health system, the level and the messages DCGM gave (``dcgmi_health`` facts). DCGM's checks are
    known to misreport (NVLink "down" on a PCIe card without a bridge), so these are the tool's
    claims for the rules to weigh, never verdicts."""
    out = new_parsed("dcgmi-health")
    s = text.strip()
    if s.startswith("{"):
        try:
            obj = json.loads(s[: s.rfind("}") + 1])
        except ValueError as exc:
            raise ParseError("dcgmi-health", f"not valid JSON: {exc}") from None
        _health_json(out, obj, [])
    else:
        _health_table(out, text)
    if not out.facts:
        raise ParseError("dcgmi-health", "no 'Overall Health' row or key")
    return out


def _health_table(out: Parsed, text: str) -> None:
    entity, system = "host", ""
    for line in text.splitlines():
        m = _ROW.match(line.rstrip())
        if m is None or line.startswith("+"):
            continue
        left, right = m["name"].strip(), m["val"].strip()
        if left == "Overall Health":
            out.facts.append(Fact("dcgmi_health_overall", "host", {"level": right.upper()}, line.strip()))
            continue
        if (g := _H_GPU.match(left)) is not None:
            entity, system = f"gpu{g['a'] or g['b']}", ""
            continue
        if (y := _H_SYSTEM.match(left)) is not None:
            system = y["sys"].strip().lower()
            _health_fact(out, entity, system, right, "", line)
            continue
        if not left and right:
            if (y := _H_INLINE.match(right)) is not None:
                system = y["sys"].strip().lower()
                _health_fact(out, entity, system, y["level"], "", line)
            elif system:
                _health_fact(out, entity, system, "", right, line)


def _health_fact(out: Parsed, entity: str, system: str, level: str, msg: str, line: str) -> None:
    if msg:  # a message row under its system row: add it to that system's fact
        for f in reversed(out.facts):
            if f.kind == "dcgmi_health" and f.component == entity and f.attrs["system"] == system:
                f.attrs["msgs"].append(msg[:512])
                return
    out.facts.append(Fact("dcgmi_health", entity, {"system": system, "level": level.upper(), "msgs": [msg[:512]]
                                                   if msg else []}, line.strip()))


def _health_json(out: Parsed, obj: object, path: list[str]) -> None:
    if not isinstance(obj, dict) or len(path) > 12:
        return
    for k, v in obj.items():
        if not isinstance(v, dict):
            continue
        value = v.get("value")
        if k == "Overall Health" and isinstance(value, str):
            out.facts.append(Fact("dcgmi_health_overall", "host", {"level": value.upper()}, f'"{k}": "{value}"'))
        elif isinstance(value, str) and value.strip().lower() not in _GOOD and path:
            gpu = next((p for p in reversed(path) if p.isdigit()), None)
            system = k.lower().removesuffix(" system").strip()
            out.facts.append(Fact("dcgmi_health", f"gpu{gpu}" if gpu else "host",
                                  {"system": system, "level": value.upper(), "msgs": []}, f'"{k}": "{value}"'))
        _health_json(out, v.get("children", v), [*path, k])


# ------------------------------------------------------------------------------- dcgmi dmon
_DMON_HEAD = re.compile(r"^#\s?Entity\s+(?P<fields>.+)$")
_DMON_ROW = re.compile(r"^(?P<ent>GPU(?:-I|-CI)?)\s+(?P<id>\d{1,6})\s+(?P<vals>.+)$")


def parse_dmon(text: str) -> Parsed:
    """``dcgmi dmon -e …``: one row per entity per sample under a ``#Entity FIELD …`` header. Every
    value is a ``dmon_value`` fact; the Xid field (``XIDER``, field 230: the last Xid seen) also an
    ``xid_metric`` fact when non-zero, like a dcgm-exporter scrape's ``DCGM_FI_DEV_XID_ERRORS``."""
    out = new_parsed("dcgmi-dmon")
    fields: list[str] = []
    seen: set[tuple[str, int]] = set()
    for line in text.splitlines():
        if (h := _DMON_HEAD.match(line.strip())) is not None:
            fields = h["fields"].split()
            continue
        m = _DMON_ROW.match(line.strip())
        if m is None or not fields:
            continue
        comp = f"gpu{m['id']}" if m["ent"] == "GPU" else f"{m['ent'].lower()}{m['id']}"
        for name, val in zip(fields, m["vals"].split(), strict=False):
            out.facts.append(Fact("dmon_value", comp, {"field": name, "value": val[:64]}, line.strip()))
            n = to_count(val)
            if name == "XIDER" and n and (comp, n) not in seen:
                seen.add((comp, n))
                out.facts.append(Fact("xid_metric", comp, {"xid": min(n, 1_000_000), "pci": ""}, line.strip()))
    if not fields:
        raise ParseError("dcgmi-dmon", "no '#Entity FIELD …' header")
    return out
