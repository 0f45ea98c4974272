"""Drill: the receiver's clock and sequence numbers through the real broker (review F5).

20 hosts send live samples (stamped with the wall clock, one a second) through Kafka
(127.0.0.1:9092, fresh topics) into a real ``fleethealth detect``. Mid-run one host sends a sample
stamped 11 days ahead, another one stamped a day behind, a third one with seq 2**64-1; later that
third host's GPU falls off the bus (Xid 79 and GPU_IS_LOST).

Before the fix, the +11-day sample moved the stream clock and all 19 other hosts opened
``host_unreachable``; the 2**64-1 seq made the engine drop that host's later samples, so the Xid 79
was never reported. Asserted: no host is flagged unreachable, the skew is counted (the worker's
last log line), and the GPU that fell off the bus is reported on that host.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import msgspec
import pytest

from fleethealth.kafka_bus import KafkaBus, ensure_topics
from fleethealth.schema import XidEvent, encode
from simulator.fixtures import HostSeries
from tests.drills import harness as h

pytestmark = [pytest.mark.drill, pytest.mark.kafka, pytest.mark.slow]
HOSTS = 20
DAY = 86_400.0
replace = msgspec.structs.replace


def _lost(s):
    g = s.gpus[3]
    s.gpus[3] = replace(g, present=False, nvml_error="GPU_IS_LOST",
                        xids=[XidEvent(xid=79, ts=s.ts, message="GPU has fallen off the bus.")])


def test_future_past_and_max_seq_samples_disturb_no_other_host(tmp_path: Path, kafka_bootstrap: str) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = {"t": f"drill.clock.{tag}.telemetry", "i": f"drill.clock.{tag}.incidents",
              "d": f"drill.clock.{tag}.deadletter"}
    ensure_topics(kafka_bootstrap, list(topics.values()), 4)
    group = f"drill-clock-{tag}"
    det = h.detect("detect", tmp_path, kafka_bootstrap, group, "--topic", topics["t"], "--incidents-topic", topics["i"],
                   "--deadletter-topic", topics["d"])
    bus = KafkaBus(kafka_bootstrap, client_id="drill-clock")
    t0 = float(int(time.time()))
    fleet = [HostSeries(f"clock-{i:02d}", t0=t0, interval=1.0) for i in range(HOSTS)]
    ahead, behind, maxseq = fleet[1], fleet[2], fleet[3]
    try:
        h.wait_until(lambda: h.group_members(kafka_bootstrap, group) == 1, 60, 0.3, "detect to join")
        for k in range(30):
            start = time.monotonic()
            for host in fleet:
                s = host.advance(_lost if host is maxseq and k >= 22 else None)
                if k == 8 and host is ahead:
                    s = replace(s, ts=s.ts + 11 * DAY)
                elif k == 8 and host is behind:
                    s = replace(s, ts=s.ts - DAY)
                elif k == 8 and host is maxseq:
                    s = replace(s, seq=2**64 - 1)
                bus.publish(topics["t"], s.host, encode(s))
            bus.flush()
            time.sleep(max(0.0, 1.0 - (time.monotonic() - start)))
        h.wait_until(lambda: h.group_lag(kafka_bootstrap, group, topics["t"]) == 0, 120, 0.5, "the worker to catch up")
        time.sleep(5)  # a few idle ticks at the worker's clock
        assert det.alive(), det.text()[-3000:]
    finally:
        bus.close()
        code = det.stop()
    assert code == 0, det.text()[-3000:]
    incidents = h.read_incidents(kafka_bootstrap, topics["i"], idle_s=2.0)
    unreachable = sorted({i.host for i in incidents if i.failure_mode == "host_unreachable"})
    assert unreachable == [], f"{len(unreachable)} of {HOSTS - 1} other hosts flagged: {unreachable}"
    fell = sorted({i.host for i in incidents if i.failure_mode == "gpu_fell_off_bus"})
    assert fell == [maxseq.base.host], fell
    lines = [json.loads(x) for x in det.text().splitlines() if x.startswith("{")]
    last = next(x["msg"] for x in reversed(lines) if "clock skew" in x.get("msg", ""))
    assert "clock skew: 1 ahead (corrected), 1 behind" in last, last
    print(f"clock drill: {HOSTS} hosts x 30 s live; +11 d, -1 d and seq 2**64-1 samples: "
          f"{len(unreachable)} other hosts flagged host_unreachable (review F5 measured {HOSTS - 1} of {HOSTS - 1} before); "
          f"gpu_fell_off_bus reported on {fell}; worker: {last}")
