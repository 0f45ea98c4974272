"""One suite over every detector in detectors.registry.all_detectors() — each rule file, the engine,
and any model the ML part registers: determinism, empty stream, counter resets, out-of-order and
duplicate samples. A new detector is covered by registering it, without new test code."""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec
import pytest

from detectors.registry import all_detectors
from simulator.fixtures import HostSeries

replace = msgspec.structs.replace
DETECTORS = all_detectors()


def _stream(n: int = 90, hosts: int = 3):
    """A small fleet where every fault family shows up: UCE step, port bounce, Xids, AER, EDAC, a
    PCIe replay storm, and a GPU running hot against its peers for long enough (15 min at 10 s polls)
    that the windowed models see it too. Every detector must emit on it (test_every_detector_emits)."""
    from fleethealth.schema import KernelEvent, XidEvent

    series = [HostSeries(f"c-{i}") for i in range(hosts)]
    out = []
    for k in range(n):
        for i, h in enumerate(series):
            def fn(s, k=k, i=i):
                if k >= 10 and i == 0:
                    s.gpus[1] = replace(s.gpus[1], ecc=replace(s.gpus[1].ecc, dram_uncorrected_volatile=1 + k // 20))
                if k in (12, 13, 14, 15) and i == 1:
                    s.net_ports[2] = replace(s.net_ports[2], state="DOWN", phys_state="Polling")
                if k == 20 and i == 2:
                    s.gpus[0] = replace(s.gpus[0], xids=[XidEvent(xid=79, ts=s.ts)])
                if k >= 25 and i == 2:
                    s.edac[0].dimms[1] = replace(s.edac[0].dimms[1], ue=1)
                if k >= 10 and i == 1:  # a riser going bad: 100 replays a poll
                    g = s.gpus[3]
                    s.gpus[3] = replace(g, pcie=replace(g.pcie, replay_counter=g.pcie.replay_counter + 100 * (k - 9)))
                if 30 <= k < 50 and i == 1:  # HW slowdown held for 20 polls
                    s.gpus[6] = replace(s.gpus[6], clocks_event_reasons=0x8)
                if k >= 10 and i == 0:  # one GPU 25 C above its peers
                    s.gpus[5] = replace(s.gpus[5], temperature_c=s.gpus[5].temperature_c + 25.0)
                if 30 <= k < 40 and i == 1:  # the PSU asserts the power brake
                    s.gpus[2] = replace(s.gpus[2], clocks_event_reasons=0x80)
                if k == 40 and i == 1:  # a kernel-log family line (kept by the reader as kind other)
                    msg = "nvidia-nvswitch1: SXid (PCI:0000:86:00.0): 24007, Fatal, Link 03 crumbstore ECC DBE"
                    s.kernel_events = [KernelEvent(ts=s.ts, kind="other", line=msg, message=msg,
                                                   pci_addr="0000:86:00.0", severity="fatal")]
            out.append(h.advance(fn))
    return out


def _canon(items):
    return [msgspec.to_builtins(x) if hasattr(x, "__struct_fields__") else
            {**x.__dict__, "evidence": [msgspec.to_builtins(e) for e in x.evidence]} if hasattr(x, "__dict__") else
            repr(x) for x in items]


def _feed_all(det, samples):
    out = []
    for s in samples:
        out.extend(_canon(det.feed(s)))
    flush = getattr(det, "flush", None)  # batched detectors (ML) hand out their last windows here
    if flush is not None:
        out.extend(_canon(flush()))
    return out


def _as_dict(x):
    if hasattr(x, "__struct_fields__"):
        return msgspec.to_builtins(x)
    return {k: getattr(x, k) for k in x.__slots__} if hasattr(x, "__slots__") else dict(x.__dict__)


HARD = Path(__file__).resolve().parents[2] / "replay_data" / "hard-cases-24h.jsonl.gz"


@functools.cache
def _model_stream(n: int = 2600) -> tuple:
    """The windowed models judge a component against its peers and a fleet, which a three-host
    literal cannot show: they get the first 2,600 samples of the shipped hard-cases set (the peer detector's first finding comes at about 2,300)."""
    from fleethealth.bus import iter_jsonl
    from fleethealth.schema import decode_sample

    out = []
    for _, raw in iter_jsonl(HARD):
        out.append(decode_sample(raw))
        if len(out) >= n:
            break
    return tuple(out)


class _Factory:
    def __init__(self, name: str, make) -> None:
        self.name, self.make = name, make

    def __call__(self):
        return self.make()

    def stream(self) -> list:
        return list(_model_stream()) if self.name.startswith("model:") else _stream()


@pytest.fixture(params=DETECTORS, ids=[n for n, _ in DETECTORS])
def factory(request):
    return _Factory(*request.param)


def _make(factory):
    return factory()  # a registered detector that cannot be built (a model that no longer loads) fails


def test_every_detector_emits(factory):
    """Without this, the determinism tests below could compare [] == [] for a detector."""
    assert _feed_all(_make(factory), factory.stream()), f"{factory.name} produced nothing on its contract stream"


def test_same_input_same_output(factory):
    samples = factory.stream()
    a, b = _feed_all(_make(factory), samples), _feed_all(_make(factory), samples)
    assert a == b


def test_reset_forgets_everything(factory):
    samples = factory.stream()
    det = _make(factory)
    first = _feed_all(det, samples)
    det.reset()
    assert _feed_all(det, samples) == first


def test_empty_stream_and_empty_samples(factory):
    det = _make(factory)
    assert _feed_all(det, []) == []
    bare = HostSeries("bare", gpus=0, ports=0).advance()
    bare = replace(bare, aer=[], edac=[])
    for _ in range(3):
        det.feed(bare)


def test_duplicates_and_out_of_order_samples_change_nothing(factory):
    samples = factory.stream()
    clean = _feed_all(_make(factory), samples)
    noisy = []
    for i, s in enumerate(samples):
        noisy.append(s)
        if i % 5 == 0:
            noisy.append(s)  # duplicate
        if i % 7 == 0 and i >= 3:
            noisy.append(samples[i - 3])  # late, older than the latest of its host
    got = _feed_all(_make(factory), noisy)
    assert got == clean


def test_counter_reset_without_errors_raises_no_failure(factory):
    """Counters drop to zero (driver reload, reboot with a new boot_id): not a fault."""
    det = _make(factory)
    h = HostSeries("r")
    for p in h.base.net_ports:
        p.counters.update(symbol_error=40000, link_downed=200, port_rcv_errors=90000)
    h.base.gpus[0].ecc.dram_corrected_volatile = 5000
    out = []
    for _ in range(10):
        out += _canon(det.feed(h.advance()))
    h.base = replace(h.base, boot_id="boot-z", driver_version="560.1")
    h.base.net_ports = [replace(p, counters=dict.fromkeys(p.counters, 0)) for p in h.base.net_ports]
    h.base.gpus[0] = replace(h.base.gpus[0], ecc=replace(h.base.gpus[0].ecc, dram_corrected_volatile=0))
    for _ in range(10):
        out += _canon(det.feed(h.advance()))
    assert out == []
