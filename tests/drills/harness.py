"""Shared pieces of the fault drills: a live-timed recording, the in-process reference run, the
real ``fleethealth detect`` / ``fleethealth remediate`` processes, and reading a topic back.

Recordings are made with the simulator library and end two minutes before the wall clock (the
CLI's start is fixed in 2025): published as fast as the broker takes them, their samples are old,
never ahead of the detect worker's receive time, which corrects a sample stamped past
``--max-clock-skew`` ahead (a 40-minute recording that started now would run 40 minutes into the
future). The worker ages hosts on stream time (last sample ts + elapsed time since samples last
arrived) and resolves episodes on each host's own sample time, so an old recording behaves as live.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from detectors.engine.engine import DetectorEngine
from fleethealth.bus import iter_jsonl
from fleethealth.kafka_bus import KafkaBus
from fleethealth.schema import Incident, decode_incident, decode_sample
from simulator.engine import simulate
from simulator.plan import RunSpec

REPO = Path(__file__).resolve().parents[2]


def recording(tmp: Path, *, hosts: int, duration_s: float, interval_s: float = 30.0, seed: int = 7,
              fault_rate: float = 1.0, min_per_mode: int = 0, name: str = "fleet", lead_s: float | None = None) -> Path:
    """``lead_s``: start this far from now (default: end two minutes before now)."""
    out = tmp / f"{name}.jsonl"
    start = time.time() + (lead_s if lead_s is not None else -(duration_s + 120.0))
    spec = RunSpec(hosts=hosts, duration_s=duration_s, interval_s=interval_s, seed=seed, fault_rate=fault_rate,
                   min_per_mode=min_per_mode, start_ts=float(int(start)))
    simulate(spec, out)
    return out


def sample_keys(path: Path) -> set[tuple[str, int]]:
    """Every (host, seq) in a recording."""
    out = set()
    for _, raw in iter_jsonl(path):
        s = decode_sample(raw)
        out.add((s.host, s.seq))
    return out


def reference_incidents(path: Path) -> list[Incident]:
    """What one uninterrupted in-process DetectorEngine makes of the recording, in file order."""
    engine = DetectorEngine()
    out: list[Incident] = []
    for _, raw in iter_jsonl(path):
        out.extend(engine.feed(decode_sample(raw)))
    return out


def opened(incidents: Iterable[Incident], *, skip_modes: frozenset[str] = frozenset()) -> dict[str, Incident]:
    """id -> the first ``open`` incident of each episode."""
    out: dict[str, Incident] = {}
    for inc in incidents:
        if inc.state == "open" and inc.failure_mode not in skip_modes:
            out.setdefault(inc.id, inc)
    return out


def episode_keys(incidents: Iterable[Incident]) -> Counter[tuple[str, str, str]]:
    """(host, component, mode) -> number of distinct episode ids opened for it."""
    return Counter((i.host, i.component, i.failure_mode) for i in incidents)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHEALTH_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetcli.cli", "--log-format", "json", *args]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[str]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        return int(self.popen.returncode)

    def rss_kib(self) -> int:
        return rss_kib(self.popen.pid)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def spawn(name: str, args: list[str], tmp: Path, env: dict[str, str] | None = None) -> Proc:
    log = tmp / f"{name}.log"
    fh = log.open("w")
    p = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, text=True, env=env or clean_env(),
                         cwd=REPO, start_new_session=True)
    fh.close()
    return Proc(name, p, log)


def detect(name: str, tmp: Path, bootstrap: str, group: str, *extra: str) -> Proc:
    return spawn(name, cli("detect", "--bus", f"kafka:{bootstrap}", "--group", group, "--from-beginning",
                           "--metrics-port", "0", *extra), tmp)


def remediate(name: str, tmp: Path, bootstrap: str, group: str, db: Path, *extra: str,
              env: dict[str, str] | None = None) -> Proc:
    return spawn(name, cli("remediate", "--bus", f"kafka:{bootstrap}", "--group", group, "--state-db", str(db),
                           "--metrics-port", "0", "--max-incident-age", "86400", *extra), tmp, env)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def read_topic(bootstrap: str, topic: str, *, idle_s: float = 3.0, limit_s: float = 60.0) -> list[bytes]:
    """Every value on ``topic`` (all partitions, from the start), through a throwaway consumer group."""
    bus = KafkaBus(bootstrap, client_id="drill-reader")
    c = bus.consumer([topic], f"drill-reader-{uuid.uuid4().hex[:8]}")
    out: list[bytes] = []
    t0 = last = time.monotonic()
    try:
        while time.monotonic() - last < idle_s and time.monotonic() - t0 < limit_s:
            recs = c.poll(timeout=0.5, max_records=5000)
            if recs:
                out.extend(r.value for r in recs)
                last = time.monotonic()
    finally:
        c.close()
        bus.close()
    return out


def read_incidents(bootstrap: str, topic: str = "fleet.incidents.v1", **kw: float) -> list[Incident]:
    return [decode_incident(v) for v in read_topic(bootstrap, topic, **kw)]


def wait_until(pred, timeout: float, every: float = 0.5, what: str = "condition") -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def group_lag(bootstrap: str, group: str, topic: str) -> int | None:
    """Messages on ``topic`` not yet committed by ``group`` (None if the group committed nothing yet)."""
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="drill-lag", request_timeout_ms=5000)
        try:
            committed = admin.list_group_offsets(group).get(group, {})
        finally:
            admin.close()
    except KafkaError:  # coordinator not ready yet (group just formed, broker just restarted)
        return None
    mine = {tp: om.offset for tp, om in committed.items() if tp.topic == topic}
    if not mine:
        return None
    c = KafkaConsumer(bootstrap_servers=bootstrap, client_id="drill-lag")
    try:
        parts = c.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in parts]
        ends = c.end_offsets(tps)
    finally:
        c.close()
    return sum(ends[tp] - max(mine.get(tp, 0), 0) for tp in tps)


def committed(bootstrap: str, group: str, topic: str) -> int:
    """Sum of the group's committed offsets on ``topic`` (0 when none yet or the coordinator is busy)."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="drill-committed", request_timeout_ms=5000)
        try:
            offs = admin.list_group_offsets(group).get(group, {})
        finally:
            admin.close()
    except KafkaError:
        return 0
    return sum(max(om.offset, 0) for tp, om in offs.items() if tp.topic == topic)


def describe_group(bootstrap: str, group: str) -> tuple[str, int]:
    """(state, members) of a consumer group: ("Stable", 2), ("Empty", 0), ("PreparingRebalance", 1) ...;
    ("", 0) when the coordinator cannot be asked right now."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="drill-members", request_timeout_ms=5000)
        try:
            d = admin.describe_groups([group])
        finally:
            admin.close()
    except KafkaError:
        return "", 0
    g = d.get(group) if isinstance(d, dict) else None
    if not g:
        return "", 0
    return str(g.get("group_state", "")), len(g.get("members") or [])


def group_members(bootstrap: str, group: str) -> int:
    """Members of a consumer group in a stable state (0 while it rebalances or cannot be asked)."""
    state, n = describe_group(bootstrap, group)
    return n if state.lower() == "stable" else 0
