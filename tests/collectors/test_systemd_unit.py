"""The shipped systemd unit, exercised: `fleethealth collect --simulate` run with the unit's ExecStart
flags, its environment file (deploy/systemd/collector.env.example) and its UMask starts, exports on
the configured address, and after a SIGKILL in the middle of writing loses at most the torn record."""

from __future__ import annotations

import configparser
import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from fleethealth.schema import decode_sample

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "fleethealth-collector.service"
ENV_EXAMPLE = ROOT / "deploy" / "systemd" / "collector.env.example"


def unit() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read(UNIT)
    return cp


def env_file() -> dict[str, str]:
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k] = v
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_unit_is_hardened_and_ships_a_sink():
    s = unit()["Service"]
    assert s["EnvironmentFile"] == "/etc/fleethealth/collector.env"  # required (no "-"): no silent stdout sink
    assert env_file()["FLEETHEALTH_SINK"].startswith("kafka:")
    assert s["RestartPreventExitStatus"] == "2"  # a config error (port taken, no sink) does not crash-loop
    assert (s["UMask"], s["StateDirectoryMode"]) == ("0077", "0700")
    for key in ("NoNewPrivileges", "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups"):
        assert s[key] == "true", key
    assert s["CapabilityBoundingSet"] == "CAP_SYSLOG" and s["ProtectSystem"] == "strict"
    assert int(s["MemoryMax"].rstrip("M")) >= 100  # the collector is ~30 MB; room for the disk-full queue


def _start(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    argv = shlex.split(unit()["Service"]["ExecStart"])
    assert argv[0].endswith("/fleethealth") and "collect" in argv
    args = argv[1:]
    args[args.index("--state-dir") + 1] = str(tmp / "state")  # the unit's StateDirectory, here
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHEALTH_")}
    env.update(env_file())
    env.update(PYTHONPATH=str(ROOT), FLEETHEALTH_SINK=f"jsonl:{tmp / 'delivered.jsonl'}",
               FLEETHEALTH_EXPORTER_PORT=str(port), FLEETHEALTH_INTERVAL="0.1", FLEETHEALTH_SIMULATE="1",
               FLEETHEALTH_SIM_GPUS="4")
    return subprocess.Popen([sys.executable, "-m", "fleetcli.cli", *args], env=env, cwd=tmp,
                            stdout=subprocess.DEVNULL, stderr=(tmp / "collector.log").open("ab"),
                            preexec_fn=lambda: os.umask(0o077))  # the unit's UMask


def _delivered(tmp: Path) -> list[int]:
    p = tmp / "delivered.jsonl"
    if not p.exists():
        return []
    out = []
    for line in p.read_bytes().splitlines():
        try:
            out.append(decode_sample(line).seq)
        except Exception:  # noqa: BLE001 - a line cut by the kill
            pass
    return out


def _wait(pred, what: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_collect_under_the_units_settings_exports_and_survives_a_sigkill(tmp_path):
    assert env_file()["FLEETHEALTH_EXPORTER_ADDRESS"] == "0.0.0.0"
    port = free_port()
    p = _start(tmp_path, port)
    try:
        def scraped() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    return b"fleethealth_collector_samples_total" in r.read()
            except OSError:
                return False
        _wait(scraped, "the exporter on 0.0.0.0")
        _wait(lambda: len(_delivered(tmp_path)) >= 15, "samples delivered")
        p.send_signal(signal.SIGKILL)  # mid-poll, mid-write: no flush, no cursor save
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    state = tmp_path / "state"
    seg = max((state / "spool").glob("seg-*.spool"))
    with open(seg, "ab") as f:  # and a record torn in the middle, as a kill inside write() leaves it
        f.write(b"\x40\x00\x00\x00torn-record")
    for path in (state / "spool").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    p2 = _start(tmp_path, free_port())
    try:
        first = max(_delivered(tmp_path))
        _wait(lambda: max(_delivered(tmp_path)) >= first + 10, "samples after the restart")
        p2.send_signal(signal.SIGTERM)
        assert p2.wait(60) == 0
    finally:
        if p2.poll() is None:
            p2.kill()
    seqs = set(_delivered(tmp_path))
    missing = set(range(max(seqs) + 1)) - seqs
    assert len(missing) <= 1, f"lost {sorted(missing)}"  # at most the record the kill tore
    log = (tmp_path / "collector.log").read_text()
    assert "Traceback" not in log
