"""The Xid table rule: every Xid in NVIDIA's catalog (``fleethealth.xid``) to its label and bucket,
with the catalog's workflows that depend on context:

* WORKFLOW_XID_48 — a double-bit ECC error (Xid 48) followed by 63 (row-remap / page-retirement
  event) or 64 (remap failure) means "drain and reset the GPU" so the remap takes effect; 48 alone
  is still an uncorrectable DRAM error, raised with lower confidence;
* Xid 94 (contained) vs 95 (uncontained) — DRAM or SRAM is decided by the message text, else by
  which volatile uncorrectable ECC counter is non-zero on that GPU; 95 carries the RESET_GPU
  bucket, 94 RESTART_APP;
* WORKFLOW_XID_45 — 45 (preemptive channel removal) after another Xid on the same GPU is
  sympathetic and follows that Xid; a 45 that says "caused by previous Xid N" is read as N; 45
  alone is an application event;
* 94/95 are sympathetic ("IGNORE (sympathetic)") while the host shows a root cause (NVLink, GSP,
  internal error, fell off the bus) within ``cooccur_s``: that root cause is the finding;
* an application Xid on a GPU with a hardware Xid within ``cooccur_s`` is that fault's symptom; on
  another GPU (or alone) it is reported, with its own action (annotate);
* Xid 154 (recovery action changed) adds the driver's recovery (reset / reboot / drain) to the
  actions of the finding it accompanies on that GPU; alone it is informational.

Xids reach us twice (NVML event stream per GPU, and the kernel log line): the same (GPU, Xid)
within ``DUP_S`` seconds is one event.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from detectors.engine.compiled import Evaluator
from detectors.engine.finding import Finding
from detectors.engine.paths import gpu_component, norm_pci
from detectors.engine.rulefile import RuleSpec
from detectors.engine.state import HostState
from fleethealth.lazyregex import lazy
from fleethealth.schema import Sample
from fleethealth.taxonomy import ALL_LABELS, MODES, Severity, parse_mode
from fleethealth.xid import xid_table

DUP_S = 2.0
_MASKED = lazy(r"NVRM: Xid \([^)]{0,40}\): (?P<xid>\d{1,7}),")  # "(PCI:...)": address redacted
_CAUSED_BY = lazy(r"caused by previous Xid (?P<xid>\d{1,6})", re.I)
# labels of Xids that are a GPU's own hardware fault (an application Xid beside one is its symptom)
HARDWARE_MODES = frozenset({"gpu_fell_off_bus", "gpu_dram_uce", "gpu_row_remap_failure", "gpu_row_remap_pending",
                            "gpu_sram_uce", "gpu_hw_error", "gpu_nvlink_error", "gpu_gsp_error"})
# labels that make a 94/95 on the host sympathetic (catalog: "IGNORE (sympathetic)")
ROOT_CAUSE_MODES = frozenset({"gpu_nvlink_error", "gpu_gsp_error", "gpu_hw_error", "gpu_fell_off_bus"})
# Xid 154 (GPU_RECOVERY_ACTION_CHANGED) names the recovery the driver wants for the other Xid
_RECOVERY = (("node reboot required", "reboot"), ("reboot", "reboot"), ("drain and reset", "drain"),
             ("drain p2p", "drain"), ("gpu reset required", "reset_gpu"), ("reset", "reset_gpu"))


def recovery_actions(line: str) -> list[str]:
    """Actions a Xid 154 line asks for ("... changed from 0x0 (None) to 0x2 (Node Reboot Required)")."""
    low = line.lower()
    tail = low.rsplit(" to ", 1)[-1] if " to " in low else low
    out: list[str] = []
    for text, action in _RECOVERY:
        if text in tail and action not in out:
            out.append(action)
    if "reboot" in out and "reset_gpu" in out:
        out.remove("reset_gpu")
    return out


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
            elif k.kind == "other" and (m := _MASKED.match(k.message)) is not None:
                evs.append((k.ts, "host", min(int(m["xid"]), 1_000_000), k.line))  # PCI address masked
        evs.sort(key=lambda e: (e[0], e[2]))
        return evs

    def check(self, mem: list[Any], st: HostState, comp: str, elem: Any, sample: Sample,
              out: list[Finding]) -> None:
        has = sample.kernel_events or any(g.xids for g in sample.gpus)
        if not has:
            return
        recent: deque[tuple[float, str, int, str]] = mem[self.slot] or deque(maxlen=64)
        mem[self.slot] = recent
        remembered: dict[str, str] = mem[self.slot + 1] or {}
        mem[self.slot + 1] = remembered
        if len(remembered) < 256:
            remembered.update(pci_to_gpu(sample))
        evs = self.events(sample, remembered)
        # every Xid of this sample and the recent past, with its catalog label (the context the
        # workflows read: what else happened on this GPU and on this host within cooccur_s)
        batch = [(t, c, x, self._base_mode(x, ln)) for t, c, x, ln in evs]
        recovery: dict[str, list[str]] = {}
        for _, c, x, ln in evs:
            if x == 154 and (acts := recovery_actions(ln)):
                recovery.setdefault(c, []).extend(a for a in acts if a not in recovery.get(c, []))
        gpus = {gpu_component(g): g for g in sample.gpus}
        for ts, c, xid, line in evs:
            if any(c == c2 and xid == x2 and abs(ts - t2) <= DUP_S for t2, c2, x2, _ in recent):
                continue
            context = [e for e in list(recent) + batch if abs(ts - e[0]) <= self.cooccur_s]
            recent.append((ts, c, xid, self._base_mode(xid, line)))
            f = self._classify(sample, c, xid, line, ts, context, gpus.get(c))
            if f is not None:
                if c in recovery and f.failure_mode != "app_error":
                    f.recommended_action += [a for a in recovery[c] if a not in f.recommended_action]
                    f.evidence[0].fact += f"; Xid 154 recovery action: {', '.join(recovery[c])}"
                out.append(f)

    def _base_mode(self, xid: int, line: str) -> str:
        """The catalog's label, or the label of the Xid a 45 says it was caused by."""
        if xid == 45 and (m := _CAUSED_BY.search(line)) is not None:
            cause = int(m["xid"])
            if cause != 45:
                return self.mode_for(cause)
        return self.mode_for(xid)

    def _classify(self, sample: Sample, comp: str, xid: int, line: str, ts: float,
                  context: list[tuple[float, str, int, str]], gpu: Any) -> Finding | None:
        info = self.table.get(xid)
        mode = self._base_mode(xid, line)
        if not mode:
            return None
        bucket = info.bucket if info else "UNKNOWN_XID"
        conf = self.spec.confidence
        note = f"Xid {xid} ({info.mnemonic if info else 'not in NVIDIA catalog'}), NVIDIA bucket {bucket}"
        same_gpu = [(x, m) for t, c, x, m in context if c == comp and not (x == xid and t == ts)]
        hardware_here = {m for _, m in same_gpu if m in HARDWARE_MODES}
        actions = None
        if xid == 45:
            cause = _CAUSED_BY.search(line)
            if cause is not None and mode != "app_error":
                note += f"; caused by previous Xid {cause['xid']}: follows that Xid's workflow"
            elif [x for x, _ in same_gpu if x != 45]:
                return None  # sympathetic: follows the other Xid on this GPU (WORKFLOW_XID_45)
            else:
                note += "; alone: channel removed preemptively (application or user action)"
        if mode == "app_error" and hardware_here:
            return None  # the hardware fault's symptom on the same GPU (its finding carries the action)
        if xid == 48:
            if any(x in (63, 64) for x, _ in same_gpu):
                note += "; with Xid 63/64: drain and reset the GPU so the row remap takes effect"
                actions = ["drain", "reset_gpu"]
            else:
                note += "; alone (no 63/64 yet): uncorrectable DRAM error, watch for the remap"
                conf = min(conf, 0.9)
        elif xid in (94, 95):
            roots = sorted({m for _, c, _, m in context if m in ROOT_CAUSE_MODES})
            if roots:
                return None  # catalog: IGNORE (sympathetic) to the host's root cause (its own finding)
            mode, why = self._ram_kind(line, gpu)
            note += f"; {'contained' if xid == 94 else 'uncontained'} ECC error on {why}"
            if why.startswith("unknown"):
                conf = min(conf, 0.8)
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
