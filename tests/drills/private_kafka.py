"""A private single-node Kafka broker for the fault drills: the shared broker on 127.0.0.1:9092 is
used by everyone else and must never be stopped, so a drill that stops the broker (or needs the
standard topic names to itself) starts its own, from the jars ``scripts/services.sh`` caches, with
the project's server.properties template, on free ports and a log dir under the test's tmp dir.

    broker = PrivateKafka(tmp_path / "kafka")
    broker.start()            # formats storage once, waits for a metadata answer
    broker.stop()             # SIGTERM, waits for a clean shutdown (SIGKILL with hard=True)
    broker.start()            # same log dir and cluster id: the data survives
    broker.bootstrap          # "127.0.0.1:PORT"

The ``private_kafka`` fixture yields a started broker and always stops it. When the jars are not
cached or java is missing, it skips (or fails with FLEETHEALTH_REQUIRE_SERVICES=1), like the shared
service fixtures.

With ``users={"name": "password", ...}`` the client listener is SASL_PLAINTEXT with SCRAM-SHA-256
(credentials written into the metadata log when the storage is formatted, KIP-900) and the
StandardAuthorizer denies whatever no ACL allows; ``admin`` is the super user the broker itself
uses. ``client(user)`` gives the kafka-python settings for one user, ``allow(...)`` adds ACLs. The
controller listener stays PLAINTEXT on 127.0.0.1 and its ANONYMOUS principal (the broker half of
this combined node talking to its controller half) is a super user: acceptable for a test node,
not for production (docs/security.md).
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import REPO, _unavailable, kafka_problem

KAFKA_VERSION = "4.1.1"
TEMPLATE = REPO / "deploy" / "kafka" / "server.properties"
LOG4J = REPO / "deploy" / "kafka" / "log4j2.properties"
JAVA_OPTS = ["-Xms128m", "-Xmx384m", "-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError", "-XX:TieredStopAtLevel=1",
             "-Xshare:auto", "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={LOG4J}"]


def kafka_libs() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("FLEETHEALTH_KAFKA_LIBS") or cache / "fleethealth" / f"kafka-{KAFKA_VERSION}-libs")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SCRAM = "SCRAM-SHA-256"


class PrivateKafka:
    def __init__(self, root: Path, port: int | None = None, controller_port: int | None = None, *,
                 users: dict[str, str] | None = None) -> None:
        self.root = root
        self.users = dict(users or {})
        if self.users:
            self.users.setdefault("admin", "admin-" + uuid.uuid4().hex[:12])
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.libs = kafka_libs()
        self.restarts = 0

    @property
    def log(self) -> Path:
        return self.root / "kafka.log"

    def _configure(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        text = TEMPLATE.read_text().replace("@DATA_DIR@", str(self.root))
        text = (text.replace("127.0.0.1:9093", f"127.0.0.1:{self.controller_port}")
                    .replace("127.0.0.1:9092", f"127.0.0.1:{self.port}"))
        assert f":{self.port}" in text and f":{self.controller_port}" in text, "template ports changed"
        if self.users:
            text = (text.replace(f"PLAINTEXT://127.0.0.1:{self.port}", f"SASL_PLAINTEXT://127.0.0.1:{self.port}")
                        .replace("inter.broker.listener.name=PLAINTEXT", "inter.broker.listener.name=SASL_PLAINTEXT")
                        .replace("CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                                 "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT")
                        .replace("auto.create.topics.enable=true", "auto.create.topics.enable=false"))
            jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" '
                    f'password="{self.users["admin"]}";')
            text += (f"\nsasl.enabled.mechanisms={SCRAM}\nsasl.mechanism.inter.broker.protocol={SCRAM}\n"
                     f"listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config={jaas}\n"
                     "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n"
                     "allow.everyone.if.no.acl.found=false\nsuper.users=User:admin;User:ANONYMOUS\n")
        conf = self.root / "server.properties"
        conf.write_text(text)
        return conf

    def _java(self, *args: str) -> list[str]:
        return ["java", *JAVA_OPTS, "-cp", f"{self.libs}/*", *args]

    def start(self, timeout: float = 90.0) -> None:
        conf = self._configure()
        if not (self.root / "data" / "meta.properties").exists():
            cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            scram = [a for u, pw in self.users.items() for a in ("--add-scram", f"{SCRAM}=[name={u},password={pw}]")]
            out = subprocess.run(self._java("kafka.tools.StorageTool", "format", "--config", str(conf),
                                            f"--cluster-id={cid}", "--ignore-formatted", *scram),  # an id may start with "-"
                                 capture_output=True, text=True, timeout=120)
            if out.returncode != 0:
                raise RuntimeError(f"kafka storage format failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(self._java("kafka.Kafka", str(conf)), stdout=fh, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        why: str | None = "not started"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"private kafka exited {self.proc.returncode}: {self.log_tail()}")
            why = kafka_problem(self.bootstrap) if not self.users else self._sasl_problem()
            if why is None:
                return
            time.sleep(0.5)
        raise RuntimeError(f"private kafka did not answer within {timeout}s ({why}): {self.log_tail()}")

    def stop(self, *, hard: bool = False, timeout: float = 60.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            return
        self.proc.send_signal(signal.SIGKILL if hard else signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def restart(self, *, hard: bool = False, down_s: float = 0.0) -> None:
        self.stop(hard=hard)
        time.sleep(down_s)
        self.start()
        self.restarts += 1

    def client(self, user: str, password: str | None = None) -> dict[str, str]:
        """kafka-python settings for ``user`` (the ``[kafka].security`` table of a config file)."""
        return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": SCRAM, "sasl_plain_username": user,
                "sasl_plain_password": password if password is not None else self.users[user]}

    def _sasl_problem(self) -> str | None:
        from kafka import KafkaAdminClient

        try:
            admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=10_000,
                                     client_id="drill-probe", **self.client("admin"))
            try:
                admin.list_topics()
            finally:
                admin.close()
        except Exception as exc:  # any client error means "not ready"
            return f"SASL metadata request failed: {exc!r}"
        return None

    def admin(self) -> object:
        from kafka import KafkaAdminClient

        return KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="drill-admin", **self.client("admin"))

    def create_topics(self, topics: list[str], partitions: int = 8) -> None:
        from kafka.admin import NewTopic

        admin = self.admin()
        try:
            admin.create_topics([NewTopic(t, partitions, 1) for t in topics])  # type: ignore[attr-defined]
        finally:
            admin.close()  # type: ignore[attr-defined]

    def allow(self, user: str, resource: str, name: str, *operations: str) -> None:
        """ACLs: allow ``user`` each of ``operations`` (READ, WRITE, DESCRIBE, ...) on a TOPIC or GROUP
        (a literal name, or a prefix ending in ``*``)."""
        from kafka.admin import (
            ACL,
            ACLOperation,
            ACLPermissionType,
            ACLResourcePatternType,
            ResourcePattern,
            ResourceType,
        )

        pattern = ACLResourcePatternType.PREFIXED if name.endswith("*") else ACLResourcePatternType.LITERAL
        res = ResourcePattern(getattr(ResourceType, resource), name.rstrip("*"), pattern)
        acls = [ACL(f"User:{user}", "*", getattr(ACLOperation, op), ACLPermissionType.ALLOW, res) for op in operations]
        admin = self.admin()
        try:
            result = admin.create_acls(acls)  # type: ignore[attr-defined]
        finally:
            admin.close()  # type: ignore[attr-defined]
        failed = result.get("failed") if isinstance(result, dict) else None
        if failed:
            raise RuntimeError(f"create_acls failed: {failed}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


@pytest.fixture
def private_kafka(tmp_path: Path) -> Iterator[PrivateKafka]:
    if shutil.which("java") is None:
        _unavailable("Kafka (private drill broker)", "java is not installed (scripts/services.sh deps)")
    libs = kafka_libs()
    if not (libs / ".complete").exists():
        _unavailable("Kafka (private drill broker)", f"no cached Kafka jars at {libs} (scripts/services.sh up kafka)")
    broker = PrivateKafka(tmp_path / "kafka")
    try:
        broker.start()
    except RuntimeError as exc:
        broker.stop(hard=True)
        pytest.fail(str(exc), pytrace=False)
    try:
        yield broker
    finally:
        broker.stop(hard=True)
