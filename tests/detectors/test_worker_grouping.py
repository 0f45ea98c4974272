"""The detect worker feeds each batch grouped by host (each host's own order kept): the same incidents,
dead letters and admissions as feeding in record order, on a fleet whose ``fleet_outlier`` baseline
moves and decides findings (the percentiles refresh at fixed points of fleet time, which the grouped
batch cuts its segments at), with ``--max-hosts`` refusing a host inside a batch."""

from __future__ import annotations

import msgspec

from detectors.engine.engine import DetectorEngine
from detectors.engine.rulefile import parse_rules
from detectors.engine.ruleset import RuleSet
from detectors.worker.worker import DetectWorker
from fleethealth.bus import DEADLETTER, INCIDENTS, TELEMETRY, InProcessBus
from fleethealth.schema import decode_incident, encode
from simulator.fixtures import HostSeries

replace = msgspec.structs.replace

OUTLIER = """
version: 1
rules:
  - id: t.sbe-outlier
    kind: fleet_outlier
    failure_mode: gpu_ecc_sbe_storm
    path: gpus[*].ecc.dram_corrected_volatile
    window_s: 120
    percentile: 50
    factor: 3
    quiet_s: 30
    min_rate_per_hour: 0
    evidence: "{rate}/h against the fleet's median {baseline}/h"
  - id: t.stale
    kind: staleness
    failure_mode: host_unreachable
    intervals: 10
    min_s: 2700
    evidence: "silent {age_s}s"
"""
HOSTS, SAMPLES = 12, 24


def _step(k: int, n: int) -> int:
    """Corrected errors GPU 0 of host k adds at its n-th sample: most hosts 1-3 a poll (the fleet's
    median), host 3 a steady 8, host 7 hot from its 10th sample, host 9 warm (5) for a while."""
    if k == 3:
        return 8
    if k == 7 and n >= 10:
        return 40
    if k == 9 and 6 <= n < 16:
        return 5
    return 1 + n // 4 + (k + n) % 3  # the fleet's rate rises: the baseline must keep up


def _records() -> list[tuple[str, bytes]]:
    out = []
    for k in range(HOSTS):
        hs = HostSeries(f"grp-{k:02d}", t0=1_700_000_003.0 + 0.7 * k, interval=10.0)
        total = 0
        for n in range(SAMPLES):
            total += _step(k, n)

            def fn(s, total=total):
                s.gpus = s.gpus[:1]
                s.gpus[0] = replace(s.gpus[0], ecc=replace(s.gpus[0].ecc, dram_corrected_volatile=total))

            s = hs.advance(fn)
            out.append((s.ts, s.host, encode(s)))
    out.sort()
    recs = [(h, v) for _, h, v in out]
    recs.insert(40, ("grp-05", b'{"host": 7}'))  # a dead letter inside a batch
    return recs


class _Recording(DetectorEngine):
    """The engine, noting the longest run of one host's samples fed in a row."""

    longest_run = run = 0
    last = ""

    def feed(self, sample, base=None):  # type: ignore[no-untyped-def]
        self.run = self.run + 1 if sample.host == self.last else 1
        self.last, self.longest_run = sample.host, max(self.longest_run, self.run)
        return super().feed(sample, base)


def _run(records: list[tuple[str, bytes]], grouped: bool, max_hosts: int) -> tuple[list[bytes], list[bytes], dict]:
    bus = InProcessBus(partitions=1)
    for host, value in records:
        bus.publish(TELEMETRY, host, value)
    engine = _Recording(rules=RuleSet(parse_rules(OUTLIER, "t.yaml")))
    w = DetectWorker(bus, engine, poll_timeout=0.0, idle_tick=False, max_records=50, max_hosts=max_hosts,
                     clock=lambda: 1_700_100_000.0, group_hosts=grouped)
    w.run(max_idle_polls=1)
    c = bus.consumer([INCIDENTS, DEADLETTER], "check")
    got = c.poll(timeout=0, max_records=100_000)
    incidents = [r.value for r in got if r.topic == INCIDENTS]
    dead = [r.value for r in got if r.topic == DEADLETTER]
    st = w.stats
    return incidents, dead, {"samples": st.samples, "dead": st.dead_letters, "by_reason": st.by_reason,
                             "hosts": sorted(engine.hosts), "batches": st.batches, "run": engine.longest_run}


def test_grouped_batches_give_what_record_order_gives() -> None:
    recs = _records()
    grouped = _run(recs, True, HOSTS - 1)
    in_order = _run(recs, False, HOSTS - 1)
    assert grouped[2].pop("run") >= 4 and in_order[2].pop("run") == 1  # grouped: a host's samples in a row
    assert grouped == in_order
    incidents, dead, stats = grouped
    assert stats["by_reason"] == {"telemetry sample": 1, "host_limit": SAMPLES}  # the last host to appear is refused
    assert len(stats["hosts"]) == HOSTS - 1 and stats["batches"] > 5
    found = [decode_incident(v) for v in incidents]
    # the steady 8/poll GPU and the one that turned hot stand out of the fleet's median long after the
    # first refresh period (when the baseline is still empty and every rising counter stands out)
    late = {i.host for i in found if i.state != "resolved" and i.last_seen > 1_700_000_003.0 + 120.0}
    assert {"grp-03", "grp-07"} <= late < set(stats["hosts"])
    baselines = {e.fact.rsplit(" ", 1)[-1] for i in found for e in i.evidence if "median" in e.fact}
    assert len(baselines) > 2, baselines  # the baseline moved and was read at several refreshes


def test_the_engine_alone_in_record_order_agrees() -> None:
    """run / replay --score feed the engine directly, sample by sample: the same incidents."""
    recs = [(h, v) for h, v in _records() if not v.startswith(b'{"host": 7')]
    worker_incidents, _, _ = _run(recs, True, 10_000)
    engine = DetectorEngine(rules=RuleSet(parse_rules(OUTLIER, "t.yaml")))
    from fleethealth.schema import decode_sample

    direct = [encode(i) for _, v in recs for i in engine.feed(decode_sample(v))]

    def key(v: bytes) -> tuple:
        i = decode_incident(v)
        return i.id, i.state, i.last_seen, tuple(e.fact for e in i.evidence)

    assert sorted(map(key, worker_incidents)) == sorted(map(key, direct))


def test_absorption_does_not_depend_on_the_hash_seed() -> None:
    """Two open gpu_fell_off_bus episodes on a host (the GPU's and the host's): a pcie_fatal finding is
    absorbed by the same one in every process (the open keys are a set: its order followed
    PYTHONHASHSEED, and smoke-64h's incidents with it). The component's own episode comes first."""
    from detectors.engine.finding import Finding
    from fleethealth.schema import Evidence

    engine = DetectorEngine()
    for comp in ("host", "GPU-1234", "GPU-0042"):
        engine.episodes.observe(Finding("h1", comp, "gpu_fell_off_bus", "critical", 0.98, "x", 100.0,
                                        [Evidence(fact="fell off", ts=100.0)], ["drain"]))
    f = Finding("h1", "0000:18:00.0", "pcie_fatal", "critical", 0.9, "y", 110.0, [Evidence(fact="AER", ts=110.0)], [])
    got = engine._absorbing(f)
    assert got is not None and got.component == "GPU-0042"
