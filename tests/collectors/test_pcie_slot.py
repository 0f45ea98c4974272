"""A PCIe link narrower than the GPU's max is judged against what the slot allows (issue 14): the
upstream port's max_link_width in sysfs, read by the collector from the live tree and by
``diagnose`` from a captured one. x8 in an x8 slot is slot-limited (healthy); x8 of an x16 GPU in an
x16-capable slot is a link that trained narrow (degraded). Same verdict on both paths. The trees are
written here the way the kernel lays them out (bus/pci/devices/ADDR links into devices/pci0000:00/
<root port>/ADDR)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from collectors.daemon import Collector, CollectorSettings
from collectors.sysfs import ReadStats, read_pcie
from detectors.diagnose.doctor import diagnose_path
from detectors.engine.engine import DetectorEngine
from detectors.engine.ruleset import RuleSet
from simulator.nvml import SimNvml

GPU, PORT = "0000:18:00.0", "0000:00:01.0"


def _dev(d: Path, vendor: str, cls: str, width_cur: int, width_max: int, aer: bool) -> None:
    d.mkdir(parents=True)
    for name, text in (("vendor", vendor), ("class", cls), ("current_link_speed", "16.0 GT/s PCIe"),
                       ("max_link_speed", "16.0 GT/s PCIe"), ("current_link_width", str(width_cur)),
                       ("max_link_width", str(width_max))):
        (d / name).write_text(text + "\n")
    if aer:
        (d / "aer_dev_correctable").write_text("RxErr 0\nBadTLP 0\nTOTAL_ERR_COR 0\n")
        (d / "aer_dev_fatal").write_text("DLP 0\nTOTAL_ERR_FATAL 0\n")
        (d / "aer_dev_nonfatal").write_text("TLP 0\nTOTAL_ERR_NONFATAL 0\n")


def tree(tmp: Path, slot_width: int, gpu_width: int = 8, gpu_max: int = 16) -> Path:
    """capture/sys with one root port (x``slot_width`` capable) and a T4-like GPU below it."""
    root = tmp / f"slot-x{slot_width}" / "sys"
    port = root / "devices" / "pci0000:00" / PORT
    _dev(port, "0x8086", "0x060400", gpu_width, slot_width, aer=False)
    _dev(port / GPU, "0x10de", "0x030200", gpu_width, gpu_max, aer=True)
    devs = root / "bus" / "pci" / "devices"
    devs.mkdir(parents=True)
    os.symlink(f"../../../devices/pci0000:00/{PORT}", devs / PORT)
    os.symlink(f"../../../devices/pci0000:00/{PORT}/{GPU}", devs / GPU)
    return root


def stream(tmp: Path, sysroot: Path, polls: int = 3) -> set[tuple[str, str, str]]:
    sim = SimNvml(1, arch="ampere")
    sim.pcie_downtrain(0, gen=None, width=8)
    kmsg = tmp / f"kern-{sysroot.parent.name}.log"
    kmsg.write_text("")
    c = Collector(CollectorSettings(host="n1", sysfs_root=str(sysroot), proc_root=str(tmp / "proc"),
                                    kmsg_path=str(kmsg), state_dir=str(tmp / f"st-{sysroot.parent.name}"),
                                    fsync=False, expected_gpus=1), sink=_Null(), nvml=sim)
    engine, out = DetectorEngine(RuleSet.load()), []
    try:
        for _ in range(polls):
            s = c.poll_once()
            out += engine.feed(s)
    finally:
        c.close(flush_timeout=0.1)
    g = s.gpus[0]
    assert (g.pcie.width_current, g.pcie.width_max) == (8, 16)
    return {(i.failure_mode, i.component, i.detector) for i in out if i.state == "open"}


class _Null:
    def send_batch(self, records):
        return len(records)

    def close(self):
        pass


def test_the_collector_reads_the_slot_of_each_endpoint(tmp_path: Path) -> None:
    devs = {d.pci_addr: d for d in read_pcie(tree(tmp_path, 16), ReadStats())}
    assert (devs[GPU].upstream, devs[GPU].upstream_width_max, devs[GPU].upstream_gen_max) == (PORT, 16, 4)
    assert devs[PORT].upstream is None  # a bridge's link runs to what is below it


@pytest.mark.parametrize("slot,degraded", [(16, True), (8, False)])
def test_x8_gpu_is_judged_against_its_slot_on_both_paths(tmp_path: Path, slot: int, degraded: bool) -> None:
    sysroot = tree(tmp_path, slot)
    got = stream(tmp_path, sysroot)
    d = diagnose_path(sysroot.parent)
    diag = {(f.failure_mode, f.component) for f in d.findings}
    if degraded:
        assert ("pcie_link_degraded", GPU, "pcie.gpu.width-slot") in got
        assert ("pcie_link_degraded", GPU) in diag
        (f,) = [f for f in d.findings if f.component == GPU]
        assert f.confidence >= 0.9 and "slot that allows x16" in " ".join(e.fact for e in f.evidence)
    else:
        assert got == set() and diag == set() and d.outcome == "healthy"


def test_without_the_slot_the_gpu_rule_still_judges_against_the_gpus_max(tmp_path: Path) -> None:
    """No sysfs link tree (a VM without the bridge, a container): the NVML max alone, as before."""
    (tmp_path / "empty").mkdir()
    got = stream(tmp_path, tmp_path / "empty")
    assert {d for _m, _c, d in got} == {"pcie.gpu.width"}


LSPCI = """\
00:01.0 PCI bridge: Intel Corporation Device 352a (rev 04) (prog-if 00 [Normal decode])
\tBus: primary=00, secondary=18, subordinate=18, sec-latency=0
\tCapabilities: [40] Express (v2) Root Port (Slot+), MSI 00
\t\tLnkCap:\tPort #1, Speed 16GT/s, Width x{slot}, ASPM L1, Exit Latency L1 <16us
\t\tLnkSta:\tSpeed 8GT/s (downgraded), Width x8{sdown}

18:00.0 3D controller: NVIDIA Corporation TU104GL [Tesla T4] (rev a1)
\tCapabilities: [68] Express (v2) Endpoint, MSI 00
\t\tLnkCap:\tPort #0, Speed 8GT/s, Width x16, ASPM not supported
\t\tLnkSta:\tSpeed 8GT/s (ok), Width x8 (downgraded)
"""


@pytest.mark.parametrize("slot,degraded", [(16, True), (8, False)])
def test_lspci_capture_judges_the_gpu_against_the_root_ports_lnkcap(tmp_path: Path, slot: int,
                                                                    degraded: bool) -> None:
    f = tmp_path / "lspci-vvv.txt"
    f.write_text(LSPCI.format(slot=slot, sdown=" (downgraded)" if slot == 16 else " (ok)"))
    d = diagnose_path(f)
    assert d.error is None or d.error == "", d.error
    got = {(x.failure_mode, x.component, x.detector) for x in d.findings}
    if degraded:
        assert got == {("pcie_link_degraded", GPU, "pcie.aer.width-slot")}
    else:
        assert got == set() and d.outcome == "healthy"


def test_gen_under_load_is_judged_against_the_slots_generation_too() -> None:
    import msgspec

    from simulator.fixtures import HostSeries

    def run(gen: int, slot_gen: int | None) -> set[str]:
        hs, engine, out = HostSeries(), DetectorEngine(RuleSet.load()), []

        def fn(s):
            g = s.gpus[0]
            s.gpus[0] = msgspec.structs.replace(g, utilization_pct=95.0, pcie=msgspec.structs.replace(
                g.pcie, gen_current=gen, slot_gen_max=slot_gen, slot_width_max=16))
        for _ in range(4):
            out += engine.feed(hs.advance(fn))
        return {i.detector for i in out if i.state == "open"}
    assert run(4, 4) == set()  # a gen5 GPU at gen4 in a gen4 slot: slot-limited
    assert run(3, 4) == {"pcie.gpu.gen-under-load"}
    assert run(4, None) == {"pcie.gpu.gen-under-load"}  # slot unknown: the GPU's max, as before
