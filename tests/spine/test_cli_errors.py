"""A user's mistake is one line naming what to fix and exit 2, never a traceback (issue 18,
ux.md 1.1, 2.1, 8). Each case runs the real ``fleethealth`` in a fresh interpreter."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "replay_data" / "sbe-storm-no-uce-16h.jsonl.gz"


def cli(args: list[str], tmp_path: Path, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHEALTH_")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "fleetcli.cli", *args], cwd=tmp_path, env=e,
                          capture_output=True, text=True, timeout=timeout)


def assert_user_error(r: subprocess.CompletedProcess[str], *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["tickets", "list"]], ids=" ".join)
def test_bad_global_env_value_is_one_line(args: list[str], tmp_path: Path) -> None:
    r = cli(args, tmp_path, {"FLEETHEALTH_LOG_LEVEL": "loud"})
    assert_user_error(r, "FLEETHEALTH_LOG_LEVEL", "loud")


@pytest.mark.parametrize(("var", "value", "args"), [
    ("FLEETHEALTH_SPEED", "fast", ["replay", "x.jsonl"]),             # float flag
    ("FLEETHEALTH_LIMIT", "ten", ["replay", "x.jsonl"]),              # int flag
    ("FLEETHEALTH_QUIET", "maybe", ["replay", "x.jsonl"]),            # yes/no flag
    ("FLEETHEALTH_GZIP_LEVEL", "11", ["simulate", "--out", "x.jsonl"]),  # out of its choices
    ("FLEETHEALTH_KAFKA_CLIENT", "librdkafka", ["replay", "x.jsonl"]),  # not a Kafka client
    ("FLEETHEALTH_KAFKA_WIRE", "avro", ["collect", "--once"]),        # not a wire format
    ("FLEETHEALTH_REPLAY_WIRE", "avro", ["replay", "x.jsonl"]),
], ids=lambda v: str(v))
def test_bad_command_env_value_is_one_line(var: str, value: str, args: list[str], tmp_path: Path) -> None:
    r = cli(args, tmp_path, {var: value})
    assert_user_error(r, var, repr(value))
    assert list(tmp_path.iterdir()) == []


def test_good_env_values_still_work(tmp_path: Path) -> None:
    r = cli(["--version"], tmp_path, {"FLEETHEALTH_LOG_LEVEL": "debug", "FLEETHEALTH_QUIET": "no"})
    assert r.returncode == 0 and r.stdout.startswith("fleethealth "), r.stderr


@pytest.mark.parametrize(("toml", "args", "words"), [
    ('[kafka]\nwire = "avro"\n', ["collect", "--simulate", "--once", "--sink", "kafka:127.0.0.1:1"],
     ["[kafka].wire", "'avro'", "msgpack, json"]),
    ("", ["collect", "--simulate", "--once", "--kafka-wire", "json"], ["--kafka-wire", "JSON"]),  # stdout sink
    ("", ["replay", "x.jsonl", "--wire", "msgpack", "--to", "jsonl:bus.jsonl"], ["--wire msgpack"]),
], ids=["config", "kafka-wire-on-stdout", "replay-msgpack-to-jsonl"])
def test_bad_wire_settings_are_one_line_and_start_nothing(toml: str, args: list[str], words: list[str],
                                                          tmp_path: Path) -> None:
    (tmp_path / "x.jsonl").write_text("")
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    r = cli(["--config", str(cfg), *args], tmp_path)
    assert_user_error(r, *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml", "x.jsonl"]


@pytest.mark.parametrize("kind", ["missing", "folder", "binary"])
def test_bad_config_file_is_one_line(kind: str, tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    if kind == "folder":
        cfg.mkdir()
    elif kind == "binary":
        cfg.write_bytes(b"\xff\xfe\x00\x81[guards]\n")
    r = cli(["--config", str(cfg), "detect", "--bus", "memory", "--exit-when-idle"], tmp_path)
    assert_user_error(r, str(cfg))


@pytest.mark.parametrize("args", [
    ["replay", "nope.jsonl.gz", "--score"],
    ["replay", "nope.jsonl.gz", "--report", "out"],
    ["replay", "nope.jsonl.gz", "--to", "jsonl:bus.jsonl"],
    ["detect", "--bus", "memory", "--models", "no-such-dir", "--exit-when-idle"],
    ["detect", "--bus", "memory", "--rules", "no-such-dir", "--exit-when-idle"],
], ids=" ".join)
def test_bad_path_is_one_line(args: list[str], tmp_path: Path) -> None:
    r = cli(args, tmp_path)
    named = next(a for a in args if a.startswith("no"))  # the message names the path the user gave
    assert_user_error(r, "no", named)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "named"), [
    (["replay", "x.jsonl", "--with-models"], "--with-models"),
    (["replay", "x.jsonl", "--models", "m"], "--models"),
    (["replay", "x.jsonl", "--score", "--speed", "10"], "--speed"),
    (["replay", "x.jsonl", "--report", "out", "--to", "kafka"], "--to"),
    (["replay", "x.jsonl", "--score", "--limit", "5"], "--limit"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_flag_that_does_nothing_is_an_error(args: list[str], named: str, tmp_path: Path) -> None:
    r = cli(args, tmp_path)
    assert_user_error(r, named)
    assert list(tmp_path.iterdir()) == []


def test_replay_score_at_a_terminal(tmp_path: Path) -> None:
    """ux.md 1.1: the README's own `replay … --score --json --report out/` crashed (exit 70) when
    stderr is a terminal (a tqdm bar without a total in a boolean test). Here stderr is a pty."""
    if not SMALL.exists():
        pytest.skip("dataset not shipped")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal's size: tqdm draws
    seen: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            seen.append(chunk)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    e = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHEALTH_")}
    try:
        r = subprocess.run([sys.executable, "-m", "fleetcli.cli", "replay", str(SMALL), "--score", "--json",
                            "--report", str(tmp_path / "out")], cwd=tmp_path, env=e, stdout=subprocess.PIPE,
                           stderr=slave, text=True, timeout=300)
    finally:
        os.close(slave)
        t.join(timeout=5)
        os.close(master)
    err = b"".join(seen).decode("utf-8", "replace")
    assert r.returncode in (0, 1), err  # 0/1: the quality bar; 70 was the crash
    assert "Traceback" not in err and "samples" in err, err  # the bar was drawn on the terminal
    assert r.stdout.lstrip().startswith("{")
    assert (tmp_path / "out" / "index.html").exists()
