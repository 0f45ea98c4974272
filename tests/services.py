"""Session fixtures for the real services started by ``scripts/services.sh`` (``make services-up``).

Each fixture checks that its service answers and returns how to reach it. When it does not answer,
the test is skipped with the reason, or fails when ``FLEETHEALTH_REQUIRE_SERVICES=1`` (as in
``make test`` and CI), so a missing service can never turn into a silently green run.

Environment (all optional; defaults match scripts/services.sh):
  FLEETHEALTH_KAFKA        Kafka bootstrap, default 127.0.0.1:9092
  FLEETHEALTH_PROMETHEUS   Prometheus base URL, default http://127.0.0.1:9090
  SLURM_CONF               slurm.conf of the test cluster, default <repo>/.services/slurm/slurm.conf
  FLEETHEALTH_REQUIRE_SERVICES=1   fail instead of skip

Imported into tests/conftest.py; add new fixtures to ``__all__``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import NoReturn

import pytest

__all__ = [
    "FLEET_TOPICS",
    "kafka_bootstrap",
    "prometheus_url",
    "require_services",
    "slurm_conf",
    "slurm_local_node",
]

REPO = Path(__file__).resolve().parents[1]
FLEET_TOPICS = ("fleet.telemetry.v1", "fleet.incidents.v1", "fleet.actions.v1", "fleet.deadletter.v1")
START_HINT = "start it with `make services-up` (scripts/services.sh up)"


def require_services() -> bool:
    return os.environ.get("FLEETHEALTH_REQUIRE_SERVICES", "") == "1"


def _unavailable(what: str, why: str) -> NoReturn:
    msg = f"{what} is not answering: {why}; {START_HINT}"
    if require_services():
        pytest.fail(msg + " [FLEETHEALTH_REQUIRE_SERVICES=1]", pytrace=False)
    pytest.skip(msg + " (set FLEETHEALTH_REQUIRE_SERVICES=1 to fail instead of skip)")


def _tcp_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def kafka_problem(bootstrap: str) -> str | None:
    """None if the broker answers a metadata request, else why not."""
    host, _, port = bootstrap.rpartition(":")
    if not _tcp_open(host or "127.0.0.1", int(port)):
        return f"no TCP listener at {bootstrap}"
    try:
        from kafka import KafkaAdminClient
    except ImportError as exc:  # pragma: no cover - kafka-python is a dependency
        return f"kafka-python not importable: {exc}"
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000,
                                 client_id="fleethealth-tests-probe")
        try:
            admin.list_topics()
        finally:
            admin.close()
    except Exception as exc:  # any client error means "not usable"
        return f"metadata request to {bootstrap} failed: {exc!r}"
    return None


def prometheus_problem(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/-/ready", timeout=3) as resp:
            if resp.status == 200:
                return None
            return f"{url}/-/ready answered HTTP {resp.status}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}/-/ready: {exc}"


def slurm_problem(conf: str) -> str | None:
    if not Path(conf).is_file():
        return f"no slurm.conf at {conf}"
    env = dict(os.environ, SLURM_CONF=conf)
    try:
        out = subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True, timeout=15)
    except FileNotFoundError:
        return "scontrol not installed (scripts/services.sh deps)"
    except subprocess.TimeoutExpired:
        return "scontrol ping timed out"
    if "is UP" not in out.stdout:
        return f"scontrol ping: {(out.stdout + out.stderr).strip()!r}"
    return None


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """Bootstrap address ("127.0.0.1:9092") of the test broker, after a metadata request succeeded."""
    bootstrap = os.environ.get("FLEETHEALTH_KAFKA", "127.0.0.1:9092")
    why = kafka_problem(bootstrap)
    if why:
        _unavailable("Kafka", why)
    return bootstrap


@pytest.fixture(scope="session")
def prometheus_url() -> str:
    """Base URL ("http://127.0.0.1:9090") of the test Prometheus, after /-/ready answered."""
    url = os.environ.get("FLEETHEALTH_PROMETHEUS", "http://127.0.0.1:9090").rstrip("/")
    why = prometheus_problem(url)
    if why:
        _unavailable("Prometheus", why)
    return url


@pytest.fixture(scope="session")
def slurm_conf() -> str:
    """Path of the test cluster's slurm.conf, after `scontrol ping` found slurmctld UP.

    Also sets SLURM_CONF in os.environ (if unset) so scontrol/sinfo run by the code under test find it.
    """
    conf = os.environ.get("SLURM_CONF") or str(REPO / ".services" / "slurm" / "slurm.conf")
    why = slurm_problem(conf)
    if why:
        _unavailable("Slurm", why)
    os.environ.setdefault("SLURM_CONF", conf)
    return conf


@pytest.fixture(scope="session")
def slurm_local_node(slurm_conf: str) -> str:
    """Name of the node with a real slurmd (the machine's short hostname): submit srun jobs with -w NAME."""
    return socket.gethostname().split(".")[0]
