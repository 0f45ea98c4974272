"""fleethealth.atomicfile: a reader sees the old file or the new one, never a part or a temp file."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from fleethealth.atomicfile import write_atomic


def test_text_and_bytes_are_written_whole_with_the_mode_asked(tmp_path: Path) -> None:
    p = tmp_path / "index.html"
    write_atomic(p, "é\n")
    assert p.read_bytes() == "é\n".encode()
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
    write_atomic(p, b"\x00\x01", mode=0o600)
    assert p.read_bytes() == b"\x00\x01"
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert sorted(x.name for x in tmp_path.iterdir()) == ["index.html"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    p = tmp_path / "model.json"
    p.write_text("old")

    class Boom(str):
        def encode(self, *a: object, **k: object) -> bytes:  # type: ignore[override]
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(p, Boom("new"))
    assert p.read_text() == "old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["model.json"]


def test_a_missing_folder_is_an_error_not_a_stray_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "nope" / "x", "y")
