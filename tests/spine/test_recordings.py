"""The one recording-name helper and ground-truth reader (fleethealth/recordings.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleethealth.bus import topic_path
from fleethealth.errors import UserError
from fleethealth.recordings import meta_path, read_truth, side_path, stem, truth_path


@pytest.mark.parametrize("name", ["fleet.jsonl.gz", "fleet.jsonl", "fleet.gz", "fleet"])
def test_every_recording_suffix_gives_the_same_side_files(name):
    p = Path("/d") / name
    assert stem(p) == "fleet"
    assert truth_path(p) == Path("/d/fleet.truth.jsonl")
    assert meta_path(p) == Path("/d/fleet.meta.json")
    assert side_path(p, "x.csv") == Path("/d/fleet.x.csv")
    assert topic_path(p, "fleet.incidents.v1") == Path("/d/fleet.fleet.incidents.v1.jsonl")


def test_read_truth_rows_and_errors_name_file_and_line(tmp_path):
    p = tmp_path / "r.truth.jsonl"
    p.write_text('{"id": "f1", "host": "h", "failure_mode": "gpu_dram_uce", "onset": 5, "end": 9}\n\n')
    assert read_truth(p) == [{"id": "f1", "host": "h", "failure_mode": "gpu_dram_uce", "onset": 5, "end": 9}]
    p.write_text('{"id": "f1", "host": "h", "failure_mode": "x", "onset": 5}\n{"host": "h", "onset": 1}\n')
    with pytest.raises(UserError, match=r"r\.truth\.jsonl:2: .*missing failure_mode"):
        read_truth(p)
    p.write_text('{"host": "h", "failure_mode": "x", "onset": "soon"}\n')
    with pytest.raises(UserError, match=r":1: bad ground-truth line"):
        read_truth(p)
    with pytest.raises(UserError, match="no ground truth"):
        read_truth(tmp_path / "none.truth.jsonl")
