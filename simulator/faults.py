"""The fleet engine's faults over time: one function per kind of the one fault model
(:mod:`.faultmodel`), each scheduling the telemetry a real fault of that kind leaves behind
(precursors, strength drawn against :mod:`.limits`, variants, co-occurring Xids and AER lines,
counters, repair). Each kind's output is held to its catalogue signature
(``tests/simulator/test_fault_model.py``).

A :class:`Fault` is also the ground-truth record. ``onset`` is the first tick where the fault's own
evidence is in the telemetry (precursor ramps start there too: a CE ramp before a UCE *is* the
fault's evidence); ``end`` is when the component is healthy again (GPU reset, reboot, repair) or the
end of the recording.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import klog
from .faultmodel import APP_XIDS, CATALOGUE, HW_XIDS
from .limits import fault_rate_per_hour, per_poll
from .state import CLK_HW_SLOWDOWN, CLK_HW_THERMAL, CLK_SW_THERMAL, HostState
from .timeline import Timeline
from .topology import NDR_GBPS, HostSpec, make_boot_id, make_uuid


@dataclass
class Fault:
    id: str
    host: int
    mode: str
    onset_tick: int
    end_tick: int
    gpu: int | None = None
    port: int | None = None
    dimm: int | None = None
    component: str = ""
    notes: list[str] = field(default_factory=list)
    secondary: list[str] = field(default_factory=list)


@dataclass
class Ctx:
    tl: Timeline
    specs: list[HostSpec]
    start_ts: float
    interval: float
    rng: np.random.Generator  # effect randomness, drawn in schedule order at run time
    # GPU swaps done at run time: (host, gpu slot, tick, the new board's UUID). A later fault on that
    # slot is on the new board: the ground truth names it (Simulation.truth_records).
    swaps: list[tuple[int, int, int, str]] = field(default_factory=list)
    scenario: str = "default"

    def ticks(self, seconds: float) -> int:
        return max(1, int(round(seconds / self.interval)))

    def ts(self, tick: int) -> float:
        return self.start_ts + tick * self.interval


# The kinds, their components and durations, and their Xid codes: the one fault model (precursor
# ramps: fleethealth.taxonomy.PRECURSORS).
DURATION: dict[str, tuple[float, float]] = {k.mode: k.duration_s for k in CATALOGUE.values()}
KIND: dict[str, str] = {k.mode: k.component for k in CATALOGUE.values()}


def draw_duration(mode: str, rng: np.random.Generator) -> float:
    lo, hi = DURATION[mode]
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


# --------------------------------------------------------------------------- shared actions


def reboot_after_quiet(c: Ctx, f: Fault, at: int, quiet_s: float, *, new_gpu: int | None = None) -> int:
    """The host goes quiet at ``at`` for ``quiet_s`` (repair, reboot) and comes back fresh."""
    if f.end_tick >= c.tl.ticks:  # still broken when the recording ends: no repair in view
        return f.end_tick
    at = max(at, f.onset_tick + 2)  # the fault shows before the repair takes the host away
    back = max(at + c.ticks(quiet_s), f.end_tick)

    def go_quiet(hs: HostState, ts: float) -> None:
        hs.quiet_until = back

    def come_back(hs: HostState, ts: float) -> None:
        if new_gpu is not None:  # the part was swapped: a new board, new UUID, clean counters
            g = hs.gpus[new_gpu]
            g.uuid = make_uuid(c.rng)
            c.swaps.append((f.host, new_gpu, back, g.uuid))
            g.ecc = [0] * 8
            g.remap = [0, 0, False, False]
            g.sram_thr = False
        hs.reboot(make_boot_id(c.rng), ts)
        hs.events = [klog.plain(ts, 1.2, "Linux version 6.5.0-1024-nvidia (buildd@lcy02) #25-Ubuntu SMP")]

    c.tl.at(at, f.host, go_quiet)
    c.tl.at(back, f.host, come_back)
    return back


def gpu_reset(c: Ctx, f: Fault, at: int) -> None:
    g = f.gpu
    assert g is not None

    def reset(hs: HostState, ts: float) -> None:
        hs.gpus[g].reset_volatile()
        hs.events.append(klog.gpu_at(ts, hs.uptime(ts), hs.gpus[g].spec, hs.gpus[g].uuid))

    c.tl.at(at, f.host, reset)


def emit_xid(hs: HostState, ts: float, g: int, code: int, pid: int | None = None, text: str | None = None) -> None:
    gs = hs.gpus[g]
    ev, xe = klog.xid(ts, hs.uptime(ts), gs.spec, code, pid=pid, text=text)
    hs.events.append(ev)
    gs.xids.append(xe)


def ce_ramp(c: Ctx, f: Fault, start: int, end: int, counter: Callable[[HostState, int], None]) -> None:
    """Correctable errors growing toward the onset: rate rises linearly from ~0.2 to ~20 per poll."""
    span = max(end - start, 1)

    def step(hs: HostState, ts: float, k: int) -> None:
        n = int(c.rng.poisson(0.2 + 20.0 * k / span))
        if n:
            counter(hs, n)

    c.tl.during(start, end, f.host, step)


# --------------------------------------------------------------------------- GPU modes


def fell_off_bus(c: Ctx, f: Fault) -> None:
    g = f.gpu
    assert g is not None
    with_aer = bool(c.rng.random() < 0.6)  # Meta: ~half of PCIe errors co-occur with Xid 79
    vanish = bool(c.rng.random() < 0.5)
    if with_aer:
        f.notes.append("AER uncorrectable (Surprise Down) on the GPU's switch port")
        f.secondary.append("pcie_fatal")

        def corrected(hs: HostState, ts: float) -> None:
            hs.add_aer(g, "corrected", "Timeout")
            hs.events.extend(klog.aer(ts, hs.uptime(ts), hs.gpus[g].spec, "corrected", 0))

        c.tl.at(f.onset_tick - 2, f.host, corrected)

    def fall(hs: HostState, ts: float) -> None:
        gs = hs.gpus[g]
        up = hs.uptime(ts)
        if with_aer:
            hs.add_aer(g, "fatal", "SDES")
            hs.events.extend(klog.aer(ts, up, gs.spec, "fatal", 0))
        hs.events.append(klog.gpu_at(ts, up, gs.spec, gs.uuid))
        emit_xid(hs, ts, g, 79)
        hs.events.extend(klog.fell_off_bus(ts, up, gs.spec))

    def lost(hs: HostState, ts: float) -> None:
        hs.gpus[g].lost = 2 if vanish else 1

    f.notes.append("GPU " + ("no longer enumerated (fewer GPUs than expected)" if vanish else "present=False, GPU_IS_LOST"))
    c.tl.at(f.onset_tick, f.host, fall)
    c.tl.at(f.onset_tick + 1, f.host, lost)
    reboot_after_quiet(c, f, f.end_tick - c.ticks(1800), 1800, new_gpu=g)
    f.notes.append("replaced at end (new UUID)")


def dram_uce(c: Ctx, f: Fault, pre: int) -> None:
    g = f.gpu
    assert g is not None
    if pre:
        ce_ramp(c, f, f.onset_tick - pre, f.onset_tick, lambda hs, n: hs.gpus[g].add_ecc(0, n))
        f.notes.append(f"correctable-ECC ramp for {pre * c.interval / 3600:.1f} h before the UCE")
    variant = "48+63" if c.rng.random() < 0.7 else "95"

    def uce(hs: HostState, ts: float) -> None:
        gs = hs.gpus[g]
        gs.add_ecc(1, 1)
        if variant == "48+63":
            emit_xid(hs, ts, g, 48)
            gs.remap[1] += 1
            gs.remap[2] = True
            emit_xid(hs, ts, g, 63)
        else:
            emit_xid(hs, ts, g, 95, text="Uncontained: FBHUB. RST: Yes, D-RST: No")

    if variant == "48+63":
        f.notes.append("Xid 48 with Xid 63; row remap pending until the GPU reset")
        f.secondary.append("gpu_row_remap_pending")
    else:
        f.notes.append("Xid 95 (uncontained) on DRAM")
    c.tl.at(f.onset_tick, f.host, uce)
    gpu_reset(c, f, f.end_tick)


def row_remap_failure(c: Ctx, f: Fault, pre: int) -> None:
    g = f.gpu
    assert g is not None
    if pre:
        ce_ramp(c, f, f.onset_tick - pre, f.onset_tick, lambda hs, n: hs.gpus[g].add_ecc(0, n))
        f.notes.append("correctable-ECC ramp before")

    def fail(hs: HostState, ts: float) -> None:
        gs = hs.gpus[g]
        gs.add_ecc(1, 1)
        gs.remap[1] += 1
        gs.remap[3] = True
        gs.dirty = True
        emit_xid(hs, ts, g, 48)
        emit_xid(hs, ts, g, 64)

    f.notes.append("Xid 48 with Xid 64; remap failure flag set until the GPU is replaced")
    f.secondary.append("gpu_dram_uce")
    c.tl.at(f.onset_tick, f.host, fail)
    reboot_after_quiet(c, f, f.end_tick - c.ticks(1800), 1800, new_gpu=g)


def row_remap_pending(c: Ctx, f: Fault) -> None:
    g = f.gpu
    assert g is not None
    uncorrectable = bool(c.rng.random() < 0.5)

    def pend(hs: HostState, ts: float) -> None:
        gs = hs.gpus[g]
        gs.remap[1 if uncorrectable else 0] += 1
        gs.remap[2] = True
        gs.dirty = True
        emit_xid(hs, ts, g, 63)

    f.notes.append(f"{'uncorrectable' if uncorrectable else 'correctable'}-error row remap pending; clears after GPU reset")
    c.tl.at(f.onset_tick, f.host, pend)
    gpu_reset(c, f, f.end_tick)


def sram_uce(c: Ctx, f: Fault) -> None:
    g = f.gpu
    assert g is not None
    code = 94 if c.rng.random() < 0.5 else 95
    threshold = bool(c.rng.random() < 0.3)

    def uce(hs: HostState, ts: float) -> None:
        gs = hs.gpus[g]
        gs.add_ecc(3, 1)
        if threshold:
            gs.sram_thr = True
        emit_xid(hs, ts, g, code, pid=int(c.rng.integers(1000, 60000)))

    f.notes.append(f"SRAM UCE with Xid {code}" + ("; SRAM threshold exceeded" if threshold else ""))
    c.tl.at(f.onset_tick, f.host, uce)
    gpu_reset(c, f, f.end_tick)


def sbe_storm(c: Ctx, f: Fault) -> None:
    g = f.gpu
    assert g is not None
    rate, mult = fault_rate_per_hour("hbm_ce", c.rng)
    lam = per_poll(rate, c.interval)
    xid92 = bool(c.rng.random() < 0.5) and mult > 4  # the driver reports Xid 92 for a heavy storm only

    def step(hs: HostState, ts: float, k: int) -> None:
        hs.gpus[g].add_ecc(0, int(c.rng.poisson(lam)))
        if xid92 and k % 120 == 0:
            emit_xid(hs, ts, g, 92)

    f.notes.append(f"DRAM CE ~{rate:.0f}/h ({mult:.1f}x the limit)" + ("; Xid 92" if xid92 else ""))
    c.tl.during(f.onset_tick, f.end_tick, f.host, step)


def hw_error(c: Ctx, f: Fault) -> None:
    g = f.gpu
    assert g is not None
    code = int(c.rng.choice(HW_XIDS))

    def err(hs: HostState, ts: float) -> None:
        emit_xid(hs, ts, g, code, pid=int(c.rng.integers(1000, 60000)))
        emit_xid(hs, ts, g, 45, pid=int(c.rng.integers(1000, 60000)))  # sympathetic: channels torn down

    f.notes.append(f"Xid {code} followed by sympathetic Xid 45")
    c.tl.at(f.onset_tick, f.host, err)
    c.tl.at(f.onset_tick + 2, f.host, lambda hs, ts: emit_xid(hs, ts, g, code))
    gpu_reset(c, f, f.end_tick)


def nvlink_error(c: Ctx, f: Fault) -> None:
    g = f.gpu
    assert g is not None
    links = sorted({int(x) for x in c.rng.integers(0, 18, size=int(c.rng.integers(1, 3)))})
    rate, mult = fault_rate_per_hour("nvlink_crc", c.rng)
    lam = per_poll(rate, c.interval)
    # A marginal link's errors are retried by the link layer: counters climb, no Xid, no retrain.
    # Only a link well past the limit raises Xid 74, retrains (recovery counter) or drops out.
    severe = mult > 4
    goes_down = severe and bool(c.rng.random() < 0.3)
    lam_rec = per_poll(3.0, c.interval) if severe else 0.0

    def step(hs: HostState, ts: float, k: int) -> None:
        gs = hs.gpus[g]
        for link in links:
            # nvl rows: crc_flit, crc_data, replay, recovery. Every data CRC error is also a flit
            # CRC error, and most flit errors are retried (replays).
            gs.nvl[0][link] += int(c.rng.poisson(lam * 5))
            gs.nvl[1][link] += int(c.rng.poisson(lam))
            gs.nvl[2][link] += int(c.rng.poisson(lam / 2))
            if lam_rec:
                gs.nvl[3][link] += int(c.rng.poisson(lam_rec))
        if goes_down and k == 3:
            gs.nvl_active[links[0]] = False
        gs.dirty = True
        if severe and (k == 0 or (k % 60 == 0 and c.rng.random() < 0.5)):
            emit_xid(hs, ts, g, 74, text=f"NVLink: fatal error detected on link {links[0]}(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")

    f.notes.append(f"links {links}: CRC ~{rate:.0f}/h ({mult:.1f}x the limit)"
                   + ("; Xid 74, recoveries" if severe else "; marginal: counters only")
                   + ("; first link inactive" if goes_down else ""))
    c.tl.during(f.onset_tick, f.end_tick, f.host, step)
    gpu_reset(c, f, f.end_tick)


def gsp_error(c: Ctx, f: Fault) -> None:
    g = f.gpu
    assert g is not None
    repeats = int(c.rng.integers(2, 6))
    for i in range(repeats):
        c.tl.at(f.onset_tick + 2 * i, f.host, lambda hs, ts: emit_xid(hs, ts, g, 119))
    if c.rng.random() < 0.5:
        c.tl.at(f.onset_tick + 2 * repeats, f.host, lambda hs, ts: emit_xid(hs, ts, g, 120))
        f.notes.append("Xid 119 repeated, then Xid 120")
    else:
        f.notes.append("Xid 119 repeated")
    reboot_after_quiet(c, f, f.end_tick - c.ticks(300), 300)


def thermal(c: Ctx, f: Fault) -> None:
    g = f.gpu
    assert g is not None
    hw = bool(c.rng.random() < 0.4)
    bits = CLK_SW_THERMAL | ((CLK_HW_THERMAL | CLK_HW_SLOWDOWN) if hw else 0)
    add = int(c.rng.integers(22, 32))

    def on(hs: HostState, ts: float) -> None:
        hs.gpus[g].thermal_add = add
        hs.gpus[g].clk_fault = bits

    def off(hs: HostState, ts: float) -> None:
        hs.gpus[g].thermal_add = 0
        hs.gpus[g].clk_fault = 0

    f.notes.append(f"+{add} C, clocks_event_reasons {bits:#x}")
    c.tl.at(f.onset_tick, f.host, on)
    c.tl.at(f.end_tick, f.host, off)


# --------------------------------------------------------------------------- PCIe, network, host


def pcie_degraded(c: Ctx, f: Fault) -> None:
    g = f.gpu
    assert g is not None

    rate, mult = fault_rate_per_hour("pcie_replays", c.rng)
    lam = per_poll(rate, c.interval)
    # A bad riser or connector first shows as replays (the data link layer re-sends TLPs); the link
    # retrains to a narrower width only once it is well past the limit.
    narrows = mult > 4 and bool(c.rng.random() < 0.7)

    def on(hs: HostState, ts: float) -> None:
        hs.gpus[g].width = 8
        hs.gpus[g].dirty = True
        hs.aer_dirty = True

    def step(hs: HostState, ts: float, k: int) -> None:
        gs = hs.gpus[g]
        gs.replay += int(c.rng.poisson(lam))
        gs.dirty = True
        if c.rng.random() < 0.2:
            hs.add_aer(g, "corrected", "Timeout", int(c.rng.integers(1, 5)))
            hs.events.extend(klog.aer(ts, hs.uptime(ts), gs.spec, "corrected", 0))

    f.notes.append(f"replays ~{rate:.0f}/h ({mult:.1f}x the limit), corrected AER (Replay Timer Timeout)"
                   + ("; x16 -> x8" if narrows else ""))
    if narrows:
        c.tl.at(f.onset_tick, f.host, on)
    c.tl.during(f.onset_tick, f.end_tick, f.host, step)
    reboot_after_quiet(c, f, f.end_tick - c.ticks(1200), 1200)


def pcie_fatal(c: Ctx, f: Fault) -> None:
    g = f.gpu
    assert g is not None
    sev = "fatal" if c.rng.random() < 0.4 else "non-fatal"
    name = "MalfTLP" if sev == "fatal" else "CmpltTO"
    reports = int(c.rng.integers(1, 4))

    def report(hs: HostState, ts: float) -> None:
        hs.add_aer(g, sev, name)
        hs.events.extend(klog.aer(ts, hs.uptime(ts), hs.gpus[g].spec, sev, 1 if sev == "fatal" else 0))

    for i in range(reports):
        c.tl.at(f.onset_tick + i, f.host, report)
    f.notes.append(f"AER uncorrectable ({sev}, {name}) x{reports}")
    reboot_after_quiet(c, f, f.end_tick - c.ticks(600), 600)


def _flap(c: Ctx, f: Fault, p: int, hs: HostState, ts: float) -> None:
    port = hs.ports[p]
    port.bump("link_downed")
    port.bump("link_error_recovery")
    port.set_link("DOWN", "Polling")
    hs.events.append(klog.net(ts, hs.uptime(ts), port.hca_pci, f"Port {p + 1} link down"))


def bad_cable(c: Ctx, f: Fault, *, fails: bool | None = None, flap_every: float | None = None) -> None:
    p = f.port
    assert p is not None
    rate, mult = fault_rate_per_hour("ib_symbol_errors", c.rng)
    lam = per_poll(rate, c.interval)
    # A marginal cable or transceiver only drops symbols (the link stays up at full rate); one far
    # past the limit flaps, may come back at a lower rate, and may fail for good.
    severe = mult > 6 or flap_every is not None or bool(fails) or c.scenario == "flapping-cable"
    # slow-drift: the error rate creeps from a tenth of the limit to 5x over the fault, no flaps
    creep = c.scenario == "slow-drift"
    if creep:
        severe, fails, rate, mult = False, False, 5.0 * rate / mult, 5.0
        lam = per_poll(rate, c.interval)
    span = max(f.end_tick - f.onset_tick, 1)
    every = flap_every or float(c.rng.uniform(4, 20))  # polls between flaps
    fails = (bool(c.rng.random() < 0.4) and severe) if fails is None else fails
    fail_at = f.onset_tick + int((f.end_tick - f.onset_tick) * 0.6) if fails else None
    slow = severe and bool(c.rng.random() < 0.3)

    def step(hs: HostState, ts: float, k: int) -> None:
        port = hs.ports[p]
        tick = f.onset_tick + k
        if fail_at is not None and tick >= fail_at:
            if tick == fail_at:
                _flap(c, f, p, hs, ts)
                port.set_link("DOWN", "Disabled")
            return
        port.bump("symbol_error", int(c.rng.poisson(lam * (0.02 + 0.98 * k / span if creep else 1.0))))
        if severe and c.rng.random() < 0.1:
            port.bump("port_rcv_errors", int(c.rng.integers(1, 20)))
        if port.state == "DOWN":
            port.set_link("ACTIVE", "LinkUp", 200.0 if slow else NDR_GBPS)
            hs.events.append(klog.net(ts, hs.uptime(ts), port.hca_pci, f"Port {p + 1} link up"))
        elif severe and (k == 0 or c.rng.random() < 1.0 / every):
            _flap(c, f, p, hs, ts)

    f.notes.append(f"symbol errors ~{rate:.0f}/h ({mult:.1f}x the limit)"
                   + (f", flaps every ~{every:.0f} polls" if severe else "; marginal: no flaps")
                   + ("; rate 200 Gb/s" if slow else "")
                   + ("; then the cable fails (port down)" if fails else ""))
    if fails:
        f.secondary.append("net_link_down")
    c.tl.during(f.onset_tick, f.end_tick, f.host, step)
    reboot_after_quiet(c, f, f.end_tick, 600)


def link_down(c: Ctx, f: Fault) -> None:
    p = f.port
    assert p is not None
    phys = "Disabled" if c.rng.random() < 0.5 else "Polling"

    def down(hs: HostState, ts: float) -> None:
        port = hs.ports[p]
        port.bump("link_downed")
        port.set_link("DOWN", phys)
        hs.events.append(klog.net(ts, hs.uptime(ts), port.hca_pci, f"Port {p + 1} link down"))

    def up(hs: HostState, ts: float) -> None:
        port = hs.ports[p]
        port.set_link("ACTIVE", "LinkUp", NDR_GBPS)
        hs.events.append(klog.net(ts, hs.uptime(ts), port.hca_pci, f"Port {p + 1} link up"))

    f.notes.append(f"state DOWN, phys {phys}")
    c.tl.at(f.onset_tick, f.host, down)
    c.tl.at(f.end_tick, f.host, up)


def host_dram_uce(c: Ctx, f: Fault, pre: int) -> None:
    d = f.dimm
    assert d is not None
    mc, label = c.specs[f.host].dimms[d]
    page = int(c.rng.integers(0x100000, 0xFFFFFF))
    if pre:
        span = pre

        def step(hs: HostState, ts: float, k: int) -> None:
            n = int(c.rng.poisson(0.05 + 3.0 * k / span))
            if n:
                hs.add_edac(d, ce=n)
                hs.events.append(klog.edac(ts, hs.uptime(ts), mc, label, "CE", n, page))

        c.tl.during(f.onset_tick - pre, f.onset_tick, f.host, step)
        f.notes.append("EDAC CE ramp on the same DIMM before")

    def ue(hs: HostState, ts: float) -> None:
        up = hs.uptime(ts)
        hs.add_edac(d, ue=1)
        hs.events.extend(klog.mce_uncorrected(ts, up, int(c.rng.integers(0, 112)), 13))
        hs.events.append(klog.edac(ts, up, mc, label, "UE", 1, page))

    f.notes.append("EDAC UE + MCE uncorrected")
    c.tl.at(f.onset_tick, f.host, ue)
    reboot_after_quiet(c, f, f.end_tick - c.ticks(1800), 1800)


def host_ce_storm(c: Ctx, f: Fault) -> None:
    d = f.dimm
    assert d is not None
    mc, label = c.specs[f.host].dimms[d]
    rate, mult = fault_rate_per_hour("dimm_ce", c.rng)
    lam = per_poll(rate, c.interval)
    page = int(c.rng.integers(0x100000, 0xFFFFFF))

    def step(hs: HostState, ts: float, k: int) -> None:
        n = int(c.rng.poisson(lam))
        if n:
            hs.add_edac(d, ce=n)
            up = hs.uptime(ts)
            hs.events.append(klog.edac(ts, up, mc, label, "CE", n, page))
            if k % 10 == 0:
                hs.events.append(klog.mce_logged(ts, up))

    f.notes.append(f"EDAC CE ~{rate:.0f}/h ({mult:.1f}x the limit) on one DIMM")
    c.tl.during(f.onset_tick, f.end_tick, f.host, step)


def unreachable(c: Ctx, f: Fault) -> None:
    back = f.end_tick

    def go(hs: HostState, ts: float) -> None:
        hs.quiet_until = back

    def come_back(hs: HostState, ts: float) -> None:
        hs.reboot(make_boot_id(c.rng), ts)
        hs.events = []

    f.notes.append("no telemetry until end; returns rebooted")
    c.tl.at(f.onset_tick, f.host, go)
    c.tl.at(back, f.host, come_back)


def app_error(c: Ctx, f: Fault) -> None:
    g = f.gpu
    assert g is not None
    code = int(c.rng.choice(APP_XIDS))
    pid = int(c.rng.integers(1000, 400000))
    lines = int(c.rng.integers(1, 6)) if code == 13 else 1

    def crash(hs: HostState, ts: float) -> None:
        for _ in range(lines):
            emit_xid(hs, ts, g, code, pid=pid, text=None)

    f.notes.append(f"job crash: Xid {code} x{lines}, then Xid 45 as the channels are torn down")
    c.tl.at(f.onset_tick, f.host, crash)
    c.tl.at(f.onset_tick + 1, f.host, lambda hs, ts: emit_xid(hs, ts, g, 45, pid=pid))


def inject(c: Ctx, f: Fault, pre: int) -> None:
    m = f.mode
    if m == "gpu_dram_uce":
        dram_uce(c, f, pre)
    elif m == "gpu_row_remap_failure":
        row_remap_failure(c, f, pre)
    elif m == "host_dram_uce":
        host_dram_uce(c, f, pre)
    else:
        SIMPLE[m](c, f)


SIMPLE: dict[str, Callable[[Ctx, Fault], None]] = {
    "gpu_fell_off_bus": fell_off_bus, "gpu_row_remap_pending": row_remap_pending, "gpu_sram_uce": sram_uce,
    "gpu_ecc_sbe_storm": sbe_storm, "gpu_hw_error": hw_error, "gpu_nvlink_error": nvlink_error,
    "gpu_gsp_error": gsp_error, "gpu_thermal": thermal, "pcie_link_degraded": pcie_degraded,
    "pcie_fatal": pcie_fatal, "net_link_bad_cable": bad_cable, "net_link_down": link_down,
    "host_dram_ce_storm": host_ce_storm, "host_unreachable": unreachable, "app_error": app_error,
}
