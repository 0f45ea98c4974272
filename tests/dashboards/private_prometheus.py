"""A private Prometheus (Debian's binary) on a free port, for tests that load their own rules.

The shared Prometheus on :9090 scrapes the fixed ports of ``deploy/prometheus/prometheus.yml`` and
loads no rules; a test that needs rules evaluated starts its own, with its own TSDB under
``tmp_path``, and stops it when done.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePrometheus:
    def __init__(self, root: Path, scrape: list[dict[str, Any]], rule_files: list[Path],
                 interval: str = "1s") -> None:
        self.binary = shutil.which("prometheus")
        if self.binary is None:
            raise FileNotFoundError("prometheus is not installed (Debian package `prometheus`)")
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        root.mkdir(parents=True, exist_ok=True)
        self.config = root / "prometheus.yml"
        self.config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": scrape,
        }))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.root / "prometheus.log"

    def start(self, timeout: float = 30.0) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(self.binary), f"--config.file={self.config}", f"--storage.tsdb.path={self.root / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
                stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"prometheus on {self.port} not ready: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def get(self, path: str, **params: str) -> dict[str, Any]:
        q = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}{path}{q}", timeout=10) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read() or b"{}") | {"http_status": exc.code}

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/alerts")["data"]["alerts"])
