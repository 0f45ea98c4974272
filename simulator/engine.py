"""The simulation loop: a seeded fleet, polled every interval, written as contract JSONL.

Reproducible byte for byte: every random draw comes from numpy Generators spawned from the seed, no
wall clock is read, and gzip output has mtime=0. Samples are written sorted by (ts, host): each host
polls at a fixed phase within the interval plus jitter, and a late poll keeps its late ts.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from fleethealth.recordings import meta_path, truth_path

from . import fastpath, klog
from .faults import KIND, Ctx, Fault, inject
from .limits import noise_rate_per_hour, per_poll
from .plan import RunSpec, component_of, expected_faults, plan_faults
from .state import HostState
from .timeline import Timeline
from .topology import (
    DRIVER_VERSION,
    GPUS_PER_HOST,
    PORTS_PER_HOST,
    UPDATED_DRIVER_VERSION,
    build_fleet,
    make_boot_id,
    make_uuid,
)
from .writer import DEFAULT_GZIP_LEVEL, ChunkWriter

log = logging.getLogger("fleethealth.simulate")

DAY = 86400.0
# How many times the default rate of healthy near-limit parts a scenario carries: hard-cases tests
# thresholds against them; training fleets (a few hours of a few dozen hosts) would otherwise hold
# one or two, and a model that never saw a busy healthy NVLink calls every one a fault.
NEAR_LIMIT_BOOST = {"hard-cases": 8.0, "training": 40.0}


@dataclass
class SimulationStats:
    samples: int = 0
    dropped_samples: int = 0
    general_path_samples: int = 0  # rendered by HostState.render, not from a fast-path template
    faults: dict[str, int] = field(default_factory=dict)
    faults_without_room: int = 0
    truth_path: str = ""
    meta_path: str = ""


class Simulation:
    def __init__(self, spec: RunSpec) -> None:
        spec.check()
        self.spec = spec
        ss = np.random.SeedSequence(spec.seed)
        r_fleet, r_plan, r_fx, r_noise, r_bg = (np.random.default_rng(s) for s in ss.spawn(5))
        self.noise = r_noise
        self.specs = build_fleet(spec.hosts)
        H, T, iv = spec.hosts, spec.ticks, spec.interval_s
        self.tl = Timeline(T)
        self.ctx = Ctx(self.tl, self.specs, spec.start_ts, iv, r_fx, scenario=spec.scenario)
        # --- fleet identity and initial state (mid-life: up for days, counters already nonzero)
        self.hosts: list[HostState] = []
        lam_ce = np.where(r_fleet.random((H, GPUS_PER_HOST)) < 0.15,
                          r_fleet.lognormal(np.log(2e-3), 1.5, (H, GPUS_PER_HOST)), 1e-5)
        self.lam_ce = np.minimum(lam_ce, 0.5) * (iv / 30.0)  # heavy-tailed per-GPU CE rate per poll
        self.lam_sym = np.where(r_fleet.random((H, PORTS_PER_HOST)) < 0.05, 2e-3, 1e-5) * (iv / 30.0)
        self.lam_replay = r_fleet.choice([0.0, 1e-4, 1e-3], p=[0.5, 0.4, 0.1], size=(H, GPUS_PER_HOST)) * (iv / 30.0)
        for sp in self.specs:
            uuids = [make_uuid(r_fleet) for _ in range(GPUS_PER_HOST)]
            up = float(r_fleet.uniform(0.5, 30.0)) * DAY
            hs = HostState(sp, uuids, make_boot_id(r_fleet), spec.start_ts - up)
            hs.driver = DRIVER_VERSION
            polls = up / iv
            for g, gs in enumerate(hs.gpus):
                v = int(r_fleet.poisson(self.lam_ce[sp.index, g] * polls))
                gs.ecc = [v, 0, 0, 0, v + int(r_fleet.poisson(v + 1)), 0, 0, 0]
                gs.replay = int(r_fleet.integers(0, 150))
            for p, ps in enumerate(hs.ports):
                ps.counters["symbol_error"] = int(r_fleet.poisson(self.lam_sym[sp.index, p] * polls))
            self.hosts.append(hs)
        self.phase = r_fleet.uniform(0.0, 0.5 * iv, H)
        self.base_t = r_fleet.integers(27, 37, (H, GPUS_PER_HOST))
        self.busy_t = r_fleet.integers(24, 40, (H, GPUS_PER_HOST))
        self.busy = self._jobs(r_fleet)
        # --- faults (ground truth), then benign background that avoids them
        self.planned, self.no_room = plan_faults(spec, self.tl, r_plan)
        self.faults: list[Fault] = []
        for f, pre in sorted(self.planned, key=lambda x: (x[0].onset_tick, x[0].host, x[0].id)):
            f.component = component_of(f, self.specs[f.host], [g.uuid for g in self.hosts[f.host].gpus])
            inject(self.ctx, f, pre)
            self.faults.append(f)
        self.benign: dict[str, int] = {}
        self._background(r_bg)

    # ------------------------------------------------------------------ healthy behaviour
    def _jobs(self, rng: np.random.Generator) -> np.ndarray:
        """Busy/idle periods per host: jobs of ~6 h with ~40 min gaps."""
        H, T, iv = self.spec.hosts, self.spec.ticks, self.spec.interval_s
        busy = np.zeros((H, T), dtype=bool)
        for h in range(H):
            t, on = 0, bool(rng.random() < 0.8)
            while t < T:
                mean = 6 * 3600 if on else 2400
                n = max(1, int(rng.exponential(mean) / iv))
                if on:
                    busy[h, t : t + n] = True
                t += n
                on = not on
        return busy

    def _background(self, rng: np.random.Generator) -> None:
        spec, tl, c = self.spec, self.tl, self.ctx
        hours = spec.ticks * spec.interval_s / 3600.0

        def count(name: str, per_host_day: float) -> int:
            k = int(rng.poisson(per_host_day * spec.hosts * hours / 24.0))
            self.benign[name] = 0
            return k

        def place(name: str, span: int, beside_faults: bool = False) -> tuple[int, int] | None:
            h = int(rng.integers(0, spec.hosts))
            t = int(rng.integers(1, max(spec.ticks - 1, 2)))
            if beside_faults:  # a busy healthy part may share a host (even a GPU) with a fault
                self.benign[name] += 1
                return h, t
            if not tl.free(h, t, t + span, margin=4):
                return None
            tl.reserve(h, t, t + span)
            self.benign[name] += 1
            return h, t

        for _ in range(count("reboot", 1 / 20)):  # a clean reboot every ~20 days per host
            if (p := place("reboot", c.ticks(600))) is not None:
                self._quiet_reboot(*p, c.ticks(float(rng.uniform(180, 480))))
        for _ in range(count("maintenance", 1 / 15)):  # planned work: quiet 10-44 min (POST, firmware)
            if (p := place("maintenance", c.ticks(3000))) is not None:
                self._quiet_reboot(*p, c.ticks(float(rng.uniform(600, 2640))))
        for _ in range(count("driver_reload", 1 / 30)):
            if (p := place("driver_reload", 1)) is not None:
                tl.at(p[1], p[0], _driver_reload)
        for _ in range(count("single_link_flap", 1 / 40)):  # a switch reboot: one flap, then clean
            if (p := place("single_link_flap", 2)) is not None:
                port = int(rng.integers(0, PORTS_PER_HOST))
                tl.at(p[1], p[0], _one_flap(port, down=True))
                tl.at(p[1] + 1, p[0], _one_flap(port, down=False))
        for _ in range(count("aer_corrected", 1 / 10)):  # a lone corrected AER: sticky, harmless
            if (p := place("aer_corrected", 1)) is not None:
                tl.at(p[1], p[0], _lone_aer(int(rng.integers(0, GPUS_PER_HOST))))
        for _ in range(count("edac_ce", 1 / 10)):  # a single corrected DIMM error
            if (p := place("edac_ce", 1)) is not None:
                tl.at(p[1], p[0], _lone_ce(int(rng.integers(0, 16)), int(rng.integers(0x100000, 0xFFFFFF))))
        # Healthy but busy parts, just under the operating limits (limits.py): steady corrected
        # errors on an HBM stack, symbol errors on a long cable, replays on a riser, DIMM CEs, NVLink
        # CRC retries. They must stay healthy; a threshold at 0.3x its value flags them.
        boost = NEAR_LIMIT_BOOST.get(spec.scenario, 1.0)
        for name, per_day, kind in (("hbm_ce", 1 / 8, "gpu"), ("ib_symbol_errors", 1 / 8, "port"),
                                    ("pcie_replays", 1 / 10, "gpu"), ("dimm_ce", 1 / 10, "dimm"),
                                    ("nvlink_crc", 1 / 10, "gpu")):
            for _ in range(count(f"near_limit_{name}", per_day * boost)):
                span = c.ticks(float(rng.uniform(3, 12)) * 3600)
                # training fleets are fault-dense: on a free host only, hardly any would find room
                if (p := place(f"near_limit_{name}", span, spec.scenario == "training")) is not None:
                    unit = int(rng.integers(0, {"gpu": GPUS_PER_HOST, "port": PORTS_PER_HOST, "dimm": 16}[kind]))
                    lam = per_poll(noise_rate_per_hour(name, rng), spec.interval_s)
                    tl.during(p[1], p[1] + span, p[0], _steady(name, unit, lam, int(rng.integers(0, 18))))
        # An old port whose 16-bit SymbolErrorCounter saturated long ago: pinned at 65535 from the
        # first sample on, it never moves (PortCounters saturate; they do not wrap).
        n_sat = int(rng.binomial(spec.hosts, 0.05))
        self.benign["saturated_counter"] = n_sat
        for h in rng.choice(spec.hosts, size=n_sat, replace=False) if n_sat else ():
            tl.at(0, int(h), _saturate(int(rng.integers(0, PORTS_PER_HOST))))
        for _ in range(count("noisy_driver_line", 1 / 4)):  # "ERROR" lines of other drivers
            if (p := place("noisy_driver_line", 1)) is not None:
                tl.at(p[1], p[0], _noisy_line(int(rng.integers(0, len(NOISY_LINES)))))
        if spec.scenario == "driver-update":
            self._driver_update(rng)

    def _quiet_reboot(self, h: int, t: int, span: int) -> None:
        back = t + span
        rng = self.ctx.rng

        def go(hs: HostState, ts: float) -> None:
            hs.quiet_until = back

        def come(hs: HostState, ts: float) -> None:
            hs.reboot(make_boot_id(rng), ts)
            hs.events = []

        self.tl.at(t, h, go)
        self.tl.at(back, h, come)

    def _driver_update(self, rng: np.random.Generator) -> None:
        """Every host, within ~10 minutes of mid-run: drain, reboot into the new driver, come back."""
        spec, c = self.spec, self.ctx
        mid = spec.ticks // 2
        spread = max(1, c.ticks(600))
        for h in range(spec.hosts):
            t = mid + int(rng.integers(0, spread))
            back = t + int(rng.integers(1, c.ticks(180) + 2))

            def go(hs: HostState, ts: float, back: int = back) -> None:
                hs.quiet_until = back

            def come(hs: HostState, ts: float) -> None:
                hs.reboot(make_boot_id(c.rng), ts, driver=UPDATED_DRIVER_VERSION)
                hs.events = [klog.plain(ts, 4.1, f"NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  "
                                                 f"{UPDATED_DRIVER_VERSION}  Release Build")]

            self.tl.at(t, h, go)
            self.tl.at(back, h, come)
        self.benign["driver_update_hosts"] = spec.hosts

    # ------------------------------------------------------------------ the loop
    def run(self, emit: Callable[[bytes], None] | None = None, progress: Callable[[int], None] | None = None, *,
            emit_block: Callable[[bytes], None] | None = None,
            emit_parts: Callable[[list[bytes]], None] | None = None, fast: bool = True) -> SimulationStats:
        """Poll every host every interval. Lines, sorted by (ts, host), go to ``emit`` one by one (no
        newline), or to ``emit_block`` as one newline-terminated block per interval (cheaper: the
        fragments are joined once), or to ``emit_parts`` as the list of fragments whose concatenation
        is that block (cheapest: the receiver joins them, e.g. on another thread). ``fast=False`` renders every line through the general path (the
        same bytes; tests compare the two)."""
        spec, tl, hosts = self.spec, self.tl, self.hosts
        H, iv = spec.hosts, spec.interval_s
        rng = self.noise
        res = SimulationStats()
        active: list = []
        asm = fastpath.Assembler(hosts, fast)
        for t in range(spec.ticks):
            t0 = spec.start_ts + t * iv
            touched: list[int] = []
            for h, fn in tl.events.get(t, ()):
                asm.touch(h)
                touched.append(h)
                fn(hosts[h], t0)
            if t in tl.starts:
                active.extend(tl.starts[t])
            if active:
                keep = []
                for p in active:
                    if t < p.end:
                        asm.touch(p.host)
                        touched.append(p.host)
                        p.fn(hosts[p.host], t0, t - p.start)
                        keep.append(p)
                active = keep
            # background counters (vectorised draws; few are non-zero)
            for arr, kind in ((self.lam_ce, 0), (self.lam_sym, 1), (self.lam_replay, 2)):
                hit = rng.poisson(arr)
                for h, i in zip(*np.nonzero(hit), strict=True):
                    n = int(hit[h, i])
                    if kind == 1:
                        asm.touch(h)
                    else:
                        asm.touch_gpu(h, i)
                    if kind == 0:
                        hosts[h].gpus[i].add_ecc(0, n)
                    elif kind == 1:
                        hosts[h].ports[i].bump("symbol_error", n)
                    else:
                        hosts[h].gpus[i].replay += n
            busy = self.busy[:, t]
            util = np.where(busy[:, None], rng.integers(88, 101, (H, GPUS_PER_HOST)), 0)
            temp = self.base_t + busy[:, None] * self.busy_t + rng.integers(-1, 2, (H, GPUS_PER_HOST))
            power = np.round(np.where(busy[:, None], rng.uniform(420, 690, (H, GPUS_PER_HOST)),
                                      rng.uniform(66, 78, (H, GPUS_PER_HOST))), 1)
            jitter = rng.exponential(0.3, H)
            late = rng.random(H) < 0.002
            jitter[late] = rng.uniform(0.3, 0.45, int(late.sum())) * iv
            miss = rng.random(H) < 0.001
            ts = np.round(t0 + self.phase + jitter, 3)
            n, dropped, rows = asm.poll(t, ts, temp, power, util, busy, miss, touched)
            res.dropped_samples += dropped
            if emit_parts is not None:
                emit_parts(rows.ravel().tolist())
            elif emit_block is not None:
                emit_block(b"".join(rows.ravel().tolist()))
            elif emit is not None:
                for r in rows.tolist():
                    emit(b"".join(r[:-1]))
            res.samples += n
            if progress is not None:
                progress(n)
        res.general_path_samples = asm.general
        res.faults = {}
        for f in self.faults:
            res.faults[f.mode] = res.faults.get(f.mode, 0) + 1
        res.faults_without_room = self.no_room
        return res

    # ------------------------------------------------------------------ ground truth
    def _component(self, f: Fault) -> str:
        if KIND[f.mode] != "gpu":
            return f.component
        comp = f.component
        for host, gpu, tick, uuid in self.ctx.swaps:  # in run order: the last swap before the onset wins
            if host == f.host and gpu == (f.gpu or 0) and tick <= f.onset_tick:
                comp = uuid
        return comp

    def truth_records(self) -> list[dict]:
        """Ground truth, one record per fault. Complete once the run is over: a GPU fault after a
        board swap on its slot names the new board's UUID, known only when the swap ran."""
        spec = self.spec
        end_ts = spec.start_ts + spec.ticks * spec.interval_s
        out = []
        for f in sorted(self.faults, key=lambda f: (f.onset_tick, f.host, f.id)):
            sp = self.specs[f.host]
            end = spec.start_ts + f.end_tick * spec.interval_s
            notes = list(f.notes)
            if f.end_tick >= spec.ticks:
                notes.append("still active when the recording ends")
            out.append({
                "id": f.id, "host": sp.name, "cluster": sp.cluster, "rack": sp.rack,
                "component": self._component(f), "component_kind": KIND[f.mode], "failure_mode": f.mode,
                "onset": spec.start_ts + f.onset_tick * spec.interval_s, "end": min(end, end_ts),
                "secondary": f.secondary, "notes": "; ".join(notes),
            })
        return out


def simulate(spec: RunSpec, out: Path, progress: Callable[[int], None] | None = None,
             gzip_level: int = DEFAULT_GZIP_LEVEL) -> SimulationStats:
    """Write the telemetry to ``out`` (.jsonl or .jsonl.gz), ground truth and run metadata beside it."""
    sim = Simulation(spec)
    out.parent.mkdir(parents=True, exist_ok=True)
    with ChunkWriter(out, level=gzip_level) as w:
        res = sim.run(progress=progress, emit_parts=w.add_parts)
    tp = truth_path(out)
    with open(tp, "w", encoding="utf-8", newline="\n") as fh:
        for rec in sim.truth_records():
            fh.write(json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n")
    mp = meta_path(out)
    meta = {
        "format": "fleethealth-sim/1", "spec": asdict(spec), "samples": res.samples,
        "dropped_samples": res.dropped_samples, "faults": dict(sorted(res.faults.items())),
        "faults_without_room": res.faults_without_room, "expected_faults": expected_faults(spec),
        "benign_events": sim.benign, "truth": tp.name,
    }
    mp.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    res.truth_path, res.meta_path = str(tp), str(mp)
    log.info("simulated %d samples, %d faults", res.samples, len(sim.faults))
    return res


def _driver_reload(hs: HostState, ts: float) -> None:
    for g in hs.gpus:
        g.reset_volatile()
    hs.events.append(klog.plain(ts, hs.uptime(ts), "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  "
                                                   f"{hs.driver}  Release Build"))


def _one_flap(p: int, down: bool) -> Callable[[HostState, float], None]:
    def fn(hs: HostState, ts: float) -> None:
        port = hs.ports[p]
        if down:
            port.bump("link_downed")
            port.set_link("DOWN", "Polling")
            hs.events.append(klog.net(ts, hs.uptime(ts), port.hca_pci, f"Port {p + 1} link down"))
        else:
            port.set_link("ACTIVE", "LinkUp")
            hs.events.append(klog.net(ts, hs.uptime(ts), port.hca_pci, f"Port {p + 1} link up"))
    return fn


def _lone_aer(g: int) -> Callable[[HostState, float], None]:
    def fn(hs: HostState, ts: float) -> None:
        hs.add_aer(g, "corrected", "BadDLLP")
        hs.events.extend(klog.aer(ts, hs.uptime(ts), hs.gpus[g].spec, "corrected", 1))
    return fn


def _lone_ce(d: int, page: int) -> Callable[[HostState, float], None]:
    def fn(hs: HostState, ts: float) -> None:
        mc, label = hs.spec.dimms[d]
        hs.add_edac(d, ce=1)
        hs.events.append(klog.edac(ts, hs.uptime(ts), mc, label, "CE", 1, page))
    return fn


def _steady(name: str, unit: int, per_poll_n: float, link: int) -> Callable[[HostState, float, int], None]:
    """A benign counter that climbs at a steady rate (no Poisson bursts: it stays under the limit)."""
    acc = [0.0]

    def step(hs: HostState, ts: float, k: int) -> None:
        acc[0] += per_poll_n
        n = int(acc[0])
        if not n:
            return
        acc[0] -= n
        if name == "hbm_ce":
            hs.gpus[unit].add_ecc(0, n)
        elif name == "ib_symbol_errors":
            hs.ports[unit].bump("symbol_error", n)
        elif name == "pcie_replays":
            hs.gpus[unit].replay += n
            hs.gpus[unit].dirty = True
        elif name == "dimm_ce":
            hs.add_edac(unit, ce=n)
        elif name == "nvlink_crc":
            gs = hs.gpus[unit]
            gs.nvl[1][link] += n  # crc_data
            gs.nvl[0][link] += 5 * n  # crc_flit
            gs.dirty = True
    return step


def _saturate(p: int) -> Callable[[HostState, float], None]:
    def fn(hs: HostState, ts: float) -> None:
        port = hs.ports[p]
        port.bump("symbol_error", max(0, 65535 - port.counters.get("symbol_error", 0)))
    return fn


# Kernel lines real healthy hosts log that contain "error"/"ERROR" and mean nothing for the GPUs.
NOISY_LINES = (
    "ACPI Error: No handler for Region [SYSI] (00000000a1b2c3d4) [IPMI] (20230628/evregion-130)",
    "ipmi_si IPI0001:00: Could not set the global enables: 0xcc",
    "ERST: Error Record Serialization Table (ERST) support is initialized.",
    "EDAC sbridge: Seeking for: PCI ID 8086:0ec8",
    "nvme nvme0: 64/0/0 default/read/poll queues",
    "usb 1-1.4: device descriptor read/64, error -71",
)


def _noisy_line(i: int) -> Callable[[HostState, float], None]:
    def fn(hs: HostState, ts: float) -> None:
        hs.events.append(klog.plain(ts, hs.uptime(ts), NOISY_LINES[i]))
    return fn
