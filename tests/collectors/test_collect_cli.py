"""`fleethealth collect` as an SRE deploys it: a sink is required, a taken port is one line and exit 2,
--interval has a floor, wrong paths warn, the collect path stays light (RSS)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fh(*args: str, tmp: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHEALTH_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "fleetcli.cli", *args], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_a_daemon_without_a_sink_refuses_to_start(tmp_path):
    r = fh("collect", "--simulate", "--state-dir", str(tmp_path / "st"), tmp=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert "collect needs a sink" in r.stderr and "Traceback" not in r.stderr


def test_a_taken_exporter_port_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = fh("collect", "--simulate", "--sink", f"jsonl:{tmp_path / 'o.jsonl'}", "--exporter-port", str(port),
               "--state-dir", str(tmp_path / "st"), tmp=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0], r.stderr


def test_interval_has_a_floor(tmp_path):
    r = fh("collect", "--simulate", "--sink", "stdout", "--interval", "0", tmp=tmp_path)
    assert r.returncode == 2 and "--interval 0: must be at least 0.1 s" in r.stderr


def test_missing_kmsg_and_sysfs_paths_warn(tmp_path):
    r = fh("collect", "--once", "--kmsg-file", str(tmp_path / "nope.log"), "--sysfs-root", str(tmp_path / "nosys"),
           "--proc-root", str(tmp_path / "noproc"), "--state-dir", str(tmp_path / "st"), tmp=tmp_path)
    assert "nope.log does not exist" in r.stderr and "has no bus/pci/devices" in r.stderr
    assert "has no sys/kernel/random/boot_id" in r.stderr
    assert json.loads(r.stdout)["host"]  # --once alone still prints its sample


def test_simulate_without_a_state_dir_leaves_nothing_behind(tmp_path):
    env_tmp = tmp_path / "tmp"
    env_tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHEALTH_")}
    env.update(PYTHONPATH=str(ROOT), TMPDIR=str(env_tmp))
    r = subprocess.run([sys.executable, "-m", "fleetcli.cli", "collect", "--simulate", "--once", "--sink", "stdout"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and list(env_tmp.iterdir()) == []


_RSS_CHILD = textwrap.dedent("""
    import sys
    from fleetcli.cli import main
    rc = main(sys.argv[1:])
    heavy = sorted(m for m in ("sklearn", "scipy", "pandas", "skops", "numpy") if m in sys.modules)
    # VmHWM: this process's peak RSS (ru_maxrss would carry the forking parent's size over exec)
    hwm = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:"))
    print(rc, hwm // 1024, ",".join(heavy) or "-")
""")


def test_the_collect_path_stays_under_50_mb_and_imports_no_ml_stack(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHEALTH_")}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-c", _RSS_CHILD, "--log-level", "warning", "collect", "--simulate",
                        "--polls", "5", "--interval", "0.1", "--sink", f"jsonl:{tmp_path / 'o.jsonl'}",
                        "--exporter-port", "0", "--state-dir", str(tmp_path / "st")],
                       env=env, capture_output=True, text=True, timeout=180)
    rc, rss_mb, heavy = r.stdout.split()
    assert rc == "0" and heavy == "-", r.stdout + r.stderr[-2000:]
    assert int(rss_mb) < 50, f"collector max RSS {rss_mb} MB"


def test_a_msgpack_record_spooled_for_kafka_goes_to_a_jsonl_sink_as_json(tmp_path):
    """The spool keeps each record's bytes across a change of sink: a JSON sink writes a msgpack
    record (spooled while the sink was Kafka) as JSON, and its own new sample as JSON."""
    from collectors.spool import Spool
    from fleetcli.cli import main
    from fleethealth.bus import read_values
    from fleethealth.schema import decode_sample, encode_packed
    from tests.spine.sample_factory import sample

    old = sample(host="sim-1", gpus=2)
    spool = Spool(tmp_path / "state" / "spool")
    spool.append(old.host, encode_packed(old))
    spool.close()
    out = tmp_path / "out.jsonl"
    assert main(["--log-level", "warning", "collect", "--simulate", "--once", "--exporter-port", "0", "--host", "sim-1",
                 "--sink", f"jsonl:{out}", "--state-dir", str(tmp_path / "state")]) == 0
    lines = list(read_values(out))
    assert len(lines) == 2 and all(v.startswith(b"{") for v in lines)
    assert decode_sample(lines[0]) == old and decode_sample(lines[1]).host == "sim-1"
