"""Rule specs compiled into evaluators. Each evaluator belongs to one scope and keeps its memory in
slots of a per-component list (one dict lookup per component per sample, list indexing per rule).

Counter-reading rules are grouped by the sub-structure they read (``ecc``, ``pcie``, a port's
watched counters ...); a group whose snapshot equals the previous one is skipped as a whole, so a
quiet GPU costs one C-level struct comparison per group.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

from detectors.engine.expr import ExprError, parse_expr
from detectors.engine.finding import Finding
from detectors.engine.paths import PathError, norm_pci, parse_path
from detectors.engine.rulefile import PRESENCE_CHECKS, RuleSpec
from detectors.engine.state import (
    SATURATED,
    EventWindow,
    FlapCounter,
    FleetBaseline,
    HostState,
    counter_delta,
    saturation,
)
from fleethealth.lazyregex import LazyPattern, lazy
from fleethealth.schema import Evidence, Sample
from fleethealth.taxonomy import MODES, parse_mode

TEMPLATE_FIELDS = {"component", "value", "delta", "prev", "rate", "window_s", "count", "line", "xid",
                   "host", "rhs", "note", "links", "threshold", "baseline", "age_s", "a", "message"}
_MISSING = object()


class _Fmt(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "?"


def check_template(spec: RuleSpec) -> None:
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(spec.evidence) if f}
    except ValueError as exc:
        raise spec.error("evidence", f"bad evidence template: {exc}") from None
    unknown = {n.split(".")[0].split("[")[0] for n in names} - TEMPLATE_FIELDS
    if unknown:
        raise spec.error("evidence", f"unknown template field(s) {sorted(unknown)}; "
                         f"allowed: {', '.join(sorted(TEMPLATE_FIELDS))}")


class Evaluator:
    """Base: one compiled rule."""

    scope = "host"
    nslots = 1

    def __init__(self, spec: RuleSpec, slot: int = 0) -> None:
        self.spec = spec
        self.id = spec.id
        self.slot = slot
        self.mode = spec.failure_mode
        self.actions = [a.value for a in MODES[parse_mode(spec.failure_mode)].actions]

    def finding(self, sample: Sample, component: str, line: str = "", xid: int | None = None,
                bucket: str | None = None, ts: float | None = None, elem: Any = None, **facts: Any) -> Finding:
        bus_id = getattr(elem, "pci_bus_id", None)
        if self.spec.component == "pci" and bus_id:
            component = norm_pci(bus_id)
        facts.setdefault("component", component)
        facts.setdefault("host", sample.host)
        facts.setdefault("line", line)
        facts.setdefault("xid", xid)
        text = self.spec.evidence.format_map(_Fmt(facts))
        t = sample.ts if ts is None else ts
        return Finding(sample.host, component, self.mode, self.spec.severity, self.spec.confidence, self.id,
                       sample.ts, [Evidence(fact=text, ts=t, line=line[:2000])], list(self.actions), xid, bucket,
                       sample.cluster, sample.rack)

    def check(self, mem: list[Any], st: HostState, comp: str, elem: Any, sample: Sample,
              out: list[Finding]) -> None:
        raise NotImplementedError


def _when(spec: RuleSpec, scope: str, key: str = "when") -> Callable[[Any], bool] | None:
    w = spec.params.get(key)
    if not w:
        return None
    try:
        e = parse_expr(w)
    except ExprError as exc:
        raise spec.error(key, str(exc)) from None
    if e.scope != scope:
        raise spec.error(key, f"'{key}' must read the rule's scope ({scope}), not {e.scope}")
    return e.test


def _path(spec: RuleSpec, key: str = "path") -> Any:
    try:
        return parse_path(spec.params[key])
    except PathError as exc:
        raise spec.error(key, str(exc)) from None


# --------------------------------------------------------------------------- counters


def _step(prev: Any, new: Any, epoch: bool, absolute: bool, sat: frozenset[int] = SATURATED) -> Any:
    s = counter_delta(prev, new, epoch_changed=epoch, saturated=sat)
    if epoch and not absolute:
        # across a reboot / driver reload a counter restarts and link training bumps some (IB
        # link_downed): re-baseline. Only "since driver load" counters (absolute) count from zero.
        s.delta = 0
    return s


def _deltas(prev: Any, new: Any, epoch: bool, absolute: bool,
            sat: frozenset[int] = SATURATED) -> tuple[int, str, list[int]]:
    """Delta of a scalar counter or of a per-link list (summed); notes and links that moved."""
    if isinstance(new, list):
        total, links, notes = 0, [], set()
        for i, v in enumerate(new):
            p = prev[i] if isinstance(prev, list) and i < len(prev) else None
            s = _step(p, v, epoch, absolute, sat)
            if s.delta > 0:
                total += s.delta
                links.append(i)
            if s.note in ("reset", "wrap", "saturated"):
                notes.add(s.note)
        return total, ",".join(sorted(notes)), links
    s = _step(prev, new, epoch, absolute, sat)
    return s.delta, s.note if s.note in ("reset", "wrap", "saturated") else "", []


class CounterRule(Evaluator):
    """counter_increase / counter_rate / fleet_outlier: run only when their group changed."""

    nslots = 2  # previous value, window

    def __init__(self, spec: RuleSpec, slot: int, baseline: FleetBaseline | None = None) -> None:
        super().__init__(spec, slot)
        self.path = _path(spec)
        self.scope = self.path.scope
        self.get = self.path.get
        p = spec.params
        self.kind = spec.kind
        self.delta_gt = p.get("delta_gt", 0)
        self.absolute_first = p.get("first_sample", "baseline") == "absolute"
        if p.get("first_sample", "baseline") not in ("baseline", "absolute"):
            raise spec.error("first_sample", "first_sample must be 'baseline' or 'absolute'")
        self.window_s = float(p.get("window_s", 0))
        if spec.kind == "counter_rate":
            if ("increase_gt" in p) == ("rate_per_hour_gt" in p):
                raise spec.error(None, "counter_rate needs exactly one of increase_gt, rate_per_hour_gt")
            self.limit = p["increase_gt"] if "increase_gt" in p else p["rate_per_hour_gt"] * self.window_s / 3600
        if self.window_s < 0 or (spec.kind != "counter_increase" and self.window_s <= 0):
            raise spec.error("window_s", "window_s must be positive")
        self.when = _when(spec, self.scope)
        self.baseline = baseline
        self.percentile = float(p.get("percentile", 95))
        self.factor = float(p.get("factor", 1))
        self.min_rate = float(p.get("min_rate_per_hour", 0))
        self.saturated = saturation(self.path.chain[-1])  # the counter's width (detectors/engine/counters.yaml)

    def check(self, mem: list[Any], st: HostState, comp: str, elem: Any, sample: Sample,
              out: list[Finding]) -> None:
        v = self.get(elem)
        if v is None:
            return
        s = self.slot
        prev = mem[s]
        mem[s] = v
        if st.epoch_changed and mem[s + 1] is not None:
            mem[s + 1].clear()  # errors of the link / board before a reboot (or repair) are history
        if prev is None:
            if self.baseline is not None:
                self.baseline.population += 1  # a quiet component counts as a zero in the fleet's percentiles
            if not (v and (self.absolute_first or st.snapshot)):
                return
            if isinstance(v, list):
                links = [i for i, x in enumerate(v) if x]
                delta, note = sum(x or 0 for x in v), "first sight"
            else:
                delta, note, links = v, "first sight", []
                if v in self.saturated:
                    note = "saturated"
        else:
            if prev == v:
                return
            delta, note, links = _deltas(prev, v, st.epoch_changed, self.absolute_first, self.saturated)
        if delta <= 0:
            return
        if note:
            st.note(f"{comp} {self.path.text}: {note}")
        if self.kind == "counter_increase":
            if delta > self.delta_gt and (self.when is None or self.when(elem)):
                f = self.finding(sample, comp, elem=elem, value=v, delta=delta, prev=prev, note=note,
                                 links=links, threshold=self.delta_gt)
                if note == "saturated":
                    f.evidence[0].fact += f" ({self.path.text.rsplit('.', 1)[-1]}={v} is saturated: at least this many)"
                out.append(f)
            return
        w = mem[s + 1]
        if w is None:
            w = mem[s + 1] = EventWindow()
        w.add(sample.ts, delta)
        total = w.sum(sample.ts, self.window_s)
        # The oldest delta in the window began one poll before its own timestamp: with polls as long
        # as the window (a 10-minute poll against a 5- or 10-minute rule), the deltas counted cover
        # up to twice the window, and a steady counter at half its limit read as over it. Judge the
        # count over the time it really covers (never less than the window).
        span = self.window_s
        if st.interval_s and w.events:
            span = max(span, sample.ts - w.events[0][0] + st.interval_s)
        rate = total * 3600.0 / span
        if self.kind == "counter_rate":
            if total > self.limit * span / self.window_s and (self.when is None or self.when(elem)):
                out.append(self.finding(sample, comp, elem=elem, value=v, delta=delta, count=total, rate=round(rate, 1),
                                        window_s=self.window_s, links=links, threshold=self.limit))
            return
        assert self.baseline is not None
        self.baseline.set(st.host, comp, rate)
        base = self.baseline.percentile(self.percentile)  # the snapshot of the last refresh (state.FleetBaseline)
        limit = max(self.min_rate, self.factor * base)
        if rate > limit:
            out.append(self.finding(sample, comp, elem=elem, value=v, delta=delta, count=total, rate=round(rate, 1),
                                    window_s=self.window_s, baseline=round(base, 2), threshold=round(limit, 1)))


class CounterGroup(Evaluator):
    """Counter rules reading one sub-structure; skipped as a whole while it is unchanged."""

    def __init__(self, scope: str, group: str, slot: int, rules: list[CounterRule], dict_keys: list[str] | None):
        self.scope, self.group, self.slot, self.rules = scope, group, slot, rules
        self.id = f"group:{scope}.{group}"
        self.dict_keys = dict_keys
        if dict_keys is not None:
            keys = tuple(dict_keys)
            def snap(e: Any) -> Any:
                d = getattr(e, group)
                return None if d is None else tuple(map(d.get, keys))

            self.snap: Callable[[Any], Any] = snap
        else:
            self.snap = lambda e: getattr(e, group)

    def check(self, mem: list[Any], st: HostState, comp: str, elem: Any, sample: Sample,
              out: list[Finding]) -> None:
        snap = self.snap(elem)
        if snap == mem[self.slot] and not st.epoch_changed:
            return
        mem[self.slot] = snap
        self.run(mem, st, comp, elem, sample, out)

    def run(self, mem: list[Any], st: HostState, comp: str, elem: Any, sample: Sample,
            out: list[Finding]) -> None:
        for r in self.rules:
            r.check(mem, st, comp, elem, sample, out)


# --------------------------------------------------------------------------- conditions


class ConditionRule(Evaluator):
    def __init__(self, spec: RuleSpec, slot: int) -> None:
        super().__init__(spec, slot)
        try:
            self.expr = parse_expr(spec.params["expr"])
        except ExprError as exc:
            raise spec.error("expr", str(exc)) from None
        self.scope = self.expr.scope
        self.test = self.expr.test
        self.n = int(spec.params.get("for_samples", 1))
        if self.n < 1:
            raise spec.error("for_samples", "for_samples must be at least 1")
        self.edge = bool(spec.params.get("edge", False))
        self.when = _when(spec, self.scope)
        self.unless = _when(spec, self.scope, "unless")  # the guard's opposite: skip while it holds
        rhs = self.expr.rhs
        self.rhs_get = rhs.get if hasattr(rhs, "get") and not isinstance(rhs, frozenset) else None

    def check(self, mem: list[Any], st: HostState, comp: str, elem: Any, sample: Sample,
              out: list[Finding]) -> None:
        if not self.test(elem):
            if mem[self.slot]:
                mem[self.slot] = 0
            return
        self.hit(mem, st, comp, elem, sample, out)

    def hit(self, mem: list[Any], st: HostState, comp: str, elem: Any, sample: Sample,
            out: list[Finding]) -> None:
        """The expression holds: count persistence (and the ``when`` guard), then fire."""
        if (self.when is not None and not self.when(elem)) or (self.unless is not None and self.unless(elem)):
            if mem[self.slot]:
                mem[self.slot] = 0
            return
        c = mem[self.slot] = (0 if st.epoch_changed and not self.edge else (mem[self.slot] or 0)) + 1
        if c < self.n or (self.edge and c > self.n):
            return
        rhs = self.rhs_get(elem) if self.rhs_get else self.expr.rhs
        out.append(self.finding(sample, comp, elem=elem, value=self.expr.lhs.get(elem), rhs=rhs, count=self.n))


class FlappingRule(Evaluator):
    def __init__(self, spec: RuleSpec, slot: int) -> None:
        super().__init__(spec, slot)
        self.path = _path(spec)
        self.scope = self.path.scope
        self.window_s = float(spec.params["window_s"])
        self.changes_gt = int(spec.params["changes_gt"])

    def check(self, mem: list[Any], st: HostState, comp: str, elem: Any, sample: Sample,
              out: list[Finding]) -> None:
        v = self.path.get(elem)
        f = mem[self.slot]
        if f is None:
            f = mem[self.slot] = FlapCounter()
        elif st.epoch_changed:
            f.changes.clear()  # a reboot's link bounce is not a flap
        n = f.observe(sample.ts, v, self.window_s)
        if n > self.changes_gt:
            out.append(self.finding(sample, comp, elem=elem, value=v, count=n, window_s=self.window_s))


class PresenceRule(Evaluator):
    """GPU count below expected (host scope, names the missing UUIDs), present=false, NVML errors."""

    def __init__(self, spec: RuleSpec, slot: int) -> None:
        super().__init__(spec, slot)
        self.check_kind = spec.params["check"]
        if self.check_kind not in PRESENCE_CHECKS:
            raise spec.error("check", f"check must be one of {', '.join(PRESENCE_CHECKS)}")
        self.scope = "host" if self.check_kind in ("gpu_count_below_expected", "nvml_unresponsive") else "gpu"
        default = ["TIMEOUT"] if self.check_kind == "nvml_unresponsive" else ["GPU_IS_LOST"]
        self.values = frozenset(spec.params.get("values", default))
        self.n = int(spec.params.get("for_samples", 1))
        if self.check_kind == "gpu_count_below_expected":
            self.nslots = 3  # count, GPUs known by index, present count at the last check

    def check(self, mem: list[Any], st: HostState, comp: str, elem: Any, sample: Sample,
              out: list[Finding]) -> None:
        if self.check_kind == "not_present":
            hit = not elem.present
            val = f"present=false, {elem.nvml_error or 'no NVML error'}, PCI {elem.pci_bus_id or 'unknown'}" if hit else ""
        elif self.check_kind == "nvml_error":
            hit, val = elem.nvml_error in self.values, elem.nvml_error
        elif self.check_kind == "nvml_unresponsive":
            self._unresponsive(mem, sample, out)
            return
        else:
            self._count(mem, st, sample, out)
            return
        if not hit:
            mem[self.slot] = 0
            return
        c = mem[self.slot] = (mem[self.slot] or 0) + 1
        if c >= self.n:
            out.append(self.finding(sample, comp, value=val, count=c))

    def _unresponsive(self, mem: list[Any], sample: Sample, out: list[Finding]) -> None:
        """NVML as a whole does not answer: the collector's init / device-count lane missed its
        deadline (source error "NVML unresponsive: ..."), or every GPU's read ended in one of
        ``values`` (a hung call: TIMEOUT) -- a driver wedged in its lock, not one sick GPU. One
        host-level finding after ``for_samples`` such polls in a row; any answering poll resets."""
        why = next((e.error for e in sample.source_errors
                    if e.source.startswith("nvml") and e.error.startswith("NVML unresponsive")), None)
        if why is None and sample.gpus and all(g.nvml_error in self.values for g in sample.gpus):
            why = f"every GPU's NVML read ended {'/'.join(sorted({str(g.nvml_error) for g in sample.gpus}))}"
        if why is None:
            mem[self.slot] = 0
            return
        c = mem[self.slot] = (mem[self.slot] or 0) + 1
        if c >= self.n:
            out.append(self.finding(sample, "host", value=why, count=c))

    def _count(self, mem: list[Any], st: HostState, sample: Sample, out: list[Finding]) -> None:
        known: dict[int, str] = mem[self.slot + 1] if mem[self.slot + 1] is not None else {}
        mem[self.slot + 1] = known
        present = {g.index: g.uuid or f"gpu{g.index}" for g in sample.gpus if g.present}
        nvml_down = any(e.source.startswith("nvml") for e in sample.source_errors)
        mem[self.slot + 2] = len(present)  # the generated evaluator's guard reads it
        if sample.expected_gpus <= 0 or nvml_down or len(present) >= sample.expected_gpus:
            mem[self.slot] = 0
            if len(known) < 4 * 64:
                known.update(present)
            return
        c = mem[self.slot] = (mem[self.slot] or 0) + 1
        if c < self.n:
            return
        missing = [u for i, u in sorted(known.items()) if i not in present and u not in present.values()]
        for u in missing or ["host"]:
            out.append(self.finding(sample, u, value=len(present), rhs=sample.expected_gpus, count=c))

    nslots = 2


# --------------------------------------------------------------------------- kernel events


_AER_SOURCE = lazy(r"error received: (?:id=)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])")


class KernelEventRule(Evaluator):
    """Kernel-log lines of one kind / severity / text. ``not_match``: lines it must not match;
    ``after``: only once a line matching it named the component (remembered across samples);
    ``cleared_by``: skip a line that a later line for the same component (in this sample) undoes
    (a link down then up); ``at_most``: skip when more such lines name the component in this sample
    (a repeat rule names that); ``unless``: skip while another line of the sample matches it (a more
    specific rule names the fault); ``count_gt`` + ``window_s``: repeats; ``benign_details``."""

    nslots = 2  # repeat windows per component, components seen by ``after``

    def _rx(self, key: str) -> LazyPattern | None:
        text = self.spec.params.get(key)
        return lazy(text) if text else None  # checked when the rule file was read (rulefile.REGEX_KEYS)

    def __init__(self, spec: RuleSpec, slot: int) -> None:
        super().__init__(spec, slot)
        p = spec.params
        self.kind_ = p.get("event_kind")
        self.xids = frozenset(p.get("xid_in", []))
        self.sev = frozenset(s.lower() for s in p.get("severity_in", []))
        self.rx = self._rx("match")
        self.not_rx, self.cleared_rx, self.unless_rx, self.after_rx = (
            self._rx(k) for k in ("not_match", "cleared_by", "unless", "after"))
        self.names_gpu = MODES[parse_mode(spec.failure_mode)].component.value in ("gpu", "nvlink")
        if not (self.kind_ or self.xids or self.rx or self.sev):
            raise spec.error(None, "kernel_event needs at least one of event_kind, xid_in, match, severity_in")
        # repeats: fire when more than count_gt matching lines name one component within window_s
        # (event time: the log's own stamps, so a capture and a stream count the same)
        self.count_gt = int(p.get("count_gt", 0))
        self.window_s = float(p.get("window_s", 0.0))
        if self.count_gt and self.window_s <= 0:
            raise spec.error("window_s", "count_gt needs a positive window_s")
        # an AER header whose detail lines ([bit] Name) in the same record are all benign is not a fault
        self.benign = frozenset(b.lower() for b in p.get("benign_details", []))
        self.at_most = int(p.get("at_most", 0))

    def check(self, mem: list[Any], st: HostState, comp: str, elem: Any, sample: Sample,
              out: list[Finding]) -> None:
        if not sample.kernel_events:
            return
        from detectors.engine.xidrule import pci_to_gpu

        events = sample.kernel_events
        seen: set[Any] | None = None
        if self.after_rx is not None:
            seen = mem[self.slot + 1]
            if seen is None:
                seen = mem[self.slot + 1] = set()
        skip = _benign_records(events, self.benign) if self.benign else ()
        for i, ev in enumerate(events):
            if seen is not None and len(seen) < 256 and self.after_rx.search(ev.message or ev.line):  # type: ignore[union-attr]
                seen.add(ev.pci_addr)
            if self.kind_ and ev.kind != self.kind_:
                continue
            if self.xids and ev.xid not in self.xids:
                continue
            if self.sev and (ev.severity or "").lower() not in self.sev:
                continue
            text = ev.message or ev.line
            m = self.rx.search(text) if self.rx else None
            if self.rx and not m:
                continue
            if self.not_rx is not None and self.not_rx.search(text):
                continue
            if i in skip:
                continue
            if seen is not None and ev.pci_addr not in seen:
                continue  # never seen up: a port without a cable at probe
            if self.unless_rx is not None and any(self.unless_rx.search(e.message or e.line) for e in events):
                continue
            if self.at_most and self.rx is not None and sum(
                    1 for e in events if e.pci_addr == ev.pci_addr and self.rx.search(e.message or e.line)) > self.at_most:
                continue
            if self.cleared_rx is not None and any(
                    e.pci_addr == ev.pci_addr and self.cleared_rx.search(e.message or e.line) for e in events[i + 1:]):
                continue
            c = "host"
            if ev.pci_addr:
                # a port's "AER: ... error received: <dev>" line names the device that reported it
                src = _AER_SOURCE.search(ev.line) if ev.kind == "aer" else None
                addr = norm_pci(src.group(1) if src else ev.pci_addr)
                c = pci_to_gpu(sample).get(addr, addr) if self.names_gpu else addr
            if m and "component" in m.groupdict() and m["component"]:
                c = m["component"]
            if self.count_gt:
                wins = mem[self.slot]
                if wins is None:
                    wins = mem[self.slot] = {}
                w = wins.get(c)
                if w is None:
                    if len(wins) >= 256:
                        continue
                    w = wins[c] = EventWindow()
                w.add(ev.ts, 1)
                n = w.sum(max(ev.ts, w.events[-1][0]), self.window_s)
                if n <= self.count_gt:
                    continue
                if n > self.count_gt + 1 and not st.snapshot:
                    continue  # one finding when the window crosses the limit, not one per line after it
            out.append(self.finding(sample, c, line=ev.line, ts=ev.ts, xid=ev.xid, value=ev.kind,
                                    message=ev.message, count=self.count_gt + 1, window_s=self.window_s))


_DETAIL = lazy(r"^\s*\[\s*\d+\]\s+(?P<name>[A-Za-z][\w ()-]*?)\s*(?:\(First\))?\s*$")


def _benign_records(events: list[Any], benign: frozenset[str]) -> set[int]:
    """Indexes of the lines of AER records whose every ``[bit] Name`` detail is benign: the header
    (``severity=...``), its detail lines (same device, up to the next header) and the port's
    ``error received: <device>`` line just before it."""
    out: set[int] = set()
    n = len(events)
    for i, head in enumerate(events):
        if head.kind != "aer" or "severity=" not in (head.message or head.line):
            continue
        names, idx = [], [i]
        for j in range(i + 1, min(n, i + 24)):
            ev = events[j]
            text = ev.message or ev.line
            if ev.kind != "aer" or ev.pci_addr != head.pci_addr or "severity=" in text:
                break
            idx.append(j)
            m = _DETAIL.search(text)
            if m:
                names.append(m["name"].strip().lower())
        if not names or not all(x in benign for x in names):
            continue
        for j in range(max(0, i - 3), i):
            src = _AER_SOURCE.search(events[j].line) if events[j].kind == "aer" else None
            if src is not None and norm_pci(src.group(1)) == norm_pci(head.pci_addr or ""):
                idx.append(j)
        out.update(idx)
    return out


# --------------------------------------------------------------------------- capture facts


class FactRule(Evaluator):
    """Capture-only evidence (``diagnose``): a parsed Fact of kind ``fact`` whose attributes match
    ``attrs`` (a value, or a list of allowed values; a list attribute matches when any element is
    allowed), whose raw line matches ``match``, and for which ``test`` holds (``a OP b`` over
    attribute names and numbers, ``b`` may be ``name - number``). ``below_common: ATTR`` fires for
    facts whose ATTR is below the most common value among at least ``min_facts`` such facts."""

    def __init__(self, spec: RuleSpec, slot: int) -> None:
        super().__init__(spec, slot)
        p = spec.params
        self.fact = p["fact"]
        self.attrs = {k: (frozenset(v) if isinstance(v, list) else frozenset([v]))
                      for k, v in (p.get("attrs") or {}).items()}
        self.rx = lazy(p["match"]) if p.get("match") else None  # checked when the rule file was read
        self.test = _fact_test(spec, p.get("test"))
        self.below = p.get("below_common")
        self.min_facts = int(p.get("min_facts", 3))
        self.count_gt = int(p.get("count_gt", 0))
        # another fact of the capture that makes this one inconclusive (any kind)
        self.unless = lazy(p["unless"]) if p.get("unless") else None

    def _matches(self, f: Any) -> bool:
        if f.kind != self.fact:
            return False
        for k, allowed in self.attrs.items():
            v = f.attrs.get(k)
            if isinstance(v, list | tuple | set | frozenset):
                if not any(x in allowed for x in v):
                    return False
            elif v not in allowed:
                return False
        if self.rx is not None and not self.rx.search(f.line):
            return False
        return self.test is None or self.test(f.attrs)

    def check(self, mem: list[Any], st: HostState, comp: str, elem: Any, sample: Sample,
              out: list[Finding]) -> None:
        hits = [f for f in st.facts if self._matches(f)]
        if hits and self.unless is not None and any(self.unless.search(f.line) for f in st.facts):
            return
        if self.below and hits:
            vals = [f.attrs.get(self.below) for f in hits if f.attrs.get(self.below)]
            if len(vals) < self.min_facts:
                return
            common = max(set(vals), key=lambda v: (vals.count(v), v))
            hits = [f for f in hits if f.attrs.get(self.below) and f.attrs[self.below] < common]
            for f in hits:
                out.append(self.finding(sample, f.component or "host", line=f.line, a=_Fmt(f.attrs), rhs=common))
            return
        if self.count_gt:
            per: dict[str, list[Any]] = {}
            for f in hits:
                per.setdefault(f.component or "host", []).append(f)
            for comp_, fs in per.items():
                n = sum(min(int(f.attrs.get("count") or 1), 1 << 20) for f in fs)
                if n > self.count_gt:
                    out.append(self.finding(sample, comp_, line=fs[0].line, a=_Fmt(fs[0].attrs), count=n))
            return
        for f in hits:
            comp_ = f.component or "host"
            m = self.rx.search(f.line) if self.rx is not None else None
            if m is not None and m.groupdict().get("gpu"):
                comp_ = f"gpu{m['gpu']}"  # the GPU the line names (dcgmi diag "Fail - GPU: 3")
            out.append(self.finding(sample, comp_, line=f.line, a=_Fmt(f.attrs), value=f.attrs.get("value", "")))


_TEST = lazy(r"^\s*(?P<a>[a-z_][a-z0-9_]*)\s*(?P<op>>=|<=|==|!=|>|<)\s*"
                   r"(?P<b>[a-z_][a-z0-9_]*|-?\d+(?:\.\d+)?)(?:\s*-\s*(?P<k>\d+(?:\.\d+)?))?\s*$")
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b,
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def _fact_test(spec: RuleSpec, text: str | None) -> Callable[[dict[str, Any]], bool] | None:
    if not text:
        return None
    m = _TEST.match(text)
    if m is None:
        raise spec.error("test", f"test {text!r} must be 'name OP name|number [- number]'")
    a, op, b, k = m["a"], _OPS[m["op"]], m["b"], float(m["k"] or 0)
    num = None if b[0].isalpha() or b[0] == "_" else float(b)

    def test(attrs: dict[str, Any]) -> bool:
        x = attrs.get(a)
        y = num if num is not None else attrs.get(b)
        if not isinstance(x, int | float) or not isinstance(y, int | float) or isinstance(x, bool):
            return False
        return op(x, y - k)

    return test


class KernelRecordRule(FactRule):
    """Kernel machine-check / EDAC records decoded from the sample's kernel events (the parsers'
    one MCE decoder: MCi_STATUS with the next line's IPID, EDAC "N CE/UE ... on DIMM" lines), then
    matched like a ``fact`` rule. ``count_gt`` + ``window_s``: more than N matching records (an EDAC
    line counts its N) within the window, where a ``repeats`` line after a matching record (a bare
    "Machine check events logged") counts as one more of the same. Both paths run it: a stream's
    kernel events and a capture's are the same events."""

    nslots = 1

    def __init__(self, spec: RuleSpec, slot: int) -> None:
        super().__init__(spec, slot)
        p = spec.params
        self.window_s = float(p.get("window_s", 3600.0))
        self.repeats = lazy(p["repeats"]) if p.get("repeats") else None  # checked when the rule file was read

    def check(self, mem: list[Any], st: HostState, comp: str, elem: Any, sample: Sample,
              out: list[Finding]) -> None:
        evs = [e for e in sample.kernel_events if e.kind in ("mce", "edac")]
        if not evs:
            return
        from parsers.mce import decode_kernel_mce  # here: only a machine-check line needs its regexes

        hits: list[tuple[float, Any, int]] = []  # (ts, fact, weight)
        matched_once = False
        for i, ev in enumerate(evs):
            facts = decode_kernel_mce([e.message or e.line for e in evs[i:i + 3]])
            f = facts[0] if facts and facts[0].line == (ev.message or ev.line).strip() else None
            if f is not None and self._matches(f):
                hits.append((ev.ts, f, min(int(f.attrs.get("count") or 1), 1 << 20)))
                matched_once = True
            elif matched_once and self.repeats is not None and self.repeats.search(ev.message or ev.line):
                hits.append((ev.ts, hits[-1][1], 1))
        if not hits:
            return
        if not self.count_gt:
            done: set[str] = set()
            for ts, f, _ in hits:
                if f.line not in done:  # each record once (a repeat line is not a new record)
                    done.add(f.line)
                    out.append(self.finding(sample, f.component or "host", line=f.line, ts=ts, a=_Fmt(f.attrs)))
            return
        wins = mem[self.slot]
        if wins is None:
            wins = mem[self.slot] = {}
        for ts, f, n in hits:
            key = "host"
            w = wins.get(key)
            if w is None:
                w = wins[key] = EventWindow()
            w.add(ts, n)
            total = w.sum(ts, self.window_s)
            if total > self.count_gt:
                out.append(self.finding(sample, f.component or "host", line=f.line, ts=ts, a=_Fmt(f.attrs),
                                        count=total, window_s=self.window_s))
                w.clear()
                break
