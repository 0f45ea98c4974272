"""sysfs readers on a fixture tree shaped like an H100 node, including files that vanish mid-read."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from collectors import sysfs
from collectors.sysfs import ReadStats, parse_aer_counters, read_edac, read_net_ports, read_pcie

SYS = Path(__file__).resolve().parents[1] / "fixtures" / "collectors" / "sysfs-h100" / "sys"
CORPUS = Path(__file__).resolve().parents[2] / ".." / "shared" / "corpus"


def test_pcie_link_and_aer():
    st = ReadStats()
    devs = {d.pci_addr: d for d in read_pcie(SYS, st)}
    assert set(devs) == {"0000:18:00.0", "0000:3b:00.0", "0000:00:02.0"}  # the host bridge has neither
    gpu = devs["0000:3b:00.0"]
    assert (gpu.link_gen_current, gpu.link_gen_max, gpu.link_width_current, gpu.link_width_max) == (1, 5, 8, 16)
    assert gpu.correctable["RxErr"] == 12 and gpu.correctable["TOTAL_ERR_COR"] == 15
    assert devs["0000:00:02.0"].fatal["SDES"] == 1
    assert st.vanished == st.unreadable == 0


def test_aer_text_malformed_lines_dropped():
    assert parse_aer_counters("RxErr 3\ngarbage\nBadTLP x\nTOTAL_ERR_COR 3\n") == {"RxErr": 3, "TOTAL_ERR_COR": 3}


def test_net_ports_states_rates_and_odd_counters():
    st = ReadStats()
    ports = {p.device: p for p in read_net_ports(SYS, st)}
    a = ports["mlx5_0"]
    assert (a.state, a.phys_state, a.rate_gbps, a.link_layer) == ("ACTIVE", "LinkUp", 400.0, "InfiniBand")
    assert a.counters["port_xmit_wait"] == 4294967295 and a.counters["link_downed"] == 255  # saturated, as read
    assert a.counters["hw_local_ack_timeout_err"] == 0
    down = ports["mlx5_1"]
    assert (down.state, down.phys_state, down.rate_gbps) == ("DOWN", "Disabled", 10.0)
    assert ports["mlx5_2"].link_layer == "Ethernet" and ports["mlx5_2"].counters["hw_roce_adp_retrans"] == 99
    assert ports["i40iw0"].counters == {}
    assert st.non_numeric == 3  # "N/A (no PMA)" skipped and counted, not an error


def test_edac_both_layouts():
    mcs = {m.mc: m for m in read_edac(SYS, ReadStats())}
    assert mcs[0].ce_count == 7 and [(d.label, d.ce) for d in mcs[0].dimms] == [
        ("CPU_SrcID#0_MC#0_Chan#0_DIMM#0", 5), ("CPU_SrcID#0_MC#0_Chan#1_DIMM#0", 2)]
    assert mcs[1].ue_count == 2 and mcs[1].ue_noinfo_count == 1
    assert [(d.label, d.ue) for d in mcs[1].dimms] == [
        ("CPU_SrcID#1_Ha#0_Chan#0_DIMM#0", 1), ("CPU_SrcID#1_Ha#0_Chan#1_DIMM#0", 1)]


def test_file_vanishing_between_listdir_and_read(tmp_path, monkeypatch):
    root = tmp_path / "sys"
    shutil.copytree(SYS, root)
    victim = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters" / "symbol_error"
    real_listdir = sysfs.listdir

    def listdir_then_unplug(path, stats):  # the directory is listed, then the device goes away
        names = real_listdir(path, stats)
        if Path(path) == victim.parent and victim.exists():
            victim.unlink()
        return names

    monkeypatch.setattr(sysfs, "listdir", listdir_then_unplug)
    st = ReadStats()
    ports = {p.device: p for p in read_net_ports(root, st)}
    assert "symbol_error" not in ports["mlx5_0"].counters
    assert ports["mlx5_0"].counters["link_downed"] == 255  # the rest of the port still read
    assert st.vanished == 1 and any(s.startswith("vanished:") and "symbol_error" in s for s in st.skipped)


def test_whole_device_vanishing_mid_read(tmp_path, monkeypatch):
    root = tmp_path / "sys"
    shutil.copytree(SYS, root)
    dev = root / "bus" / "pci" / "devices" / "0000:3b:00.0"
    real = sysfs.read_text

    def read_then_remove(path, stats):
        out = real(path, stats)
        if Path(path).name == "aer_dev_correctable" and dev.exists() and Path(path).parent == dev:
            shutil.rmtree(dev)
        return out

    monkeypatch.setattr(sysfs, "read_text", read_then_remove)
    st = ReadStats()
    devs = {d.pci_addr: d for d in read_pcie(root, st)}
    assert devs["0000:3b:00.0"].correctable["RxErr"] == 12 and devs["0000:3b:00.0"].fatal == {}
    assert st.vanished >= 3 and len(devs) == 3


def test_unreadable_file_counted(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads files regardless of mode")
    root = tmp_path / "sys"
    shutil.copytree(SYS, root)
    f = root / "devices" / "system" / "edac" / "mc" / "mc0" / "ce_count"
    f.chmod(0)
    st = ReadStats()
    mcs = {m.mc: m for m in read_edac(root, st)}
    assert mcs[0].ce_count is None and st.unreadable == 1


def test_missing_root_is_empty_not_error(tmp_path):
    st = ReadStats()
    assert read_pcie(tmp_path, st) == [] and read_net_ports(tmp_path, st) == [] and read_edac(tmp_path, st) == []


@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus not present on this machine")
def test_corpus_trees():
    st = ReadStats()
    ports = read_net_ports(CORPUS / "infiniband-sysfs" / "gpud-h100-ndr-8hca-tree" / "sys", st)
    assert len(ports) == 9 and all(p.state == "ACTIVE" for p in ports)  # 8 NDR HCAs + a RoCE bond
    assert sum(p.rate_gbps == 400.0 for p in ports) == 8
    st2 = ReadStats()
    read_net_ports(CORPUS / "infiniband-sysfs" / "node-exporter-i40iw-no-pma" / "sys", st2)
    assert st2.non_numeric > 0
