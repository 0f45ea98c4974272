"""The detector engine: per-host state + rules + registered detectors -> incident episodes.

    engine = DetectorEngine(RuleSet.load(), extra_detectors=[...])
    incidents = engine.feed(sample)      # open / updated / resolved Incidents
    incidents += engine.tick(now_ts)     # staleness (host_unreachable) at stream time now_ts

Time: a host's episodes resolve against that host's own sample time (it reported ``quiet_s`` of
clean samples), never against other hosts' — a Kafka worker reads partitions unevenly, and one
partition running ahead must not resolve a lagging one's episodes. Staleness needs a fleet clock:
with ``auto_tick`` (default) the engine ticks on the largest sample ts it has seen (right for one
stream in order: a file, the in-process bus); the detect worker turns that off and ticks with a
clock a lagging partition cannot trip (see ``detectors/worker/worker.py``).

Precedence (data: ``detectors/engine/precedence.yaml``; prose: docs/detectors.md): rules are evaluated
first; a model finding on a component a rule already speaks for is folded in as evidence; a model
may raise a mode no rule raised, at capped confidence; superseding modes (a GPU that fell off the
bus) absorb their sympathetic findings; ``app_error`` never recommends more than annotate.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detectors.engine.episodes import IncidentEpisodes
from detectors.engine.finding import Detector, Finding
from detectors.engine.rulefile import RuleError
from detectors.engine.ruleset import RuleSet
from detectors.engine.state import Admission, HostState
from fleethealth.datacache import cached
from fleethealth.schema import Evidence, Incident, Sample
from fleethealth.taxonomy import FAULT_LABELS, MODES, parse_mode

log = logging.getLogger(__name__)
UNREACHABLE = "host_unreachable"
_UNREACHABLE = frozenset({UNREACHABLE})
_PRECEDENCE_YAML = Path(__file__).with_name("precedence.yaml")


_RANK = {"info": 0, "minor": 1, "major": 2, "critical": 3}


@dataclass(slots=True)
class Precedence:
    model_max_confidence: float = 0.8
    never_drain: dict[str, list[str]] = field(default_factory=dict)
    # superseding mode -> (scope, modes it absorbs)
    supersedes: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)  # superseding modes sort first in a sample

    @classmethod
    def load(cls, path: Path | None = None) -> Precedence:
        """The shipped ``precedence.yaml`` (kept parsed in :mod:`fleethealth.datacache`), or ``path``."""
        if path is not None:
            return cls._read(path, str(path))
        return cached("precedence", [_PRECEDENCE_YAML, Path(__file__)],
                      lambda: cls._read(_PRECEDENCE_YAML, "detectors/engine/precedence.yaml"))

    @classmethod
    def _read(cls, path: Path, name: str) -> Precedence:
        import yaml

        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        text = path.read_text()
        try:
            raw = yaml.load(text, Loader=loader) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise RuleError(f"{name}:{mark.line + 1 if mark else 1}: not valid YAML") from None
        root = yaml.compose(text, Loader=loader)
        lines = {k.value: v.start_mark.line + 1 for k, v in root.value} if root is not None else {}
        p = cls(float(raw.get("model_max_confidence", 0.8)), dict(raw.get("never_drain") or {}))
        for i, entry in enumerate(raw.get("supersedes") or []):
            modes = [entry.get("mode"), *entry.get("over", [])]
            bad = [m for m in modes if m not in FAULT_LABELS]
            if bad or entry.get("scope") not in ("component", "host"):
                raise RuleError(f"{name}:{lines.get('supersedes', 1)}: supersedes entry {i + 1}: "
                                f"unknown mode(s) {bad} or scope not component|host")
            p.supersedes[entry["mode"]] = (entry["scope"], frozenset(entry.get("over", [])))
            p.order[entry["mode"]] = -1
        for m in p.never_drain:
            if m not in FAULT_LABELS:
                raise RuleError(f"{name}:{lines.get('never_drain', 1)}: never_drain: unknown mode {m!r}")
        return p


class DetectorEngine:
    """Feed samples in per-host order (any interleaving of hosts); get incidents back."""

    def __init__(self, rules: RuleSet | None = None, extra_detectors: Iterable[Detector] = (), *,
                 update_every_s: float = 60.0, tick_every_s: float = 10.0,
                 precedence: Precedence | None = None, auto_tick: bool = True) -> None:
        self.rules = rules if rules is not None else RuleSet.load()
        self.extra = list(extra_detectors)
        # (detector, whether its feed takes the decoder's base too: ``takes_base`` true, as MLSuite's)
        self._feeds: list[tuple[Any, bool]] = [(d, bool(getattr(d, "takes_base", False))) for d in self.extra]
        self.precedence = precedence or Precedence.load()
        self.episodes = IncidentEpisodes(update_every_s)
        self.hosts: dict[str, HostState] = {}
        self.tick_every_s = tick_every_s
        self.auto_tick = auto_tick  # tick staleness on the max sample ts (off: the caller ticks)
        self.fleet_ts = 0.0
        self._last_tick = 0.0
        self.baselines_due = float("-inf")  # a live sample at or past this ts refreshes fleet baselines
        # detectors that hold findings for batched scoring and are flushed at fixed points of fleet time
        # (MLSuite): their feed() returns nothing, so what they find depends on each host's own order and
        # those points only, not on the order hosts are fed in between (see advance_epoch)
        self._held: list[Any] = [d for d in self.extra if getattr(d, "flush_every_s", 0) > 0]
        self.order_free = len(self._held) == len(self.extra)
        self._held_s = min((float(d.flush_every_s) for d in self._held), default=0.0)
        self._held_due = self._replay_due = float("inf") if not self._held else float("-inf")
        self.epoch_due = float("-inf")  # a live sample at or past this ts starts a new fleet-time epoch
        self.stats: Counter[str] = Counter()
        st = self.rules.staleness
        self.stale_intervals = float(st.params["intervals"]) if st else 0.0
        self.stale_min_s = float(st.params.get("min_s", 0)) if st else 0.0
        self._quiet = {s.id: s.quiet_s for s in self.rules.specs}

    # ------------------------------------------------------------------ feeding

    def feed(self, sample: Sample, base: object = None) -> list[Incident]:
        """``base``: :attr:`detectors.engine.fastdecode.IncrementalDecoder.base` of this sample's
        decode (or None). Two samples of a host with one base differ in nothing but ts, seq and the
        GPUs' gauges, every other field holding the same objects: a sample with the base of the
        host's last evaluated one skips comparing what that proves unchanged (the results are the
        same either way: tests/detectors/test_codegen.py)."""
        return self._feed(sample, True, base)

    def replay(self, sample: Sample) -> None:
        """Rebuild state from a sample another worker already handled (after a partition moved here):
        per-host state, windows and episodes advance exactly as in ``feed`` (an episode keeps its
        first_seen, hence its id), but nothing is returned, fleet time does not move and no
        fleet-wide tick runs (it would resolve or age the hosts this worker already owns)."""
        self.stats["replayed"] += 1
        self._feed(sample, False)

    def _feed(self, sample: Sample, live: bool, base: object = None) -> list[Incident]:
        out: list[Incident] = []
        if live:
            if sample.ts >= self.epoch_due:  # baselines and held model findings: at fixed points of fleet time
                out.extend(self.advance_epoch(sample.ts))
        elif sample.ts >= self._replay_due:  # a rebuild: held windows scored at the replayed stream's epochs
            self._replay_due = (sample.ts // self._held_s + 1) * self._held_s
            self._flush(self._held)
        st = self.hosts.get(sample.host)
        if st is None:
            st = self.hosts[sample.host] = HostState(sample.host, sample.cluster, sample.rack)
        restarts = st.seq_restarts
        skip = Admission.admit(st, sample.seq, sample.ts, sample.boot_id, sample.driver_version)
        if skip:
            self.stats[skip] += 1
            return out
        if st.seq_restarts != restarts:
            self.stats[Admission.SEQ_RESTART] += 1
        if live:
            self.stats["samples"] += 1
        ts = sample.ts
        if self.episodes.by_host.get(sample.host):  # the host has open episodes (most have none)
            # only a current sample ends an unreachable episode: one stamped older than the staleness
            # limit before the last tick (a spool resend, a host clock far behind) says nothing of now
            if self.episodes.has_open(sample.host, "host", _UNREACHABLE) and ts > self._last_tick - self.stale_limit(st):
                out.extend(self.episodes.clear(sample.host, ts, "telemetry resumed", "host"))
            if st.epoch_changed:
                out.extend(self.episodes.clear(sample.host, ts, "reboot or driver reload cleared it"))
            # quiet periods on the host's own clock, before this sample's findings: an episode resolves
            # when the host has reported quiet_s of clean samples, however far other hosts have run
            out.extend(self.episodes.expire(sample.host, ts))
        findings: list[Finding] = []
        st.same = base is not None and base is st.base
        st.base = None  # until the rules ran through: a sample that breaks one leaves no base
        try:
            self.rules.evaluate(st, sample, findings)
        finally:
            st.same = False
        st.base = base
        for d, takes_base in self._feeds:
            try:
                findings.extend(d.feed(sample, base) if takes_base else d.feed(sample))
            except Exception:  # a broken model must not stop the rules
                self.stats["detector_errors"] += 1
                log.exception("detector %s failed on a sample from %s", getattr(d, "name", d), sample.host)
        if findings:
            out.extend(self._combine(findings, 3.0 * st.interval_s))
        if live and ts > self.fleet_ts:
            self.fleet_ts = ts
            if self.auto_tick and ts - self._last_tick >= self.tick_every_s:
                out.extend(self.tick(ts))
        return out

    def advance_epoch(self, ts: float) -> list[Incident]:
        """A live sample at ``ts`` comes next: if it starts a new epoch of fleet time, refresh the fleet
        baselines (``fleet_outlier``'s percentiles, :class:`detectors.engine.state.FleetBaseline`,
        ``ts // refresh_s``) and score the windows the held detectors buffered (``ts //
        flush_every_s``), whose findings are returned as incidents. :attr:`epoch_due` is the ts from
        which the next epoch is due. ``feed`` calls it itself; a caller that feeds a batch grouped by
        host calls it where the batch's record order reaches ``epoch_due`` (before that record's
        segment), so a refresh sees the same rates and a scoring batch holds the same windows either
        way (detectors/worker/worker.py)."""
        out: list[Incident] = []
        if ts >= self._held_due:
            self._held_due = (ts // self._held_s + 1) * self._held_s
            out = self._flush(self._held)
        if ts >= self.baselines_due:
            self.baselines_due = self.rules.advance_baselines(ts)
        self.epoch_due = min(self.baselines_due, self._held_due)
        return out

    def _flush(self, detectors: list[Any]) -> list[Incident]:
        """The findings ``detectors`` held back, as incidents; one that fails is counted and logged,
        and the others' findings still come (a broken model must not stop the rules or other models)."""
        held: list[Finding] = []
        for d in detectors:
            try:
                held.extend(d.flush())
            except Exception:
                self.stats["detector_errors"] += 1
                log.exception("detector %s failed scoring its held windows", getattr(d, "name", d))
        return self._combine(held) if held else []

    def flush(self, silent: bool = False) -> list[Incident]:
        """Findings detectors held back (batched model scoring) as incidents: call after each poll
        batch. ``silent``: after a rebuild (:meth:`replay`), the held findings are of replayed
        samples: they advance the episodes as live ones would, and nothing is returned."""
        out = self._flush([d for d in self.extra if hasattr(d, "flush")])
        return [] if silent else out

    def detect(self, sample: Sample) -> list[Finding]:
        """Raw findings for one sample (state advances; no episodes): for tests and diagnose-like use."""
        if sample.ts >= self.baselines_due:
            self.baselines_due = self.rules.advance_baselines(sample.ts)
        st = self.hosts.setdefault(sample.host, HostState(sample.host, sample.cluster, sample.rack))
        if Admission.admit(st, sample.seq, sample.ts, sample.boot_id, sample.driver_version):
            return []
        out: list[Finding] = []
        self.rules.evaluate(st, sample, out)
        for d in self.extra:
            out.extend(d.feed(sample))
        return out

    def _combine(self, findings: list[Finding], min_quiet_s: float = 0.0) -> list[Incident]:
        p = self.precedence
        out: list[Incident] = []
        findings.sort(key=lambda f: (p.order.get(f.failure_mode, 0), f.detector.startswith("model:")))
        for f in findings:
            self.stats["findings." + f.failure_mode] += 1
            if f.failure_mode in p.never_drain:
                f.recommended_action = list(p.never_drain[f.failure_mode])
                f.severity = MODES[parse_mode(f.failure_mode)].severity.value
            absorbed = self._absorbing(f)
            if absorbed is not None:
                self.stats["absorbed"] += 1
                inc = self.episodes.observe(absorbed)
                if inc is not None:
                    out.append(inc)
                continue
            if f.detector.startswith("model:"):
                if self.episodes.has_open(f.host, f.component) and not self.episodes.has_open(
                        f.host, f.component, frozenset({f.failure_mode})):
                    self.stats["model_folded"] += 1
                    continue  # a rule already speaks for this component: the model does not overrule it
                f.confidence = min(f.confidence, p.model_max_confidence)
            inc = self.episodes.observe(f, max(self._quiet.get(f.detector) or 0.0, min_quiet_s) or None)
            if inc is not None:
                out.append(inc)
        return out

    def _absorbing(self, f: Finding) -> Finding | None:
        """If an open superseding episode absorbs f, return a finding that adds f as its evidence."""
        for key in sorted(self.episodes.open_keys(f.host)):  # a set: its order changes with PYTHONHASHSEED
            _, comp, mode = key
            rule = self.precedence.supersedes.get(mode)
            if rule is None or f.failure_mode not in rule[1]:
                continue
            if rule[0] == "component" and comp != f.component:
                continue
            ev = [Evidence(fact=f"[{f.failure_mode} absorbed from {f.component}] {e.fact}", ts=e.ts, line=e.line)
                  for e in f.evidence]
            ep = self.episodes.open[key]
            if _RANK.get(ep.severity, 0) < _RANK.get(f.severity, 0):
                continue  # a predictive (minor) episode never swallows an actionable finding
            return Finding(f.host, comp, mode, ep.severity, ep.confidence, ep.detector, f.ts, ev, [],
                           cluster=f.cluster, rack=f.rack)
        return None

    # ------------------------------------------------------------------ time

    def tick(self, now_ts: float) -> list[Incident]:
        """Staleness at fleet time ``now_ts``; quiet periods of every host at its own last sample time.

        A host is unreachable once ``now_ts`` is past its last sample by the staleness limit; the
        episode's first_seen is that moment (last sample + limit), not the tick's time, so its id
        does not depend on when or how often ticks run (a replay, a worker that took the partition
        over and the live run agree)."""
        self._last_tick = now_ts
        out: list[Incident] = []
        if self.stale_intervals > 0:
            spec = self.rules.staleness
            assert spec is not None
            intervals, min_s, hosts = self.stale_intervals, self.stale_min_s, self.hosts
            for host in sorted(hosts):
                st = hosts[host]
                age = now_ts - st.last_ts
                if age <= min_s:  # within the limit's floor: not stale (most hosts, every tick)
                    continue
                limit = max(intervals * (st.interval_s or 0.0), min_s)  # stale_limit(st), inline
                if st.samples and age > limit and not self.episodes.has_open(host, "host", _UNREACHABLE):
                    fact = spec.evidence.format_map(_Facts(age_s=round(age), count=round(age / st.interval_s)
                                                           if st.interval_s else "?", host=host))
                    since = st.last_ts + limit
                    f = Finding(host, "host", UNREACHABLE, spec.severity, spec.confidence, spec.id, since,
                                [Evidence(fact=fact, ts=now_ts)], [], cluster=st.cluster, rack=st.rack)
                    inc = self.episodes.observe(f, 1e12)
                    if inc is not None:
                        out.append(inc)
        for host in sorted(self.episodes.by_host):
            hs = self.hosts.get(host)
            if hs is not None and hs.samples:
                out.extend(self.episodes.expire(host, hs.last_ts))
        return out

    def stale_limit(self, st: HostState) -> float:
        """How long a host may be silent before it is unreachable (the staleness rule's limit)."""
        return max(self.stale_intervals * (st.interval_s or 0.0), self.stale_min_s)

    def reset(self) -> None:
        self.hosts.clear()
        self.episodes = IncidentEpisodes(self.episodes.update_every_s)
        self.fleet_ts = self._last_tick = 0.0
        self.baselines_due = self.epoch_due = float("-inf")
        self._held_due = self._replay_due = float("inf") if not self._held else float("-inf")
        self.stats.clear()
        self.rules.reset()
        for d in self.extra:
            d.reset()

    def forget_host(self, host: str) -> None:
        """Drop everything about a host, silently (its partition moved to another worker after a
        rebalance: the new owner rebuilds it and speaks for its episodes from now on)."""
        self.hosts.pop(host, None)
        self.episodes.drop_host(host)
        for b in self.rules.baselines.values():
            for key in [k for k in b.rates if k[0] == host]:
                del b.rates[key]
        for d in self.extra:  # model detectors: the host's feature state, streaks, buffered windows
            forget = getattr(d, "forget_host", None)
            if forget is not None:
                forget(host)


class _Facts(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "?"
