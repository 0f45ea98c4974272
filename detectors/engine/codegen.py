"""Compile a RuleSet into one Python function per rule set (``exec`` of generated source).

The interpreted path (``RuleSet.evaluate_interpreted``) calls one method per rule per component;
at 8 GPUs, 8 ports and ~40 rules that is ~160 µs a sample. The generated function inlines the
cheap part of every rule — attribute loads and one comparison — and calls the rule's Python
method only when something is true or changed (a fault, a counter step), so a healthy sample
costs a few microseconds. Both paths must give the same findings (tests/detectors/test_codegen.py).

Per-component memory is a list: ``[component name, raw id, raw id 2, gate slots, rule slots...]``
(the slots a quiet sample reads first, see :func:`read_every_sample`), found by
position in the host's per-scope cache and checked against the element's raw id (UUID, port,
PCI address) so that a reordered or changed inventory falls back to a lookup by name.

A sample whose decoder base is the host's last evaluated sample's (``HostState.same``, see
``DetectorEngine.feed``) holds that sample's very objects in every GPU field but the gauges: the GPU
loop then walks the memories the last full loop recorded per position (when no two positions share
one) and runs only the gates that were live and the rules that read gauges; every other gate would
have found its snapshot unchanged.
"""

from __future__ import annotations

import linecache
import typing
import zlib
from typing import Any

from detectors.engine.compiled import (
    ConditionRule,
    CounterGroup,
    Evaluator,
    FlappingRule,
    KernelEventRule,
    KernelRecordRule,
    PresenceRule,
)
from detectors.engine.paths import SCOPES, Path, gpu_component, norm_pci
from detectors.engine.state import HostState
from detectors.engine.xidrule import XidTableRule

# [component, raw id, raw id 2, the gate's snapshot, its live flag, the element last seen, the
# GPU's nvlink object]: rule slots start after (host scope: slot 3 holds the last GPU count)
MEM0 = 7
SNAP, FLAG, SAME, NGPUS = 3, 4, 5, 3
NVPREV = 6  # gpu scope: the GPU's nvlink object when the gpu loop last saw it
GPOS = 5  # gpu scope: the position of the GPU whose gate last ran on this memory

# scope -> (loop header lines, raw id expr, raw id 2 expr, component name expr)
_LOOPS: dict[str, tuple[list[str], str, str, str]] = {
    "gpu": (["for i, e in enumerate(sample.gpus):"], "e.uuid or e.index", "e.index", "GPUNAME(e)"),
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
        self.names: dict[int, str] = {}

    def ref(self, obj: Any) -> str:
        name = self.names.get(id(obj))
        if name is None:
            self.n += 1
            name = self.names[id(obj)] = f"_R{self.n}"
            self.ns[name] = obj
        return name

    def semi_lines(self, ev: ConditionRule) -> list[str]:
        """A :func:`semi_gated` condition: run when the gate opened or the expression held last time."""
        held = ev.slot + ev.nslots
        lines = self.rule_lines(ev)
        k = lines.index(f"elif mem[{ev.slot}]:")
        body = lines[:k - 2] + [lines[k - 2], f"    mem[{held}] = 1", lines[k - 1], "else:", f"    mem[{held}] = 0",
                                f"    if mem[{ev.slot}]:", f"        mem[{ev.slot}] = 0"]
        return [f"if opened or mem[{held}]:"] + ["    " + ln for ln in body]

    def rule_lines(self, ev: Evaluator) -> list[str]:
        s = ev.slot
        call = f"{self.ref(ev)}.check(mem, st, mem[0], e, sample, out)"
        if isinstance(ev, CounterGroup):
            sub = ev.slot
            lines = [f"x = e.{ev.group}"]
            if ev.dict_keys is not None:
                keys = ", ".join(f"x.get({k!r})" for k in ev.dict_keys)
                lines.append(f"x = None if x is None else ({keys},)")
            runner = self.ref(ev)
            return lines + [f"if x != mem[{sub}] or ep:", f"    mem[{sub}] = x",
                            f"    {runner}.run(mem, st, mem[0], e, sample, out)"]
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
            return lines + [f"if {cond}:", f"    {self.ref(ev)}.hit(mem, st, mem[0], e, sample, out)",
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
                if None in ev.values:
                    return [call]
                # nothing to find without a source error or a first GPU whose read ended in one of
                # the values (every GPU must have), and nothing to reset while the count is 0
                return [f"if sample.source_errors or mem[{s}] or (sample.gpus and sample.gpus[0].nvml_error in"
                        f" {self.ref(ev.values)}):", f"    {call}"]
            else:
                # skipped only while the GPU list is, position for position, the last sample's (same
                # UUIDs, indexes and present flags: gchg, set by the gpu loop and the host block),
                # the last check found none missing and its present count met the expected one:
                # the check would then store what it holds (tests/detectors/test_codegen.py)
                return [f"if gchg or mem[{s + 1}] is None or mem[{s}] or sample.source_errors"
                        f" or mem[{s + 2}] < sample.expected_gpus:", f"    {call}"]
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


def _moving(scope: str) -> set[str]:
    """Fields a sample with the host's last base may change (HostState.same): ts, seq and the GPUs'
    numbers of float type (the gauges), as the incremental decoder's byte templates fill them in."""
    typ = SCOPES[scope][0]
    hints = typing.get_type_hints(typ, include_extras=True)
    return {f for f, t in hints.items() if _has_float(t)}


def _has_float(t: Any) -> bool:
    return t is float or any(_has_float(a) for a in typing.get_args(t))


def _gauges(scope: str) -> set[str]:
    typ = SCOPES[scope][0]
    return {f for f, a in typ.__annotations__.items() if "Gauge" in str(a)}


def _guard_attrs(ev: ConditionRule) -> list[str]:
    from detectors.engine.expr import parse_expr

    out: list[str] = []
    for key in ("when", "unless"):
        if ev.spec.params.get(key):
            g = parse_expr(ev.spec.params[key])
            out += [p.chain[0] for p in (g.lhs, g.rhs) if isinstance(p, Path)]
    return out


def _expr_attrs(ev: ConditionRule) -> list[str]:
    paths = [ev.expr.lhs] + ([ev.expr.rhs] if isinstance(ev.expr.rhs, Path) else [])
    return [p.chain[0] for p in paths]


def _inputs(ev: Evaluator) -> tuple[list[str], bool] | None:
    """(attributes an evaluator reads, reads a gauge?) — None when it cannot be gated."""
    if isinstance(ev, CounterGroup):
        return [ev.group], False
    if isinstance(ev, ConditionRule):
        attrs = _expr_attrs(ev) + _guard_attrs(ev)
        return attrs, bool(set(attrs) & _gauges(ev.scope))
    if isinstance(ev, FlappingRule):
        return [ev.path.chain[0]], False
    if isinstance(ev, PresenceRule) and ev.check_kind in ("not_present", "nvml_error"):
        return [{"not_present": "present", "nvml_error": "nvml_error"}[ev.check_kind]], False
    return None


def semi_gated(ev: Evaluator) -> bool:
    """A condition whose expression reads no gauge, but whose ``when`` / ``unless`` does (PCIe gen
    under load, a clock reason at low utilisation): while the expression's inputs are unchanged and
    it was false, it stays false and the rule only resets a count that is already 0. Its own slot
    after the rule's records whether the expression held when it last ran."""
    return (isinstance(ev, ConditionRule) and not set(_expr_attrs(ev)) & _gauges(ev.scope)
            and bool(set(_guard_attrs(ev)) & _gauges(ev.scope)))


def read_every_sample(ev: Evaluator) -> bool:
    """Whether the generated code reads the evaluator's slots on a quiet sample (gauge rules, the
    host's presence checks), not only when its inputs changed or a kernel event came."""
    if isinstance(ev, KernelEventRule | KernelRecordRule | XidTableRule):
        return False
    info = _inputs(ev)
    return info is None or info[1]


def _all_gated(evs: list[Evaluator]) -> bool:
    return all((info := _inputs(ev)) is not None and not info[1] for ev in evs)


def _gated(g: _Gen, scope: str, evs: list[Evaluator], ind: str, mark: str | None = None) -> list[str]:
    gate, always, _, _ = _gated_parts(g, scope, evs, ind, mark)
    return gate + always


def _gated_parts(g: _Gen, scope: str, evs: list[Evaluator], ind: str,
                 mark: str | None = None) -> tuple[list[str], list[str], bool, list[str]]:
    """Rules whose inputs are all unchanged since the last sample and that were all quiet then
    are skipped as a block: one tuple comparison of sub-structures instead of every rule. Rules
    reading gauges (temperature, utilisation) run every time; one reading a gauge only in its
    ``when`` / ``unless`` runs when the block's inputs changed or its expression held last time
    (:func:`semi_gated`). Findings keep the order of the code without the gate: the gated rules,
    then the others in their order. Returns (the gate's lines, the others', whether the gate sets
    ``opened``, the attributes the gate's snapshot reads)."""
    gated, always, attrs, live = [], [], [], []
    semi = False
    for ev in evs:
        info = _inputs(ev)
        if semi_gated(ev):
            semi = True
            info = (_expr_attrs(ev), False)  # type: ignore[arg-type]
            always.append(ev)
        elif info is None or info[1]:
            always.append(ev)
            continue
        else:
            gated.append(ev)
        assert info is not None
        for a in info[0]:
            if isinstance(ev, CounterGroup) and ev.dict_keys is not None:
                a = f"{a}|" + ",".join(ev.dict_keys)
            if a not in attrs:
                attrs.append(a)
        if isinstance(ev, FlappingRule):
            live.append(f"(mem[{ev.slot}] is not None and len(mem[{ev.slot}].changes) > 0)")
        elif not isinstance(ev, CounterGroup) and ev in gated:
            live.append(f"mem[{ev.slot}]")
    lines: list[str] = []
    rest: list[str] = []
    if gated or semi:
        parts = []
        for a in attrs:
            if "|" in a:
                name, keys = a.split("|")
                parts.append(f"SNAPKEYS(e.{name}, {tuple(keys.split(','))!r})")
            else:
                parts.append(f"e.{a}")
        g.ns["SNAPKEYS"] = _snapkeys
        if scope == "nvlink" and not always:
            # the incremental decoder hands back the previous sample's object when its bytes did not
            # change: an identity check skips even building the snapshot tuple
            lines += [f"if e is mem[{SAME}] and not ep and not mem[{FLAG}]:", "    continue",
                      f"mem[{SAME}] = e"]
        lines += [f"snap = ({', '.join(parts)},)", f"if ep or mem[{FLAG}] or snap != mem[{SNAP}]:",
                  f"    mem[{SNAP}] = snap"] + ([f"    {mark}"] if mark else []) + (["    opened = True"] if semi else [])
        for ev in gated:
            lines += ["    " + ln for ln in g.rule_lines(ev)]
        lines.append(f"    mem[{FLAG}] = bool({' or '.join(live) or 'False'})")
        if semi:
            lines += ["else:", "    opened = False"]
    for ev in always:
        if semi_gated(ev):
            rest += g.semi_lines(ev)  # type: ignore[arg-type]
        else:
            rest += g.rule_lines(ev)
    return [ind + ln for ln in lines], [ind + ln for ln in rest], semi, [a.split("|")[0] for a in attrs]


def _snapkeys(d: Any, keys: tuple[str, ...]) -> Any:
    return None if d is None else tuple(map(d.get, keys))


def _host_lines(g: _Gen, evs: list[Evaluator]) -> list[str]:
    """Host rules in their order, under one test of ``sample.kernel_events``: with none, the rules
    that read only kernel events have nothing to read and are left out (the Xid table still reads
    the GPUs' Xids)."""
    with_events: list[str] = []
    without: list[str] = []
    for ev in evs:
        if isinstance(ev, KernelEventRule | KernelRecordRule | XidTableRule):
            with_events.append(f"{g.ref(ev)}.check(mem, st, mem[0], e, sample, out)")
            if isinstance(ev, XidTableRule):
                without += ["if any_xid:", f"    {g.ref(ev)}.check(mem, st, mem[0], e, sample, out)"]
            continue
        lines = g.rule_lines(ev)
        with_events += lines
        without += lines
    if not with_events:
        return []
    if with_events == without:
        return with_events
    return (["if sample.kernel_events:"] + ["    " + ln for ln in with_events]
            + (["else:"] + ["    " + ln for ln in without] if without else []))


def compile_ruleset(scopes: list[tuple[str, list[Evaluator], int]], fold: tuple[Any, frozenset[str]] | None = None) -> Any:
    """Return ``evaluate(st, sample, out)`` for the (scope, evaluators, slots) of a RuleSet;
    ``fold``: (function, rule ids) called as ``function(sample, out, start, rule ids)`` when the
    sample added findings (RuleSet's ``fold: all_gpus``)."""
    g = _Gen()
    g.ns["NEWMEM"] = _newmem
    index = {name: k for k, (name, _, _) in enumerate(scopes)}
    # gchg: the GPU list may differ from the last sample's (a new or moved GPU, a changed input of
    # the gpu rules, present among them, or another length); the GPU-count rule runs when it does
    gated_gpu = [_inputs(ev) for ev in (scopes[index["gpu"]][1] if "gpu" in index else [])]
    tracked = any(info is not None and not info[1] and "present" in info[0] for info in gated_gpu)
    # the nvlink loop is skipped whole while no GPU moved, every GPU's nvlink object is the one its
    # last run saw and none was live then (nvchg: set by the gpu loop)
    nvwhole = "gpu" in index and "nvlink" in index and _all_gated(scopes[index["nvlink"]][1])
    body = ["def evaluate(st, sample, out):"] + (["    n0 = len(out)"] if fold is not None else []) + [
            "    ep = st.epoch_changed", "    sk = st.same and not ep", "    pos = st.pos",
            "    any_xid = False", f"    gchg = {not tracked}", "    nvchg = False", "    gates = st.gates",
            f"    if len(gates) < {2 * len(scopes)}:", f"        gates[:] = [None, True] * {len(scopes)}"]
    order = [s for s in SCOPES if s != "host"] + ["host"]
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
            if tracked:
                body += [f"{ind}if len(sample.gpus) != mem[{NGPUS}]:", f"{ind}    mem[{NGPUS}] = len(sample.gpus)",
                         f"{ind}    gchg = True"]
            body += [ind + ln for ln in _host_lines(g, evs)]
            continue
        header, rid, rid2, name = _LOOPS[scope]
        whole = _WHOLE.get(scope) if _all_gated(evs) else None
        pre = "    "
        if scope == "gpu":
            gate, rest, semi, attrs = _gated_parts(g, scope, evs, "", "gchg = True")
            nv = [f"if e.nvlink is not mem[{NVPREV}]:", f"    mem[{NVPREV}] = e.nvlink", "    nvchg = True"] if nvwhole else []
            skippable = bool(gate) and not set(attrs) & _moving(scope)
        if scope == "gpu" and skippable:
            # sk: the sample has the base of the host's last evaluated one (HostState.same): every
            # GPU field but the gauges is the very object that sample held. gm (HostState.gpu_mems):
            # the memory of each GPU position as the last full loop found it, when every position
            # had one of its own (a GPU listed twice shares one: then None); with both, the rid
            # checks would pass and a closed gate would find its snapshot and the nvlink object
            # unchanged and stay closed, as without the skip: only a live gate (mem[FLAG]) runs
            # (the GPUs' Xid lists are the last sample's too: so is any_xid). A closed gate leaves
            # opened False: its rules' ``opened or`` is left out there
            ind = "            "
            closed = [ln.replace("if opened or mem[", "if mem[", 1) for ln in rest]
            body += ["    gm = st.gpu_mems", "    if sk and gm is not None:", "        any_xid = st.gpu_xid",
                     "        for e, mem in zip(sample.gpus, gm):",
                     f"{ind}if mem[{FLAG}]:"] + [f"{ind}    {ln}" for ln in nv + gate + rest] + [
                     f"{ind}else:"] + [f"{ind}    {ln}" for ln in closed or ["pass"]]
            body += ["    else:", "        gm = []", f"        pc = pos[{k}] if len(pos) > {k} else ()", "        npc = len(pc)",
                     "        for i, e in enumerate(sample.gpus):", f"{ind}mem = pc[i] if i < npc else None",
                     f"{ind}if mem is None or mem[1] != ({rid}) or mem[2] != ({rid2}):", f"{ind}    gchg = True",
                     f"{ind}    mem = NEWMEM(st, {k}, {scope!r}, i, {rid}, {rid2}, {name}, {n})",
                     f"{ind}    if mem is None:", f"{ind}        continue", f"{ind}gm.append(mem)",
                     f"{ind}if e.xids:", f"{ind}    any_xid = True",
                     # a position that last ran its gate (mem[GPOS], set only there) with the gate
                     # closed: as above (here when a GPU listed twice left gm None)
                     f"{ind}if sk and mem[{GPOS}] == i and not mem[{FLAG}]:",
                     f"{ind}    {'opened = False' if semi else 'pass'}", f"{ind}else:", f"{ind}    mem[{GPOS}] = i"]
            body += [f"{ind}    {ln}" for ln in nv + gate] + [ind + ln for ln in rest]
            body += ["        st.gpu_mems = gm if len(gm) == len(sample.gpus) and len(set(map(id, gm))) == len(gm) else None",
                     "        st.gpu_xid = any_xid"]
            continue
        if scope == "nvlink" and nvwhole:
            # skipped as a whole (see nvwhole) when, after its last run, every GPU's nvlink memory
            # held that GPU's object and none was live: the run that follows records whether it does
            body += [f"    if ep or gchg or nvchg or gates[{2 * k + 1}] or len(sample.gpus) != gates[{2 * k}]:",
                     "        live = False", "        seen = []"]
            pre = "        "
        elif whole is not None:
            # the scope's list is the very object of the host's previous sample (the incremental
            # decoder reuses it when its bytes did not change) and no component had a live rule:
            # every gated block would be skipped, so skip the loop
            body += [f"    if ep or gates[{2 * k + 1}] or sample.{whole} is not gates[{2 * k}]:",
                     "        live = False"]
            pre = "        "
        body += [f"{pre}pc = pos[{k}] if len(pos) > {k} else ()", f"{pre}npc = len(pc)"]
        body += [pre + h for h in header]
        ind = pre + "    " * (1 if scope not in ("dimm",) else 2)
        # the component's memory by position, checked against its raw ids (mem[0] is its name)
        body += [f"{ind}mem = pc[i] if i < npc else None",
                 f"{ind}if mem is None or mem[1] != ({rid}) or mem[2] != ({rid2}):"]
        if scope == "gpu":
            body += [f"{ind}    gchg = True"]
        body += [f"{ind}    mem = NEWMEM(st, {k}, {scope!r}, i, {rid}, {rid2}, {name}, {n})",
                 f"{ind}    if mem is None:"] + ([f"{ind}        live = True"] if scope == "nvlink" and nvwhole else []) + [
                 f"{ind}        continue"]
        if scope == "gpu":
            body += [f"{ind}if e.xids:", f"{ind}    any_xid = True"] + [ind + ln for ln in nv + gate + rest]
        else:
            if scope == "nvlink" and nvwhole:
                body += [f"{ind}seen.append((mem, e))"]
            body += _gated(g, scope, evs, ind)
        if scope == "nvlink" and nvwhole:
            body += [f"{pre}for m, x in seen:", f"{pre}    if m[{SAME}] is not x or m[{FLAG}]:",
                     f"{pre}        live = True", f"{pre}gates[{2 * k}] = len(sample.gpus)", f"{pre}gates[{2 * k + 1}] = live"]
        elif whole is not None:
            body += [f"{ind}if mem[{FLAG}]:", f"{ind}    live = True",
                     f"{pre}gates[{2 * k}] = sample.{whole}", f"{pre}gates[{2 * k + 1}] = live"]
    if fold is not None:
        g.ns["FOLD"], g.ns["FOLDIDS"] = fold
        body += ["    if len(out) > n0:", "        FOLD(sample, out, n0, FOLDIDS)"]
    src = "\n".join(body) + "\n"
    # registered in linecache under a name of its own, so a traceback through it shows the line
    name = f"<detectors.engine.codegen-{zlib.crc32(src.encode()):08x}>"
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    code = compile(src, name, "exec")
    exec(code, g.ns)
    fn = g.ns["evaluate"]
    fn.source = src
    return fn
