"""Compile a RuleSet into one Python function per rule set (``exec`` of generated source).

The interpreted path (``RuleSet.evaluate_interpreted``) calls one method per rule per component;
at 8 GPUs, 8 ports and ~40 rules that is ~160 µs a sample. The generated function inlines the
cheap part of every rule — attribute loads and one comparison — and calls the rule's Python
method only when something is true or changed (a fault, a counter step), so a healthy sample
costs a few microseconds. Both paths must give the same findings (tests/detectors/test_codegen.py).

Per-component memory is a list: ``[component name, raw id, raw id 2, rule slots...]``, found by
position in the host's per-scope cache and checked against the element's raw id (UUID, port,
PCI address) so that a reordered or changed inventory falls back to a lookup by name.
"""

from __future__ import annotations

import linecache
import zlib
from typing import Any

from detectors.engine.compiled import (
    ConditionRule,
    CounterGroup,
    Evaluator,
    FlappingRule,
    KernelEventRule,
    PresenceRule,
)
from detectors.engine.paths import SCOPES, Path, gpu_component, norm_pci
from detectors.engine.state import HostState
from detectors.engine.xidrule import XidTableRule

MEM0 = 3  # slots start after [component, raw id, raw id 2]

# scope -> (loop header lines, raw id expr, raw id 2 expr, component name expr)
_LOOPS: dict[str, tuple[list[str], str, str, str]] = {
    "gpu": (["for i, e in enumerate(sample.gpus):"], "e.uuid or e.index", "None", "GPUNAME(e)"),
    "nvlink": (["for i, g in enumerate(sample.gpus):", "    e = g.nvlink", "    if e is None:", "        continue"],
               "g.uuid or g.index", "None", "GPUNAME(g)"),
    "net_port": (["for i, e in enumerate(sample.net_ports):"], "e.device", "e.port", 'f"{e.device}/{e.port}"'),
    "aer": (["for i, e in enumerate(sample.aer):"], "e.pci_addr", "None", "NORMPCI(e.pci_addr)"),
    "edac_mc": (["for i, e in enumerate(sample.edac):"], "e.mc", "None", 'f"mc{e.mc}"'),
    "dimm": (["i = -1", "for m in sample.edac:", "    for e in m.dimms:", "        i += 1"],
             "e.label", "m.mc", 'e.label or f"mc{m.mc}"'),
}


# scope -> the sample list whose identity gates the whole loop (scopes of gated rules only)
_WHOLE = {"net_port": "net_ports", "aer": "aer", "edac_mc": "edac", "dimm": "edac"}


def _get_lines(path: Path, var: str, dst: str) -> list[str]:
    chain = list(path.chain)
    key = chain.pop() if path.is_dict_key else None
    lines = [f"{dst} = {var}.{chain[0]}"]
    for a in chain[1:]:
        lines.append(f"if {dst} is not None: {dst} = {dst}.{a}")
    if key == "#total":
        lines.append(f"{dst} = DICTTOTAL({dst})")
    elif key is not None:
        lines.append(f"if {dst} is not None: {dst} = {dst}.get({key!r})")
    return lines


class _Gen:
    def __init__(self) -> None:
        self.ns: dict[str, Any] = {"GPUNAME": gpu_component, "NORMPCI": norm_pci}
        from detectors.engine.paths import _dict_total

        self.ns["DICTTOTAL"] = _dict_total
        self.n = 0

    def ref(self, obj: Any) -> str:
        self.n += 1
        name = f"_R{self.n}"
        self.ns[name] = obj
        return name

    def rule_lines(self, ev: Evaluator) -> list[str]:
        s = ev.slot
        call = f"{self.ref(ev)}.check(mem, st, comp, e, sample, out)"
        if isinstance(ev, CounterGroup):
            sub = ev.slot
            lines = [f"x = e.{ev.group}"]
            if ev.dict_keys is not None:
                keys = ", ".join(f"x.get({k!r})" for k in ev.dict_keys)
                lines.append(f"x = None if x is None else ({keys},)")
            runner = self.ref(ev)
            return lines + [f"if x != mem[{sub}] or ep:", f"    mem[{sub}] = x",
                            f"    {runner}.run(mem, st, comp, e, sample, out)"]
        if isinstance(ev, ConditionRule):
            ex = ev.expr
            lines = _get_lines(ex.lhs, "e", "a")
            cond = "a is not None"
            if isinstance(ex.rhs, Path):
                lines += _get_lines(ex.rhs, "e", "b")
                cond += " and b is not None"
                rhs = "b"
            else:
                rhs = self.ref(ex.rhs)
            cond += {"==": f" and a == {rhs}", "!=": f" and a != {rhs}", ">": f" and a > {rhs}",
                     ">=": f" and a >= {rhs}", "<": f" and a < {rhs}", "<=": f" and a <= {rhs}",
                     "&": f" and (a & {rhs})", "in": f" and a in {rhs}", "not in": f" and a not in {rhs}",
                     "has": f" and {rhs} in a"}[ex.op]
            return lines + [f"if {cond}:", f"    {self.ref(ev)}.hit(mem, st, comp, e, sample, out)",
                            f"elif mem[{s}]:", f"    mem[{s}] = 0"]
        if isinstance(ev, FlappingRule):
            lines = _get_lines(ev.path, "e", "a")
            return lines + [f"f = mem[{s}]",
                            f"if f is None or a != f.last or ep or len(f.changes) > {ev.changes_gt}:", f"    {call}"]
        if isinstance(ev, PresenceRule):
            if ev.check_kind == "not_present":
                test = "not e.present"
            elif ev.check_kind == "nvml_error":
                test = "e.nvml_error is not None"
            elif ev.check_kind == "nvml_unresponsive":
                return [call]  # host scope, cheap: its own check every sample
            else:
                # a GPU listed present=false is missing too (the interpreter counts present GPUs)
                return [f"if mem[{s + 1}] is None or mem[{s}] or len(sample.gpus) < sample.expected_gpus"
                        f" or not all(g.present for g in sample.gpus):", f"    {call}"]
            return [f"if {test}:", f"    {call}", f"elif mem[{s}]:", f"    mem[{s}] = 0"]
        if isinstance(ev, XidTableRule):
            return ["if any_xid or sample.kernel_events:", f"    {call}"]
        if isinstance(ev, KernelEventRule):
            return ["if sample.kernel_events:", f"    {call}"]
        return [call]  # any other evaluator: its own check every time


def _newmem(st: HostState, k: int, scope: str, i: int, rid: Any, rid2: Any, comp: str, n: int) -> list[Any] | None:
    key = (scope, comp)
    mem = st.slots.get(key)
    if mem is None:
        if len(st.slots) >= 4096:  # bounded per host, whatever a collector invents
            return None
        mem = st.slots[key] = [None] * n
        mem[0] = comp
    mem[1], mem[2] = rid, rid2
    while len(st.pos) <= k:
        st.pos.append([])
    pc = st.pos[k]
    if i < 512:
        while len(pc) <= i:
            pc.append([None, None, None])
        pc[i] = mem
    return mem


def _gauges(scope: str) -> set[str]:
    typ = SCOPES[scope][0]
    return {f for f, a in typ.__annotations__.items() if "Gauge" in str(a)}


def _inputs(ev: Evaluator) -> tuple[list[str], bool] | None:
    """(attributes an evaluator reads, reads a gauge?) — None when it cannot be gated."""
    if isinstance(ev, CounterGroup):
        return [ev.group], False
    if isinstance(ev, ConditionRule):
        paths = [ev.expr.lhs] + ([ev.expr.rhs] if isinstance(ev.expr.rhs, Path) else [])
        attrs = [p.chain[0] for p in paths]
        for key in ("when", "unless"):
            if ev.spec.params.get(key):
                from detectors.engine.expr import parse_expr

                g = parse_expr(ev.spec.params[key])
                attrs += [p.chain[0] for p in (g.lhs, g.rhs) if isinstance(p, Path)]
        return attrs, bool(set(attrs) & _gauges(ev.scope))
    if isinstance(ev, FlappingRule):
        return [ev.path.chain[0]], False
    if isinstance(ev, PresenceRule) and ev.check_kind in ("not_present", "nvml_error"):
        return [{"not_present": "present", "nvml_error": "nvml_error"}[ev.check_kind]], False
    return None


def _all_gated(evs: list[Evaluator]) -> bool:
    return all((info := _inputs(ev)) is not None and not info[1] for ev in evs)


def _gated(g: _Gen, scope: str, evs: list[Evaluator], n: int, ind: str) -> list[str]:
    """Rules whose inputs are all unchanged since the last sample and that were all quiet then
    are skipped as a block: one tuple comparison of sub-structures instead of every rule. Rules
    reading gauges (temperature, utilisation) run every time."""
    gated, always, attrs, live = [], [], [], []
    for ev in evs:
        info = _inputs(ev)
        if info is None or info[1]:
            always.append(ev)
            continue
        gated.append(ev)
        for a in info[0]:
            if isinstance(ev, CounterGroup) and ev.dict_keys is not None:
                a = f"{a}|" + ",".join(ev.dict_keys)
            if a not in attrs:
                attrs.append(a)
        if isinstance(ev, FlappingRule):
            live.append(f"(mem[{ev.slot}] is not None and len(mem[{ev.slot}].changes) > 0)")
        elif not isinstance(ev, CounterGroup):
            live.append(f"mem[{ev.slot}]")
    lines: list[str] = []
    if gated:
        parts = []
        for a in attrs:
            if "|" in a:
                name, keys = a.split("|")
                parts.append(f"SNAPKEYS(e.{name}, {tuple(keys.split(','))!r})")
            else:
                parts.append(f"e.{a}")
        g.ns["SNAPKEYS"] = _snapkeys
        snap, flag, same = n, n + 1, n + 2
        if scope == "nvlink":
            # the incremental decoder hands back the previous sample's object when its bytes did not
            # change: an identity check skips even building the snapshot tuple
            lines += [f"if e is mem[{same}] and not ep and not mem[{flag}]:", "    continue",
                      f"mem[{same}] = e"]
        lines += [f"snap = ({', '.join(parts)},)", f"if ep or mem[{flag}] or snap != mem[{snap}]:",
                  f"    mem[{snap}] = snap"]
        for ev in gated:
            lines += ["    " + ln for ln in g.rule_lines(ev)]
        lines.append(f"    mem[{flag}] = bool({' or '.join(live) or 'False'})")
    for ev in always:
        lines += g.rule_lines(ev)
    return [ind + ln for ln in lines]


def _snapkeys(d: Any, keys: tuple[str, ...]) -> Any:
    return None if d is None else tuple(map(d.get, keys))


def compile_ruleset(scopes: list[tuple[str, list[Evaluator], int]]) -> Any:
    """Return ``evaluate(st, sample, out)`` for the (scope, evaluators, slots) of a RuleSet."""
    g = _Gen()
    g.ns["NEWMEM"] = _newmem
    body = ["def evaluate(st, sample, out):", "    ep = st.epoch_changed", "    pos = st.pos",
            "    any_xid = False", "    gates = st.gates",
            f"    if len(gates) < {len(scopes)}:", f"        gates.extend([None, True] for _ in range({len(scopes)} - len(gates)))"]
    order = [s for s in SCOPES if s != "host"] + ["host"]
    index = {name: k for k, (name, _, _) in enumerate(scopes)}
    for scope in order:
        if scope not in index:
            if scope == "gpu" and "host" in index:
                body += ["    for e in sample.gpus:", "        if e.xids:", "            any_xid = True"]
            continue
        k = index[scope]
        _, evs, n = scopes[k]
        if scope == "host":
            ind = "    "
            body += [f"{ind}pc = pos[{k}] if len(pos) > {k} else ()", f"{ind}e = sample",
                     f"{ind}mem = pc[0] if pc and pc[0][1] == 0 else NEWMEM(st, {k}, 'host', 0, 0, None, 'host', {n})"]
            body += [f"{ind}comp = 'host'"]
            for ev in evs:
                body += [ind + ln for ln in g.rule_lines(ev)]
            continue
        header, rid, rid2, name = _LOOPS[scope]
        whole = _WHOLE.get(scope) if _all_gated(evs) else None
        pre = "    "
        if whole is not None:
            # the scope's list is the very object of the host's previous sample (the incremental
            # decoder reuses it when its bytes did not change) and no component had a live rule:
            # every gated block would be skipped, so skip the loop
            body += [f"    gk = gates[{k}]", f"    if ep or gk[1] or sample.{whole} is not gk[0]:",
                     "        live = False"]
            pre = "        "
        body += [f"{pre}pc = pos[{k}] if len(pos) > {k} else ()"]
        body += [pre + h for h in header]
        ind = pre + "    " * (1 if scope not in ("dimm",) else 2)
        body += [f"{ind}rid = {rid}", f"{ind}rid2 = {rid2}",
                 f"{ind}mem = pc[i] if i < len(pc) and pc[i][1] == rid and pc[i][2] == rid2 else None",
                 f"{ind}if mem is None:",
                 f"{ind}    mem = NEWMEM(st, {k}, {scope!r}, i, rid, rid2, {name}, {n + 3})",
                 f"{ind}    if mem is None:", f"{ind}        continue",
                 f"{ind}comp = mem[0]"]
        if scope == "gpu":
            body += [f"{ind}if e.xids:", f"{ind}    any_xid = True"]
        body += _gated(g, scope, evs, n, ind)
        if whole is not None:
            body += [f"{ind}if mem[{n + 1}]:", f"{ind}    live = True",
                     f"{pre}gk[0] = sample.{whole}", f"{pre}gk[1] = live"]
    src = "\n".join(body) + "\n"
    # registered in linecache under a name of its own, so a traceback through it shows the line
    name = f"<detectors.engine.codegen-{zlib.crc32(src.encode()):08x}>"
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    code = compile(src, name, "exec")
    exec(code, g.ns)
    fn = g.ns["evaluate"]
    fn.source = src
    return fn
