"""The Xid table rule: every Xid in NVIDIA's catalog (``fleethealth.xid``) to its label and bucket,
with the catalog's workflows that depend on context:

* WORKFLOW_XID_48 — a double-bit ECC error (Xid 48) followed by 63 (row-remap / page-retirement
  event) or 64 (remap failure) means "drain and reset the GPU" so the remap takes effect; 48 alone
  is still an uncorrectable DRAM error, raised with lower confidence;
* Xid 94 (contained) vs 95 (uncontained) — DRAM or SRAM is decided by the message text, else by
  which volatile uncorrectable ECC counter is non-zero on that GPU; 95 carries the RESET_GPU
  bucket, 94 RESTART_APP;
* WORKFLOW_XID_45 — 45 (preemptive channel removal) after another Xid on the same GPU is
  sympathetic and follows that Xid; 45 alone is an application event.

Xids reach us twice (NVML event stream per GPU, and the kernel log line): the same (GPU, Xid)
within ``DUP_S`` seconds is one event.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from detectors.compiled import Evaluator
from detectors.finding import Finding
from detectors.paths import gpu_component, norm_pci
from detectors.rulefile import RuleSpec
from detectors.state import HostState
from fleethealth.schema import Sample
from fleethealth.taxonomy import ALL_LABELS, MODES, Severity, parse_mode
from fleethealth.xid import xid_table

DUP_S = 2.0


def pci_to_gpu(sample: Sample) -> dict[str, str]:
    out: dict[str, str] = {}
    for g in sample.gpus:
        if g.pci_bus_id:
            out[norm_pci(g.pci_bus_id)] = gpu_component(g)
    return out


class XidTableRule(Evaluator):
    scope = "host"
    nslots = 2  # recent xids deque, remembered pci->gpu map

    def __init__(self, spec: RuleSpec, slot: int) -> None:
        super().__init__(spec, slot)
        self.table = xid_table()
        self.cooccur_s = float(spec.params.get("cooccur_s", 60.0))
        self.overrides: dict[int, str] = {}
        for k, v in (spec.params.get("overrides") or {}).items():
            if not isinstance(k, int) or (v and v not in ALL_LABELS):
                raise spec.error("overrides", f"override {k!r}: {v!r} must map a Xid number to a label or ''")
            self.overrides[k] = v or ""

    def mode_for(self, xid: int) -> str:
        if xid in self.overrides:
            return self.overrides[xid]
        info = self.table.get(xid)
        return info.failure_mode if info else ""

    def events(self, sample: Sample, remembered: dict[str, str]) -> list[tuple[float, str, int, str]]:
        """(ts, component, xid, line) of this sample's Xids, both sources, sorted, deduplicated."""
        evs: list[tuple[float, str, int, str]] = []
        for g in sample.gpus:
            if g.xids:
                c = gpu_component(g)
                for x in g.xids:
                    evs.append((x.ts, c, x.xid, x.message))
        for k in sample.kernel_events:
            if k.xid is not None and k.kind in ("xid", "fell_off_bus"):
                c = remembered.get(norm_pci(k.pci_addr), k.pci_addr) if k.pci_addr else "host"
                evs.append((k.ts, c, k.xid, k.line))
        evs.sort(key=lambda e: (e[0], e[2]))
        return evs

    def check(self, mem: list[Any], st: HostState, comp: str, elem: Any, sample: Sample,
              out: list[Finding]) -> None:
        has = sample.kernel_events or any(g.xids for g in sample.gpus)
        if not has:
            return
        recent: deque[tuple[float, str, int]] = mem[self.slot] or deque(maxlen=64)
        mem[self.slot] = recent
        remembered: dict[str, str] = mem[self.slot + 1] or {}
        mem[self.slot + 1] = remembered
        if len(remembered) < 256:
            remembered.update(pci_to_gpu(sample))
        evs = self.events(sample, remembered)
        batch = [(t, c, x) for t, c, x, _ in evs]
        gpus = {gpu_component(g): g for g in sample.gpus}
        for ts, c, xid, line in evs:
            if any(c == c2 and xid == x2 and abs(ts - t2) <= DUP_S for t2, c2, x2 in recent):
                continue
            near = [x2 for t2, c2, x2 in list(recent) + batch if c2 == c and ts - self.cooccur_s <= t2 <= ts + DUP_S]
            recent.append((ts, c, xid))
            f = self._classify(sample, c, xid, line, ts, near, gpus.get(c))
            if f is not None:
                out.append(f)

    def _classify(self, sample: Sample, comp: str, xid: int, line: str, ts: float, near: list[int],
                  gpu: Any) -> Finding | None:
        info = self.table.get(xid)
        mode = self.mode_for(xid)
        if not mode:
            return None
        bucket = info.bucket if info else "UNKNOWN_XID"
        conf = self.spec.confidence
        note = f"Xid {xid} ({info.mnemonic if info else 'not in NVIDIA catalog'}), NVIDIA bucket {bucket}"
        actions = None
        if xid == 48:
            if 63 in near or 64 in near:
                note += "; with Xid 63/64: drain and reset the GPU so the row remap takes effect"
                actions = ["drain", "reset_gpu"]
            else:
                note += "; alone (no 63/64 yet): uncorrectable DRAM error, watch for the remap"
                conf = min(conf, 0.9)
        elif xid in (94, 95):
            mode, why = self._ram_kind(line, gpu)
            note += f"; {'contained' if xid == 94 else 'uncontained'} ECC error on {why}"
            if why.startswith("unknown"):
                conf = min(conf, 0.8)
        elif xid == 45:
            others = [x for x in near if x != 45]
            if others:
                return None  # sympathetic: follows the other Xid (WORKFLOW_XID_45)
            note += "; alone: channel removed preemptively (application or user action)"
        sev = MODES[parse_mode(mode)].severity.value
        if mode == "app_error":
            sev = Severity.INFO.value
        f = self.finding(sample, comp, line=line, xid=xid, bucket=bucket, ts=ts, value=note)
        f.failure_mode, f.severity, f.confidence = mode, sev, conf
        f.recommended_action = actions or [a.value for a in MODES[parse_mode(mode)].actions]
        return f

    @staticmethod
    def _ram_kind(line: str, gpu: Any) -> tuple[str, str]:
        low = line.lower()
        if "sram" in low:
            return "gpu_sram_uce", "SRAM (message)"
        if "dram" in low or "hbm" in low:
            return "gpu_dram_uce", "DRAM (message)"
        ecc = gpu.ecc if gpu is not None else None
        if ecc is not None:
            s, d = ecc.sram_uncorrected_volatile or 0, ecc.dram_uncorrected_volatile or 0
            if s and not d:
                return "gpu_sram_uce", "SRAM (volatile SRAM UCE counter)"
            if d and not s:
                return "gpu_dram_uce", "DRAM (volatile DRAM UCE counter)"
        return "gpu_dram_uce", "unknown location (DRAM assumed)"
