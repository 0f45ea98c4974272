"""ChunkWriter: ordered chunks, gzip members any reader accepts, same bytes whatever the thread count."""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path

import pytest

from fleethealth.bus import read_values
from simulator.writer import ChunkWriter


class Small(ChunkWriter):
    CHUNK = 4096


def _write(path: Path, workers: int, level: int = 1) -> list[bytes]:
    lines = [b'{"host":"h%d","n":%d,"pad":"%s"}' % (i % 7, i, b"x" * (i % 300)) for i in range(3000)]
    with Small(path, level=level, workers=workers) as w:
        for k in range(0, len(lines), 37):  # fragments that are not whole lines
            block = b"".join(x + b"\n" for x in lines[k : k + 37])
            w.add_parts([block[:10], block[10:], b""])
    return lines


def test_gzip_members_read_back_in_order_by_every_reader(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl.gz"
    lines = _write(p, workers=3)
    data = p.read_bytes()
    assert data.count(b"\x1f\x8b\x08") > 10  # many members
    assert gzip.decompress(data) == b"".join(x + b"\n" for x in lines)
    assert list(read_values(p)) == lines
    zcat = subprocess.run(["gzip", "-dc", str(p)], capture_output=True, check=True)
    assert zcat.stdout == gzip.decompress(data)


@pytest.mark.parametrize("name", ["r.jsonl", "r.jsonl.gz"])
def test_bytes_do_not_depend_on_threads(tmp_path: Path, name: str) -> None:
    for n in (1, 4):
        (tmp_path / str(n)).mkdir()
        _write(tmp_path / str(n) / name, workers=n)
    assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "4" / name).read_bytes()


def test_level_changes_size_not_content(tmp_path: Path) -> None:
    _write(tmp_path / "a.jsonl.gz", workers=2, level=1)
    _write(tmp_path / "b.jsonl.gz", workers=2, level=9)
    a, b = (tmp_path / "a.jsonl.gz").read_bytes(), (tmp_path / "b.jsonl.gz").read_bytes()
    assert gzip.decompress(a) == gzip.decompress(b) and len(b) < len(a)


def test_bad_level_and_worker_errors_are_raised(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="gzip level"):
        ChunkWriter(tmp_path / "x.jsonl.gz", level=12)
    with pytest.raises(TypeError), Small(tmp_path / "y.jsonl.gz") as w:
        w.add_parts(["not bytes"] * 10, size=10_000)  # type: ignore[list-item]
        w.add_parts([b"x\n"], size=10_000)


def test_write_all_spans_many_writev_batches(tmp_path: Path) -> None:
    from simulator.writer import IOV_MAX, write_all

    parts = [b"%d," % i for i in range(3 * IOV_MAX + 7)] + [b""]
    p = tmp_path / "v.bin"
    with open(p, "wb", buffering=0) as fh:
        write_all(fh.fileno(), parts)
    assert p.read_bytes() == b"".join(parts)
