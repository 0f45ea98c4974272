"""The detect worker at the trust boundary (DESIGN.md): time is the receiver's, a host speaks only
for itself, unknown hosts cost no state, host state is bounded, a bad field costs only itself.
Everything through the real worker on the in-process bus, with a fake wall and monotonic clock."""

from __future__ import annotations

import msgspec
import pytest

from detectors.engine.engine import DetectorEngine
from detectors.worker.worker import DetectWorker
from fleethealth.bus import DEADLETTER, INCIDENTS, TELEMETRY, InProcessBus
from fleethealth.identity import HEADER, Verifier, host_key, sign
from fleethealth.schema import DEADLETTER as DL
from fleethealth.schema import decode_incident, encode
from simulator.fixtures import HostSeries

replace = msgspec.structs.replace
T0 = 1_764_000_000.0
DAY = 86_400.0


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def lost(s):
    s.gpus[3] = replace(s.gpus[3], present=False, nvml_error="GPU_IS_LOST")


def _fleet(n: int, interval: float = 10.0) -> list[HostSeries]:
    return [HostSeries(f"gpu-node-{i:03d}", t0=T0, interval=interval) for i in range(n)]


def _worker(bus, wall, mono, **kw) -> DetectWorker:
    return DetectWorker(bus, DetectorEngine(), group="g", poll_timeout=0.0, clock=wall, monotonic=mono, **kw)


def _incidents(bus):
    return [decode_incident(r.value) for r in bus.records(INCIDENTS)]


def _letters(bus):
    return [DL.decode(r.value) for r in bus.records(DEADLETTER)]


def _poll(w, hosts, bus, wall, mono, fn=None):
    for h in hosts:
        bus.publish(TELEMETRY, h.base.host, encode(h.advance(fn if h is hosts[0] else None)))
    wall.t += hosts[0].interval
    mono.t += hosts[0].interval
    w.run_once()


def test_future_past_and_max_seq_samples_flag_no_other_host_and_a_later_xid_79_counts():
    """The review's F5 scenario: one sample +11 days, one -1 day, one seq 2**64-1 among 20 hosts."""
    bus, wall, mono = InProcessBus(), Clock(T0), Clock(0.0)
    fleet = _fleet(20)
    w = _worker(bus, wall, mono)
    for _ in range(5):
        _poll(w, fleet, bus, wall, mono)
    ahead, behind, maxseq = fleet[1], fleet[2], fleet[3]
    s = ahead.advance()
    bus.publish(TELEMETRY, s.host, encode(replace(s, ts=s.ts + 11 * DAY)))
    s = behind.advance()
    bus.publish(TELEMETRY, s.host, encode(replace(s, ts=s.ts - DAY)))
    s = maxseq.advance()
    bus.publish(TELEMETRY, s.host, encode(replace(s, seq=2**64 - 1)))
    w.run_once()
    assert (w.stats.clock_ahead, w.stats.clock_behind) == (1, 1)
    for _ in range(60):  # ten minutes of live fleet
        _poll(w, fleet, bus, wall, mono)
    unreachable = [i.host for i in _incidents(bus) if i.failure_mode == "host_unreachable"]
    assert unreachable == [], unreachable
    assert w._fleet_now() <= wall.t
    # the host that sent seq 2**64-1: its count goes on from where it was, and a GPU that falls off counts
    order = [maxseq] + [h for h in fleet if h is not maxseq]
    for _ in range(3):
        _poll(w, order, bus, wall, mono, lost)
    fell = [i for i in _incidents(bus) if i.failure_mode == "gpu_fell_off_bus"]
    assert [i.host for i in fell if i.state == "open"] == [maxseq.base.host]
    assert w.engine.stats["out_of_order"] == 0 and w.engine.stats["seq_restart"] == 1


def test_a_host_whose_clock_runs_an_hour_fast_does_not_age_the_others():
    bus, wall, mono = InProcessBus(), Clock(T0), Clock(0.0)
    fleet = _fleet(8, interval=30.0)
    fast = fleet[0]
    fast.base = replace(fast.base, ts=fast.base.ts + 3600)
    w = _worker(bus, wall, mono)
    for _ in range(40):
        _poll(w, fleet, bus, wall, mono)
    assert [i.host for i in _incidents(bus) if i.failure_mode == "host_unreachable"] == []
    assert w.stats.clock_ahead == 40
    assert w.engine.hosts[fast.base.host].last_ts <= wall.t  # held to the receive time


def test_a_host_a_day_behind_is_counted_and_flagged_once_without_flapping():
    bus, wall, mono = InProcessBus(), Clock(T0), Clock(0.0)
    fleet = _fleet(4)
    slow = fleet[0]
    w = _worker(bus, wall, mono)
    for _ in range(3):
        _poll(w, fleet, bus, wall, mono)
    slow.base = replace(slow.base, ts=slow.base.ts - DAY)
    for _ in range(330):  # 55 minutes: past the 45-minute staleness limit
        _poll(w, fleet, bus, wall, mono)
    mine = [(i.host, i.state) for i in _incidents(bus) if i.failure_mode == "host_unreachable"]
    assert mine == [(slow.base.host, "open")]  # its telemetry speaks of yesterday: one episode, no flapping
    assert w.stats.clock_behind == 330


def test_unknown_hosts_are_dead_lettered_and_keep_no_state():
    bus, wall, mono = InProcessBus(), Clock(T0), Clock(0.0)
    fleet = _fleet(3)
    w = _worker(bus, wall, mono, host_allowlist=frozenset(h.base.host for h in fleet))
    for i in range(200):
        s = HostSeries(f"forged-{i}", t0=T0).advance(lost)
        bus.publish(TELEMETRY, s.host, encode(s))
        bus.publish(TELEMETRY, None, encode(replace(s, host=f"keyless-{i}")))
    _poll(w, fleet, bus, wall, mono)
    assert sorted(w.engine.hosts) == sorted(h.base.host for h in fleet)
    assert len(w._decoder) == 3 and set(w._host_tp) == set(w.engine.hosts)
    letters = _letters(bus)
    assert len(letters) == 400 and all("not in the host allowlist" in d.reason for d in letters)
    assert w.stats.by_reason == {"unknown_host": 400}
    assert [i for i in _incidents(bus) if i.host.startswith(("forged", "keyless"))] == []


def test_max_hosts_evicts_a_silent_host_and_refuses_when_none_is():
    bus, wall, mono = InProcessBus(), Clock(T0), Clock(0.0)
    fleet = _fleet(3)
    w = _worker(bus, wall, mono, max_hosts=3)
    for _ in range(3):
        _poll(w, fleet, bus, wall, mono)
    new = HostSeries("gpu-node-new", t0=T0)
    new.seq = fleet[0].seq
    bus.publish(TELEMETRY, "gpu-node-new", encode(new.advance()))
    w.run_once()
    assert "gpu-node-new" not in w.engine.hosts and w.stats.by_reason == {"host_limit": 1}
    for _ in range(400):  # gpu-node-000 goes silent for 4000 s
        _poll(w, fleet[1:], bus, wall, mono)
    new.seq = fleet[1].seq
    bus.publish(TELEMETRY, "gpu-node-new", encode(new.advance()))
    w.run_once()
    assert sorted(w.engine.hosts) == ["gpu-node-001", "gpu-node-002", "gpu-node-new"]
    assert w.stats.hosts_evicted == 1 and "gpu-node-000" not in w._decoder._hosts


def test_with_an_identity_secret_a_host_speaks_only_for_itself():
    secret = bytes(range(40))
    bus, wall, mono = InProcessBus(), Clock(T0), Clock(0.0)
    a, b = _fleet(2)
    w = _worker(bus, wall, mono, verifier=Verifier(secret))
    sa = encode(a.advance())
    bus.publish(TELEMETRY, a.base.host, sa, ((HEADER, sign(host_key(secret, a.base.host), a.base.host, sa)),))
    forged = encode(b.advance(lost))  # signed by a's key, claiming b
    bus.publish(TELEMETRY, b.base.host, forged, ((HEADER, sign(host_key(secret, a.base.host), b.base.host, forged)),))
    bus.publish(TELEMETRY, b.base.host, forged)  # unsigned
    wall.t += 10
    w.run_once()
    assert sorted(w.engine.hosts) == [a.base.host]
    assert w.stats.by_reason == {"identity": 2}
    assert {d.reason.split(":")[0] for d in _letters(bus)} == {"fh-sig does not verify with 'gpu-node-001'"
                                                               "'s host key", "no fh-sig header"}


def test_a_bad_field_is_dead_lettered_with_its_path_and_the_sample_still_counts():
    bus, wall, mono = InProcessBus(), Clock(T0), Clock(0.0)
    (h,) = _fleet(1)
    w = _worker(bus, wall, mono)
    _poll(w, [h], bus, wall, mono)
    doc = msgspec.to_builtins(h.advance(lost))
    doc["gpus"][0]["ecc"]["dram_corrected_volatile"] = 10**4000
    bus.publish(TELEMETRY, h.base.host, msgspec.json.encode(doc))
    w.run_once()
    (letter,) = _letters(bus)
    assert "$.gpus[0].ecc.dram_corrected_volatile" in letter.reason and "rest of the sample" in letter.reason
    assert w.stats.fields_rejected == 1 and w.stats.samples == 2
    _poll(w, [h], bus, wall, mono, lost)
    assert "gpu_fell_off_bus" in {i.failure_mode for i in _incidents(bus)}


@pytest.mark.parametrize("skew", [0.0])
def test_max_clock_skew_zero_switches_the_correction_off(skew):
    bus, wall, mono = InProcessBus(), Clock(T0), Clock(0.0)
    (h,) = _fleet(1)
    w = _worker(bus, wall, mono, max_clock_skew=skew)
    s = h.advance()
    bus.publish(TELEMETRY, s.host, encode(replace(s, ts=s.ts + DAY)))
    w.run_once()
    assert w.stats.clock_ahead == 0 and w.engine.hosts[s.host].last_ts == s.ts + DAY
