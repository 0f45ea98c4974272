"""The importer's bookkeeping without a Prometheus (a stand-in client answering the two API calls):
chunks bounded by --max-points, odd values and host-less series counted, unmapped series ignored,
times and durations parsed."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest

from fleetcli.commands.prom_import import ImportSpec, parse_duration, parse_time, run_import
from fleethealth.errors import UserError
from fleethealth.schema import decode_sample

SERIES = [
    {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", "UUID": "GPU-a", "Hostname": "h1"},
    {"__name__": "DCGM_FI_DEV_XID_ERRORS", "gpu": "0", "UUID": "GPU-a", "Hostname": "h1"},
    {"__name__": "DCGM_FI_DEV_FB_FREE", "gpu": "0", "UUID": "GPU-a", "Hostname": "h1"},  # unmapped
    {"__name__": "node_edac_uncorrectable_errors_total", "controller": "0", "instance": "h1:9100"},
    {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0"},  # no host label at all
]


class Stub:
    url = "stub"

    def __init__(self) -> None:
        self.requests = 0
        self.ranges: list[tuple[float, float]] = []

    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        return SERIES if "DCGM" in match else []

    def query_range(self, q: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        if "DCGM" not in q:
            return []
        self.ranges.append((start, end))
        n = int(round((end - start) / step)) + 1
        out = []
        for m in SERIES:
            vals = [[start + i * step, "NaN" if m["__name__"] == "DCGM_FI_DEV_GPU_TEMP" and i == 0 else
                     ("79" if m["__name__"] == "DCGM_FI_DEV_XID_ERRORS" and start + i * step >= 1030 else "0")]
                    for i in range(n)]
            out.append({"metric": m, "values": vals})
        return out


def test_chunks_counts_and_contents(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl.gz"
    stub = Stub()
    st = run_import(ImportSpec(url="http://x", start=1000, end=1090, step=10, max_points=20), out, stub)  # type: ignore[arg-type]
    assert st.series == 5 and st.chunks == len(stub.ranges) == 3  # 20 points / 5 series = 4 steps a chunk
    assert all(e - s <= 30 for s, e in stub.ranges)
    assert st.unhosted_series == 3  # one per chunk
    assert st.xid_events == 1
    with gzip.open(out) as fh:
        samples = [decode_sample(x) for x in fh.read().splitlines()]
    assert [s.ts for s in samples] == [1000.0 + 10 * i for i in range(10)] and {s.host for s in samples} == {"h1"}
    assert [s.seq for s in samples] == list(range(10))
    assert samples[0].gpus[0].temperature_c is None  # NaN at the first step: not available
    assert samples[1].gpus[0].temperature_c == 0.0 and samples[1].edac[0].ue_count == 0
    assert [(s.ts, x.xid) for s in samples for g in s.gpus for x in g.xids] == [(1030.0, 79)]


def test_bad_arguments_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="after --start"):
        run_import(ImportSpec(url="u", start=10, end=5), tmp_path / "a.jsonl.gz", Stub())  # type: ignore[arg-type]
    with pytest.raises(UserError, match=r"\.jsonl\.gz"):
        run_import(ImportSpec(url="u", start=1, end=5), tmp_path / "a.json", Stub())  # type: ignore[arg-type]
    assert parse_duration("5m") == 300 and parse_duration("1.5h") == 5400
    assert parse_time("now-1d", now=100_000) == 100_000 - 86400
    assert parse_time("2026-11-01T00:00:00Z") == 1793491200
    for bad in ("yesterday", "2026-11-01T00:00:00"):
        with pytest.raises(UserError):
            parse_time(bad)
    with pytest.raises(UserError):
        parse_duration("5 minutes")
