"""Contract encode/decode rate for a full 8-GPU (18 NVLinks each), 8-port host sample."""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.table import Row
from fleethealth.bus import read_values
from fleethealth.schema import Sample, decode_sample, encode, encode_packed
from tests.spine.sample_factory import sample

REPLAY = Path(__file__).resolve().parents[1] / "replay_data" / "smoke-64h.jsonl.gz"


def realistic_sample() -> tuple[Sample, str]:
    """A full sample as the simulator writes it (every sysfs counter, AER, EDAC), else the factory's."""
    if REPLAY.exists():
        for raw in read_values(REPLAY):
            s = decode_sample(raw)
            if len(s.gpus) == 8 and s.net_ports and s.edac:
                return s, "simulated H100 host"
    return sample(), "factory sample"


def rows(seconds: float = 2.0) -> list[Row]:
    s, what = realistic_sample()
    raw, packed = encode(s), encode_packed(s)
    out = []
    for name, fn in (("JSON encode", lambda: encode(s)), ("JSON decode", lambda: decode_sample(raw)),
                     ("JSON encode+decode", lambda: decode_sample(encode(s))),
                     ("msgpack encode+decode", lambda: decode_sample(encode_packed(s))),
                     ("msgpack decode", lambda: decode_sample(packed))):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 3:
            for _ in range(200):
                fn()
            n += 200
        per = (time.perf_counter() - t0) / n
        size = len(packed) if "msgpack" in name else len(raw)
        out.append(Row("contract", f"{name} per sample", per * 1e6, "µs", f"{what}: 8 GPUs x 18 NVLinks, 8 ports, {size} B"))
        if name.endswith("decode"):
            out.append(Row("contract", f"{name} rate, one core", 1 / per, "samples/s",
                           f"= {1 / per / 0.1:,.0f} hosts at a 10 s poll"))
    return out


if __name__ == "__main__":
    from benchmarks.table import render

    print(render(rows()))
