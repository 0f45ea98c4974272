"""The real-service harness (scripts/services.sh): each service answers and is set up as the tests expect.

Skips when the services are not running, fails instead with FLEETHEALTH_REQUIRE_SERVICES=1 (make test).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request

import pytest

from tests.services import FLEET_TOPICS


@pytest.mark.kafka
def test_kafka_has_the_fleet_topics_with_8_partitions(kafka_bootstrap: str) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="harness-test")
    try:
        topics = set(admin.list_topics())
    finally:
        admin.close()
    assert set(FLEET_TOPICS) <= topics, f"missing topics: {set(FLEET_TOPICS) - topics}"
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap)
    try:
        for topic in FLEET_TOPICS:
            assert len(consumer.partitions_for_topic(topic) or ()) == 8, topic
    finally:
        consumer.close()


@pytest.mark.prometheus
def test_prometheus_is_ready_and_scrapes_the_fleet_ports(prometheus_url: str) -> None:
    with urllib.request.urlopen(prometheus_url + "/-/ready", timeout=5) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(prometheus_url + "/api/v1/status/config", timeout=5) as resp:
        config = json.load(resp)["data"]["yaml"]
    for port in (9401, 9402, 9403, 9404):
        assert f"127.0.0.1:{port}" in config
    assert "scrape_interval: 1s" in config


def _scontrol(*args: str) -> str:
    out = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, f"scontrol {' '.join(args)}: {out.stdout}{out.stderr}"
    return out.stdout


def _sinfo_state(node: str) -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


@pytest.mark.slurm
def test_slurm_knows_the_gpu_nodes(slurm_conf: str, slurm_local_node: str) -> None:
    assert os.environ["SLURM_CONF"] == slurm_conf
    assert "NodeName=gpu-node-001" in _scontrol("show", "node", "gpu-node-001")
    assert "NodeName=gpu-node-008" in _scontrol("show", "node", "gpu-node-008")
    assert _sinfo_state(slurm_local_node) in {"idle", "mixed", "allocated", "completing"}


@pytest.mark.slurm
def test_slurm_gpu_node_drains_and_resumes(slurm_conf: str) -> None:
    node = "gpu-node-008"
    _scontrol("update", f"NodeName={node}", "State=DRAIN", "Reason=fleethealth harness test")
    try:
        assert _sinfo_state(node) in {"drained", "draining"}
        assert "Reason=fleethealth harness test" in _scontrol("show", "node", node)
    finally:
        _scontrol("update", f"NodeName={node}", "State=RESUME")
    # RESUME shows idle* (not responding) until slurmctld's next ping round, then idle.
    deadline = time.monotonic() + 30
    while _sinfo_state(node) != "idle" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _sinfo_state(node) == "idle"


@pytest.mark.slurm
def test_slurm_runs_a_job_on_the_local_node(slurm_conf: str, slurm_local_node: str) -> None:
    out = subprocess.run(["srun", "-w", slurm_local_node, "-t", "1", "hostname"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
