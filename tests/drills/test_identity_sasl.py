"""Drill: host identity on a private broker with SASL/SCRAM and ACLs (docs/security.md).

The broker (tests/drills/private_kafka.py, ``users=``) authenticates every client with SCRAM-SHA-256
and authorizes with ACLs: collectors may write only ``fleet.telemetry.v1``, the detect worker may read
it and write incidents and dead letters, nobody else may do anything. A Kafka consumer cannot see
which principal produced a record, so the detect worker checks the per-host signature
(``--identity-secret``): collector-b, a legitimate collector, signs with its own key while claiming
node-a's name (a GPU that fell off the bus), and a second forger does not sign at all.

Asserted: the ACLs refuse the unauthorised writes (an authenticated principal without ACLs, a
collector writing incidents); the real ``fleethealth collect`` signs and is accepted under the
config's ``[kafka]`` SASL settings; every forged record is dead-lettered with an identity reason and
opens no incident for node-a; the honest hosts' samples are all fed.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from fleethealth.bus import DEADLETTER, INCIDENTS, TELEMETRY
from fleethealth.schema import DEADLETTER as DL_CODEC
from fleethealth.schema import decode_incident
from tests.drills import harness as h
from tests.drills.private_kafka import PrivateKafka, kafka_libs

pytestmark = [pytest.mark.drill, pytest.mark.kafka, pytest.mark.slow]
GROUP = "drill-identity"
POLLS = 6


def _config(tmp: Path, name: str, broker: PrivateKafka, user: str) -> Path:
    sec = broker.client(user)
    body = "".join(f'{k} = "{v}"\n' for k, v in sec.items())
    p = tmp / f"{name}.toml"
    p.write_text(f'[kafka]\nbootstrap = "{broker.bootstrap}"\n\n[kafka.security]\n{body}')
    os.chmod(p, 0o600)
    return p


def _private(path: Path, text: str) -> Path:
    path.write_text(text)
    os.chmod(path, 0o600)
    return path


def _read(broker: PrivateKafka, topic: str, idle_s: float = 3.0) -> list[bytes]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False,
                      client_id="drill-reader", **broker.client("admin"))
    try:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or [])]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        out: list[bytes] = []
        last = time.monotonic()
        while time.monotonic() - last < idle_s:
            for msgs in c.poll(timeout_ms=500).values():
                out.extend(m.value for m in msgs)
                last = time.monotonic()
        return out
    finally:
        c.close()


def _refused(broker: PrivateKafka, user: str, topic: str) -> str:
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    p = KafkaProducer(bootstrap_servers=broker.bootstrap, max_block_ms=15000, **broker.client(user))
    try:
        p.send(topic, key=b"node-a", value=b"{}").get(20)
    except KafkaError as exc:
        return type(exc).__name__
    finally:
        p.close(5)
    return ""


def _collect(tmp: Path, name: str, cfg: Path, host: str, *extra: str) -> subprocess.CompletedProcess[str]:
    args = h.cli("--config", str(cfg), "collect", "--simulate", "--host", host, "--sink", "kafka", "--polls",
                 str(POLLS), "--interval", "0.5", "--exporter-port", "0", "--sim-gpus", "4",
                 "--state-dir", str(tmp / name), *extra)
    return subprocess.run(args, capture_output=True, text=True, timeout=240, cwd=h.REPO, env=h.clean_env())


def test_sasl_acls_and_host_signatures_keep_a_host_speaking_only_for_itself(tmp_path: Path) -> None:
    if not (kafka_libs() / ".complete").exists():
        pytest.skip("no cached Kafka jars (scripts/services.sh up kafka)")
    users = {u: secrets.token_hex(8) for u in ("collector-a", "collector-b", "detect", "intruder")}
    broker = PrivateKafka(tmp_path / "kafka", users=users)
    broker.start()
    det = None
    try:
        broker.create_topics([TELEMETRY, INCIDENTS, DEADLETTER], 4)
        for u in ("collector-a", "collector-b"):
            broker.allow(u, "TOPIC", TELEMETRY, "WRITE", "DESCRIBE")
        broker.allow("detect", "TOPIC", TELEMETRY, "READ", "DESCRIBE")
        broker.allow("detect", "TOPIC", INCIDENTS, "WRITE", "DESCRIBE")
        broker.allow("detect", "TOPIC", DEADLETTER, "WRITE", "DESCRIBE")
        broker.allow("detect", "GROUP", GROUP, "READ", "DESCRIBE")

        # the ACLs: an authenticated principal without ACLs writes nothing; a collector cannot skip
        # the detectors and write incidents for remediation to act on
        assert _refused(broker, "intruder", TELEMETRY) == "TopicAuthorizationFailedError"
        assert _refused(broker, "collector-a", INCIDENTS) == "TopicAuthorizationFailedError"

        secret = _private(tmp_path / "secret", secrets.token_hex(32))
        keys = {}
        for host in ("node-a", "node-b"):
            out = subprocess.run(h.cli("identity-key", host, "--secret-file", str(secret)), capture_output=True,
                                 text=True, timeout=120, cwd=h.REPO, env=h.clean_env())
            assert out.returncode == 0, out.stderr[-2000:]
            keys[host] = _private(tmp_path / f"{host}.key", out.stdout.strip())
        cfg = {u: _config(tmp_path, u, broker, u) for u in ("collector-a", "collector-b", "detect")}

        det = h.spawn("detect", h.cli("--config", str(cfg["detect"]), "detect", "--bus", "kafka", "--group", GROUP,
                                      "--from-beginning", "--metrics-port", "0", "--identity-secret", str(secret)),
                      tmp_path)
        runs = {
            "a": _collect(tmp_path, "a", cfg["collector-a"], "node-a", "--identity-key", str(keys["node-a"])),
            "b": _collect(tmp_path, "b", cfg["collector-b"], "node-b", "--identity-key", str(keys["node-b"])),
            # collector-b may write telemetry, but signs with node-b's key while claiming node-a
            "forged": _collect(tmp_path, "forged", cfg["collector-b"], "node-a", "--identity-key", str(keys["node-b"]),
                               "--inject", "gpu_fell_off_bus@2"),
            "unsigned": _collect(tmp_path, "unsigned", cfg["collector-b"], "node-a", "--inject", "gpu_fell_off_bus@1"),
        }
        for name, r in runs.items():
            assert r.returncode == 0, (name, r.stderr[-3000:])
        sent = len(_read(broker, TELEMETRY, idle_s=2.0))
        assert sent == 4 * POLLS, sent

        deadline = time.monotonic() + 120
        letters: list = []
        while time.monotonic() < deadline:
            letters = [DL_CODEC.decode(v) for v in _read(broker, DEADLETTER, idle_s=1.5)]
            if len(letters) >= 2 * POLLS:
                break
            assert det.alive(), det.text()[-3000:]
        time.sleep(3)
        code = det.stop()
        summary = det.text().strip().splitlines()[-1]
        assert code == 0, det.text()[-3000:]
        letters = [DL_CODEC.decode(v) for v in _read(broker, DEADLETTER, idle_s=1.5)]
        incidents = [decode_incident(v) for v in _read(broker, INCIDENTS, idle_s=1.5)]
    finally:
        if det is not None and det.alive():
            det.kill()
        broker.stop(hard=True)

    reasons = sorted(d.reason.split(":")[0] for d in letters)
    assert reasons == sorted(["fh-sig does not verify with 'node-a''s host key"] * POLLS
                             + ["no fh-sig header"] * POLLS), reasons
    assert summary.startswith(f"{2 * POLLS} samples"), summary  # node-a's and node-b's own, all fed
    forged = [i for i in incidents if i.host == "node-a" and i.failure_mode == "gpu_fell_off_bus"]
    assert forged == [], forged
    print(f"identity drill: {sent} records ({2 * POLLS} honest, {2 * POLLS} forged) over SASL/SCRAM with ACLs; "
          f"{len(letters)} dead letters ({reasons[0]!r}, ...); worker: {summary}; "
          f"incidents: {sorted({(i.host, i.failure_mode) for i in incidents})}")
