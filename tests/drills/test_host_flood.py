"""Drill: 4,000 forged host names through the real broker into ``fleethealth detect`` (review F9).

Each forged name sends one realistic 8-GPU sample (about 11 KiB of JSON) after 20 honest hosts have
warmed up. Three real workers, one after the other, each on a fresh topic:

* ``--host-allowlist`` (the 20 honest hosts): every forged sample is dead-lettered before it is
  decoded; no host state, RSS growth only the client's buffers;
* ``--max-hosts 400``: state for at most 400 hosts (the rest dead-lettered: none is silent yet;
  under a flood the free places go to whoever comes first: the bound protects memory, the allowlist
  the honest hosts);
* the default bound (25,000): all 4,000 kept. Its RSS growth per host is the figure behind the bound
  (the default bound times it is the most host state can take).

RSS comes from /proc after the honest warm-up was consumed (before the flood is published) and
after the flood is consumed.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from fleethealth.kafka_bus import KafkaBus, ensure_topics
from fleethealth.schema import DEADLETTER as DL_CODEC
from fleethealth.schema import encode
from simulator.fixtures import HostSeries
from tests.drills import harness as h

pytestmark = [pytest.mark.drill, pytest.mark.kafka, pytest.mark.slow]
FORGED = 4_000
HONEST = 20
MAX_HOSTS = 400


def _publish(bootstrap: str, topic: str, records: list[tuple[str, bytes]]) -> None:
    bus = KafkaBus(bootstrap, client_id="drill-flood")
    try:
        for i, (key, raw) in enumerate(records):
            bus.publish(topic, key, raw)
            if i % 500 == 499:
                bus.flush()
        bus.flush()
    finally:
        bus.close()


def _run(tmp: Path, name: str, bootstrap: str, warm: list[tuple[str, bytes]], flood: list[tuple[str, bytes]],
         *extra: str) -> tuple[int, int, str, list[bytes]]:
    """One worker on a fresh topic: the honest warm-up, RSS, the flood, RSS."""
    tag = uuid.uuid4().hex[:6]
    topic, dead = f"drill.flood.{tag}.telemetry", f"drill.flood.{tag}.deadletter"
    ensure_topics(bootstrap, [topic], 4)
    group = f"drill-flood-{name}-{tag}"
    _publish(bootstrap, topic, warm)
    det = h.detect(name, tmp, bootstrap, group, "--topic", topic, "--incidents-topic", f"drill.flood.{tag}.incidents",
                   "--deadletter-topic", dead, *extra)
    try:
        h.wait_until(lambda: h.committed(bootstrap, group, topic) >= len(warm), 180, 0.5, f"{name}: warm-up")
        time.sleep(2)
        before = det.rss_kib()
        _publish(bootstrap, topic, flood)
        h.wait_until(lambda: h.committed(bootstrap, group, topic) >= len(warm) + len(flood), 600, 1.0,
                     f"{name}: the flood")
        after = det.rss_kib()
        assert det.alive(), det.text()[-3000:]
    finally:
        det.stop()
    return before, after, det.text().strip().splitlines()[-1], h.read_topic(bootstrap, dead, idle_s=2.0)


def test_forged_host_names_cost_bounded_memory(tmp_path: Path, kafka_bootstrap: str) -> None:
    honest = [HostSeries(f"real-{i:02d}", interval=10.0) for i in range(HONEST)]
    allow = tmp_path / "hosts.txt"
    allow.write_text("# the inventory\n" + "".join(f"{s.base.host}\n" for s in honest))
    warm = [(s.base.host, encode(s.advance())) for _ in range(3) for s in honest]
    flood = [(f"forged-{i:05d}", encode(HostSeries(f"forged-{i:05d}", t0=honest[0].ts).advance()))
             for i in range(FORGED)]
    total = len(warm) + FORGED

    figures = {}
    for name, extra in (("allowlist", ("--host-allowlist", str(allow))),
                        ("bounded", ("--max-hosts", str(MAX_HOSTS))),
                        ("default", ())):
        before, after, summary, letters = _run(tmp_path, name, kafka_bootstrap, warm, flood, *extra)
        figures[name] = (before, after, summary, len(letters))
        if name == "allowlist":
            assert len(letters) == FORGED and "not in the host allowlist" in DL_CODEC.decode(letters[0]).reason
            assert summary.startswith(f"{len(warm)} samples"), summary
        elif name == "bounded":
            # the honest hosts hold state first; at most MAX_HOSTS hosts hold any (none is silent
            # yet, so none is evicted): every other forged sample is refused
            assert len(letters) == FORGED - (MAX_HOSTS - HONEST), summary
            assert all("--max-hosts" in DL_CODEC.decode(d).reason for d in letters[:50])
        else:
            assert len(letters) == 0 and summary.startswith(f"{total} samples"), summary

    grow = {k: (v[1] - v[0]) for k, v in figures.items()}
    per_host = grow["default"] / FORGED
    assert grow["allowlist"] < 64 * 1024, grow  # KiB: client buffers, no host state
    assert grow["bounded"] < grow["default"] / 3, grow
    size = sum(len(r) for _, r in flood) / FORGED / 1024
    print(f"host flood: {FORGED} forged hosts, {size:.1f} KiB samples; RSS growth "
          f"allowlist {grow['allowlist'] / 1024:.0f} MiB, --max-hosts {MAX_HOSTS} {grow['bounded'] / 1024:.0f} MiB "
          f"({grow['bounded'] / (MAX_HOSTS - HONEST):.0f} KiB/host), all kept {grow['default'] / 1024:.0f} MiB = "
          f"{per_host:.0f} KiB/host -> default bound 25,000 hosts ~ {per_host * 25_000 / 1024 / 1024:.1f} GiB; "
          f"{figures}")
