"""The tiny expression language of ``condition`` rules and ``when`` guards.

    <path> <op> <literal | path>        e.g.  net_ports[*].state != ACTIVE
                                               gpus[*].remapped_rows.pending == true
                                               gpus[*].pcie.width_current < gpus[*].pcie.width_max
                                               gpus[*].clocks_event_reasons & 0x60
                                               net_ports[*].phys_state in [Disabled, Polling]

ops: ``== != > >= < <=`` (a missing value never matches), ``&`` (bitmask: any bit set),
``in`` / ``not in`` (a list literal), ``has`` (a per-link list holds the value:
``gpus[*].nvlink[*].active has false``). Both sides of a path comparison share the scope.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from detectors.engine.paths import Path, PathError, parse_path

_EXPR = re.compile(r"^\s*(?P<lhs>[^\s&<>=!]+)\s*(?P<op>==|!=|>=|<=|>|<|&|not\s+in|in|has)\s+(?P<rhs>.+?)\s*$")
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, ">": operator.gt, ">=": operator.ge, "<": operator.lt,
    "<=": operator.le, "&": lambda a, b: bool(a & b), "in": lambda a, b: a in b,
    "not in": lambda a, b: a not in b, "has": lambda a, b: b in a,
}


class ExprError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Expr:
    text: str
    lhs: Path
    op: str
    rhs: Any  # literal, or a Path
    test: Callable[[Any], bool]  # element -> bool
    scope: str


def literal(text: str) -> Any:
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    if t.startswith("[") and t.endswith("]"):
        return frozenset(literal(x) for x in t[1:-1].split(",") if x.strip())
    try:
        return int(t, 0)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        return t.strip("'\"")


def parse_expr(text: str) -> Expr:
    m = _EXPR.match(text)
    if not m:
        raise ExprError(f"expression {text!r} is not '<path> <op> <value>' (ops: {', '.join(_OPS)})")
    op = re.sub(r"\s+", " ", m["op"])
    try:
        lhs = parse_path(m["lhs"])
    except PathError as exc:
        raise ExprError(str(exc)) from None
    raw = m["rhs"]
    rhs: Any
    rhs_get = None
    if re.match(r"^[a-z_]+(\[\*\])?\.", raw) or raw.startswith(("gpus[", "net_ports[", "aer[", "edac[")):
        try:
            rhs = parse_path(raw)
        except PathError as exc:
            raise ExprError(str(exc)) from None
        if rhs.scope != lhs.scope:
            raise ExprError(f"expression {text!r}: both sides must be in the same scope")
        rhs_get = rhs.get
    else:
        rhs = literal(raw)
    if op in ("in", "not in") and not isinstance(rhs, frozenset):
        raise ExprError(f"expression {text!r}: '{op}' needs a list, e.g. [Disabled, Polling]")
    if op == "&" and not isinstance(rhs, int):
        raise ExprError(f"expression {text!r}: '&' needs an integer mask, e.g. 0x60")
    fn = _OPS[op]
    get = lhs.get
    if rhs_get is not None:
        rg = rhs_get

        def test_paths(e: Any) -> bool:
            a, b = get(e), rg(e)
            return a is not None and b is not None and fn(a, b)

        test = test_paths
    elif op in ("==", "!="):
        lit = rhs

        def test_eq(e: Any) -> bool:
            a = get(e)
            return a is not None and fn(a, lit)

        test = test_eq
    else:
        lit = rhs

        def test_lit(e: Any) -> bool:
            a = get(e)
            return a is not None and fn(a, lit)

        test = test_lit
    return Expr(text, lhs, op, rhs, test, lhs.scope)
