"""A private Prometheus (the Debian binary, as scripts/services.sh starts the shared one) on a free
port, with its own TSDB under a temporary folder and a 1 s scrape of the given targets. Never the
shared 9090 instance: this one is started and stopped by the test that needs it."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import yaml

BINARY = "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePrometheus:
    """``targets``: (job, host:port, metrics_path, instance label) tuples."""

    def __init__(self, root: Path, targets: list[tuple[str, str, str, str]], interval: str = "1s") -> None:
        if not Path(BINARY).exists() and not shutil.which("prometheus"):
            raise FileNotFoundError(BINARY)
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = {"global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
               "scrape_configs": [{"job_name": job, "metrics_path": path,
                                   "static_configs": [{"targets": [addr], "labels": {"instance": inst}}]}
                                  for job, addr, path, inst in targets]}
        root.mkdir(parents=True, exist_ok=True)
        (root / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        self.log = open(root / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [BINARY if Path(BINARY).exists() else "prometheus", f"--config.file={root / 'prometheus.yml'}",
             f"--storage.tsdb.path={root / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(root / 'prometheus.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("private prometheus did not become ready")

    def up_targets(self) -> int:
        with urllib.request.urlopen(f"{self.url}/api/v1/query?query=sum(up)", timeout=5) as r:
            res = json.load(r)["data"]["result"]
        return int(float(res[0]["value"][1])) if res else 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
