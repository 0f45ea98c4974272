"""Drill: 10,000 forged host names through the real broker into ``fleethealth detect`` (review F9).

Each forged name sends one realistic 8-GPU sample (about 11 KiB of JSON) among 20 honest hosts. The
same topic is read by three real workers, one after the other:

* ``--host-allowlist`` (the 20 honest hosts): every forged sample is dead-lettered before it is
  decoded; no host state, RSS growth only the client's buffers;
* ``--max-hosts 1000``: state for at most 1,000 hosts (the rest dead-lettered: none is silent yet);
* the default bound (25,000): all 10,000 kept. Its RSS growth per host is the figure behind the bound
  (the default bound times it is the most host state can take).

RSS comes from /proc before (after the honest warm-up) and after the flood is consumed.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from fleethealth.kafka_bus import KafkaBus, ensure_topics
from fleethealth.schema import DEADLETTER as DL_CODEC
from fleethealth.schema import encode
from simulator.fixtures import HostSeries
from tests.drills import harness as h

pytestmark = [pytest.mark.drill, pytest.mark.kafka, pytest.mark.slow]
FORGED = 10_000
HONEST = 20
MAX_HOSTS = 1000


def _run(tmp: Path, name: str, bootstrap: str, topics: dict[str, str], honest: int, total: int,
         *extra: str) -> tuple[int, int, str]:
    group = f"drill-flood-{name}-{uuid.uuid4().hex[:6]}"
    det = h.detect(name, tmp, bootstrap, group, "--topic", topics["t"], "--incidents-topic", topics["i"] + name,
                   "--deadletter-topic", topics["d"] + name, *extra)
    try:
        h.wait_until(lambda: h.committed(bootstrap, group, topics["t"]) >= honest, 180, 0.5, f"{name}: warm-up")
        before = det.rss_kib()
        h.wait_until(lambda: h.committed(bootstrap, group, topics["t"]) >= total, 600, 1.0, f"{name}: the flood")
        after = det.rss_kib()
        assert det.alive(), det.text()[-3000:]
    finally:
        det.stop()
    return before, after, det.text().strip().splitlines()[-1]


def test_forged_host_names_cost_bounded_memory(tmp_path: Path, kafka_bootstrap: str) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = {"t": f"drill.flood.{tag}.telemetry", "i": f"drill.flood.{tag}.incidents.",
              "d": f"drill.flood.{tag}.deadletter."}
    ensure_topics(kafka_bootstrap, [topics["t"]], 4)
    honest = [HostSeries(f"real-{i:02d}", interval=10.0) for i in range(HONEST)]
    allow = tmp_path / "hosts.txt"
    allow.write_text("# the inventory\n" + "".join(f"{s.base.host}\n" for s in honest))
    bus = KafkaBus(kafka_bootstrap, client_id="drill-flood")
    sizes = []
    try:
        for _ in range(3):  # warm-up: every honest host known
            for s in honest:
                bus.publish(topics["t"], s.base.host, encode(s.advance()))
        bus.flush()
        for i in range(FORGED):
            raw = encode(HostSeries(f"forged-{i:05d}", t0=honest[0].ts).advance())
            sizes.append(len(raw))
            bus.publish(topics["t"], f"forged-{i:05d}", raw)
            if i % 500 == 0:
                bus.flush()
        bus.flush()
    finally:
        bus.close()
    warm, total = 3 * HONEST, 3 * HONEST + FORGED

    figures = {}
    for name, extra in (("allowlist", ("--host-allowlist", str(allow))),
                        ("bounded", ("--max-hosts", str(MAX_HOSTS))),
                        ("default", ())):
        before, after, summary = _run(tmp_path, name, kafka_bootstrap, topics, warm, total, *extra)
        letters = h.read_topic(kafka_bootstrap, topics["d"] + name, idle_s=2.0)
        figures[name] = (before, after, summary, len(letters))
        if name == "allowlist":
            assert len(letters) == FORGED and "not in the host allowlist" in DL_CODEC.decode(letters[0]).reason
            assert summary.startswith(f"{warm} samples"), summary
        elif name == "bounded":
            assert len(letters) == FORGED - (MAX_HOSTS - HONEST), summary
            assert "--max-hosts" in DL_CODEC.decode(letters[-1]).reason
        else:
            assert len(letters) == 0 and summary.startswith(f"{total} samples"), summary

    grow = {k: (v[1] - v[0]) for k, v in figures.items()}
    per_host = grow["default"] / FORGED
    assert grow["allowlist"] < 64 * 1024, grow  # KiB: client buffers, no host state
    assert grow["bounded"] < grow["default"] / 3, grow
    print(f"host flood: {FORGED} forged hosts, {sum(sizes) / len(sizes) / 1024:.1f} KiB samples; RSS growth "
          f"allowlist {grow['allowlist'] / 1024:.0f} MiB, --max-hosts {MAX_HOSTS} {grow['bounded'] / 1024:.0f} MiB, "
          f"all kept {grow['default'] / 1024:.0f} MiB = {per_host:.0f} KiB/host -> default bound 25,000 hosts ~ "
          f"{per_host * 25_000 / 1024 / 1024:.1f} GiB; {figures}")
