"""Spool drills: a crash mid-write, a flipped byte, a full disk (a real tmpfs where this runs as root,
and a real file-size limit everywhere), stray files, a stale cursor, file modes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from collectors.spool import Spool

ROOT = Path(__file__).resolve().parents[2]


def values(sp: Spool, limit: int = 10_000) -> list[bytes]:
    return [v for _, v in sp.peek(limit)]


def drain(sp: Spool) -> list[bytes]:
    got: list[bytes] = []
    while True:
        batch = sp.peek(7)
        if not batch:
            return got
        got += [v for _, v in batch]
        sp.ack(len(batch))


def test_torn_record_then_restart_later_samples_are_all_delivered(tmp_path):
    # the old spool appended behind the torn record and its reader stopped there: ~60 samples lost
    sp = Spool(tmp_path / "sp", fsync=False)
    for i in range(5):
        sp.append("h", b"old-%d" % i)
    sp.close()
    seg = next((tmp_path / "sp").glob("seg-*.spool"))
    seg.write_bytes(seg.read_bytes()[:-3])  # SIGKILL mid-write of old-4
    sp2 = Spool(tmp_path / "sp", fsync=False)
    for i in range(60):
        sp2.append("h", b"new-%d" % i)
    assert sp2.depth() == 64
    assert drain(sp2) == [b"old-%d" % i for i in range(4)] + [b"new-%d" % i for i in range(60)]
    assert sp2.corrupt == 1 and sp2.depth() == 0
    sp2.close()
    assert drain(Spool(tmp_path / "sp", fsync=False)) == []  # acked stays acked across a restart


def test_a_flipped_byte_skips_one_record_and_resyncs(tmp_path):
    sp = Spool(tmp_path / "sp", fsync=False)
    for i in range(8):
        sp.append("h", b"rec-%d-" % i + b"x" * 40)
    sp.close()
    seg = next((tmp_path / "sp").glob("seg-*.spool"))
    data = bytearray(seg.read_bytes())
    data[len(data) * 3 // 8 + 20] ^= 0xFF  # inside record 3
    seg.write_bytes(bytes(data))
    sp2 = Spool(tmp_path / "sp", fsync=False)
    assert sp2.depth() == 7
    got = [v[:5] for v in values(sp2)]
    values(sp2)  # reading again does not count the same damage again
    assert got == [b"rec-%d" % i for i in (0, 1, 2, 4, 5, 6, 7)] and sp2.corrupt == 1
    assert len(drain(sp2)) == 7 and sp2.depth() == 0


def test_stray_files_and_a_stale_cursor_lose_nothing(tmp_path):
    d = tmp_path / "sp"
    sp = Spool(d, segment_bytes=4096, fsync=False)
    for i in range(30):
        sp.append("h", b"%03d" % i + b"y" * 400)
    sp.close()
    (d / "seg-backup.spool").write_bytes(b"junk")  # the old spool failed to start (ValueError)
    (d / "cursor.json").write_text('{"segment": 12345, "record": 0, "offset": 0}')
    sp2 = Spool(d, fsync=False)
    assert [int(v[:3]) for v in drain(sp2)] == list(range(30))


def test_spool_files_are_private(tmp_path):
    old = os.umask(0o022)
    try:
        sp = Spool(tmp_path / "sp", fsync=False)
        sp.append("h", b"kernel log excerpt")
        sp.peek()
        sp.ack(1)
        sp.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "sp").stat().st_mode) == 0o700
    for p in (tmp_path / "sp").iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


# ---------------------------------------------------------------------------- disk full, for real

_FSIZE_CHILD = textwrap.dedent("""
    import resource, signal, sys
    from collectors.spool import Spool
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
    sp = Spool(sys.argv[1], segment_bytes=1 << 20, fsync=False)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
    failed = 0
    for i in range(40):
        try:
            sp.append("h", b"%04d" % i + b"z" * 300)
        except OSError:
            failed += 1
    print(failed, sp.write_errors, sp.depth(), flush=True)
""")


def test_disk_full_leaves_no_torn_record_and_resends_nothing(tmp_path):
    """A file-size limit (the kernel refuses writes past it, mid-record included) stands in for a
    full disk; it needs no root. Old spool: the half-written record stayed in the buffered writer,
    and once space came back the same record was handed to the sink without end."""
    d = tmp_path / "sp"
    limit = 10 * 315 + 150  # the 11th record is cut in the middle
    out = subprocess.run([sys.executable, "-c", _FSIZE_CHILD, str(d), str(limit)], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    failed, errors, depth = map(int, out.stdout.split())
    assert (failed, errors, depth) == (30, 30, 10)
    seg = next(d.glob("seg-*.spool"))
    assert seg.stat().st_size == 10 * 315  # rolled back to the last whole record
    sp = Spool(d, fsync=False)  # space is back
    for i in range(40, 45):
        sp.append("h", b"%04d" % i + b"z" * 300)
    got = [int(v[:4]) for v in drain(sp)]
    assert got == [*range(10), *range(40, 45)] and sp.corrupt == 0


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the file-size-limit drill covers this")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_enospc_on_a_real_full_tmpfs_same_process(tiny_tmpfs):
    sp = Spool(tiny_tmpfs / "sp", segment_bytes=1 << 20, fsync=True)
    reserve = tiny_tmpfs / "reserve"
    reserve.write_bytes(b"\0" * 65536)
    ok = 0
    for i in range(2000):
        try:
            sp.append("h", b"%05d" % i + b"q" * 1000)
            ok += 1
        except OSError:
            break
    assert 0 < ok < 2000 and sp.write_errors == 1
    with pytest.raises(OSError):
        sp.append("h", b"fails-again" + b"q" * 1000)
    reserve.unlink()  # space comes back
    sp.append("h", b"after")
    got = drain(sp)
    assert [int(v[:5]) for v in got[:-1]] == list(range(ok)) and got[-1] == b"after"
    assert sp.depth() == 0 and sp.corrupt == 0 and sp.peek() == []


# ---------------------------------------------------------------------------- the collector on a full disk

_COLLECTOR_CHILD = textwrap.dedent("""
    import json, resource, signal, sys, time
    sys.path.insert(0, sys.argv[2])
    from tests.collectors.test_daemon import ListSink, settings
    from pathlib import Path
    from collectors.daemon import Collector
    from simulator.nvml import SimNvml
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    sink = ListSink()
    c = Collector(settings(Path(sys.argv[1])), sink=sink, nvml=SimNvml(2))
    c.poll_once()
    assert c.flush(10)
    seg = max(Path(sys.argv[1], "state", "spool").glob("seg-*.spool"))
    resource.setrlimit(resource.RLIMIT_FSIZE, (seg.stat().st_size + 100, resource.RLIM_INFINITY))
    for _ in range(6):
        c.poll_once()  # the old collector died here: OSError out of spool.append
    full_ok = c.flush(10)
    errors = c.stats.spool_write_errors
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    time.sleep(1.1)  # past the disk backoff
    c.poll_once()
    spooled_again = c.spool.depth() + c.stats.samples_sent
    assert c.flush(10)
    c.close()
    print(json.dumps({"seqs": sink.seqs(), "full_ok": full_ok, "errors": errors,
                      "spool_errors": c.spool.write_errors, "spooled_again": spooled_again}))
""")


def test_a_full_spool_disk_never_stops_sending(tmp_path):
    out = subprocess.run([sys.executable, "-c", _COLLECTOR_CHILD, str(tmp_path), str(ROOT)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    r = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert r["seqs"] == list(range(8)) and r["full_ok"]
    assert r["errors"] >= 1 and r["spool_errors"] >= 1


def test_a_full_state_disk_never_stops_sending(tiny_tmpfs, tmp_path):
    from collectors.daemon import Collector
    from simulator.nvml import SimNvml
    from tests.collectors.test_daemon import ListSink, settings

    sink = ListSink()
    s = settings(tmp_path, state_dir=str(tiny_tmpfs / "state"))
    c = Collector(s, sink=sink, nvml=SimNvml(2))
    c.poll_once()
    filler = tiny_tmpfs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # the whole state disk fills up
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    for _ in range(5):
        c.poll_once()
    assert c.flush(10)
    assert sink.seqs() == list(range(6))
    assert c.stats.spool_write_errors >= 1 and c.stats.state_write_errors >= 1
    filler.unlink()
    c.close()
