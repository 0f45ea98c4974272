"""The common tools' output, each from a fixture of our own in the tool's format, read through the same
entry diagnose uses (format from the content, else the command line above it). Parsers give contract
values and facts; what they mean is the rules' business, so these tests check values, not verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from parsers import Parsed, parse_captures, sysfs_snapshot
from parsers.sysfs_snapshot import parse_aer_counters

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "parsers"


def one(name: str) -> Parsed:
    parts = [p for p in parse_captures((FIX / name).read_text(), name) if not p.format.endswith("(fallback)")]
    assert len(parts) == 1, [p.format for p in parse_captures((FIX / name).read_text(), name)]
    return parts[0]


def facts(p: Parsed, kind: str) -> list:
    return [f for f in p.facts if f.kind == kind]


def test_ras_mc_ctl_errors_with_wrapped_records() -> None:
    p = one("ras-mc-ctl-errors-wrapped.txt")
    assert p.format == "ras-mc-ctl"
    recs = facts(p, "mce_record")
    assert [(r.component, r.attrs["memory"], r.attrs["corrected"]) for r in recs] == [
        ("bank 15", True, True), ("bank 18", True, True)]  # Intel MC code 0x0092; AMD UMC by IPID/bank name
    assert "n_errors=1" in recs[0].line  # the wrapped lines were joined into one record
    assert [r.attrs["record_id"] for r in recs] == [7, 8]


def test_ras_mc_ctl_error_count_and_summary() -> None:
    counts = {f.component: (f.attrs["ce"], f.attrs["ue"]) for f in facts(one("ras-mc-ctl-error-count.txt"),
                                                                          "dimm_counts")}
    assert counts == {"P0_DIMM_B1": (812, 0), "P1_DIMM_A1": (0, 1)}
    s = one("ras-mc-ctl-summary.txt")
    assert {f.component: (f.attrs["ce"], f.attrs["ue"]) for f in facts(s, "dimm_counts")} == counts
    assert [(f.attrs["count"], f.attrs["what"]) for f in facts(s, "mce_summary")] == [
        (3, "MEMORY CONTROLLER RD_CHANNEL2_ERR")]


def test_ibqueryerrors() -> None:
    p = one("ibqueryerrors-two-ports.txt")
    ports = {(x.device, x.port): x.counters for x in p.sample.net_ports}
    assert ports[("gpu-node-012 mlx5_2 0xb8cef60300a1b2c4", 1)] == {
        "symbol_error": 3120, "link_error_recovery": 9, "link_downed": 4}
    assert ports[("leaf-sw-03 0x7cfe9003009aa1e0", 17)]["port_xmit_wait"] == 4294967295  # saturated, kept raw
    assert len(ports) == 2  # "port ALL" is the node's sum, not a port


@pytest.mark.parametrize(("name", "extended"), [("perfquery-symbol-errors.txt", False),
                                                ("perfquery-x-extended.txt", True)])
def test_perfquery_with_and_without_x(name: str, extended: bool) -> None:
    p = one(name)
    assert p.format == "perfquery"
    c = p.sample.net_ports[0].counters
    assert "symbol_error" in c and "link_downed" in c
    if extended:
        assert c["port_xmit_data"] == 88123456789012 and c["link_downed"] == 1


def test_ibstat_ibstatus_and_a_grepped_fragment() -> None:
    st = one("ibstatus-two-ports.txt")
    assert [(x.device, x.state, x.phys_state, x.rate_gbps) for x in st.sample.net_ports] == [
        ("mlx5_0", "ACTIVE", "LinkUp", 400.0), ("mlx5_1", "DOWN", "Polling", 10.0)]
    whole = one("ibstat-port-down.txt")
    assert whole.format == "ibstat" and whole.sample.net_ports
    frag = one("ibstat-grep-state-fragment.txt")
    assert [(x.device, x.port, x.state, x.phys_state, x.rate_gbps) for x in frag.sample.net_ports] == [
        ("mlx5_4", 1, "ACTIVE", "LinkUp", 400.0), ("mlx5_4", 2, "DOWN", "Polling", 10.0)]


def test_iblinkinfo() -> None:
    p = one("iblinkinfo-leaf.txt")
    links = {f.component: f.attrs for f in facts(p, "ib_link")}
    sw = "0x7cfe9003009aa1e0 leaf-sw-03"  # a switch is named by its GUID and description, as printed
    assert links[f"{sw} port 6"]["lane_gbps"] == 25.78125
    assert links[f"{sw} port 6"]["could_be_lane_gbps"] == 53.125
    assert links[f"{sw} port 7"]["state"] == "DOWN" and links[f"{sw} port 7"]["peer"] == ""
    # connected ports are contract ports; the empty cage (no peer) is a fact only
    assert sorted((x.device, x.port) for x in p.sample.net_ports) == [
        ("0x7cfe9003009aa1e0 leaf-sw-03", 5), ("0x7cfe9003009aa1e0 leaf-sw-03", 6), ("gpu-node-012 HCA-3", 1)]


def test_ethtool_whole_and_filtered() -> None:
    whole = one("ethtool-S-mlx5-crc.txt")
    assert whole.format == "ethtool-stats" and whole.sample.net_ports[0].counters
    f = one("ethtool-S-filtered.txt")
    port = f.sample.net_ports[0]
    assert port.device == "enp157s0f1np1" and port.counters == {
        "rx_crc_errors_phy": 88, "rx_symbol_err_phy": 3, "rx_discards_phy": 0, "tx_errors_phy": 0}


@pytest.mark.parametrize("name", ["nvlink-s-one-inactive.txt", "nvlink-e-crc-recovery.txt",
                                  "nvlink-c-capabilities.txt"])
def test_nvidia_smi_nvlink_s_e_c(name: str) -> None:
    p = one(name)
    assert p.format == "nvidia-smi-nvlink" and p.sample.gpus


def test_nvidia_smi_q_d_section() -> None:
    p = one("q-d-ecc-section.txt")
    ecc = p.sample.gpus[0].ecc
    assert p.format == "nvidia-smi-q" and ecc is not None
    assert (ecc.dram_uncorrected_volatile, ecc.dram_corrected_aggregate) == (2, 14)
    assert p.sample.gpus[0].pcie is None  # a -d ECC capture says nothing of the link: absent, not healthy


def test_dcgmi_diag() -> None:
    p = one("dcgmi-diag-r2-memory-fail.txt")
    fails = facts(p, "diag_fail")
    assert [f.component for f in fails] == ["GPU Memory"]
    notes = facts(p, "diag_note")
    assert any("DCGM_FR_FAULTY_MEMORY" in n.attrs["text"] and "memory elements" in n.attrs["text"] for n in notes)


def test_dcgmi_health_table_and_json() -> None:
    t = one("dcgmi-health-table-warning.txt")
    assert [f.attrs["level"] for f in facts(t, "dcgmi_health_overall")] == ["WARNING"]
    got = {(f.component, f.attrs["system"]): f.attrs for f in facts(t, "dcgmi_health")}
    assert set(got) == {("gpu2", "memory"), ("gpu2", "pcie")}
    assert got[("gpu2", "pcie")]["msgs"] == ["Detected more than 8 PCIe replays per minute for GPU 2"]
    j = one("dcgmi-health-json-failure.txt")
    assert [f.attrs["level"] for f in facts(j, "dcgmi_health_overall")] == ["FAILURE"]
    assert ("gpu5", "inforom") in {(f.component, f.attrs["system"]) for f in facts(j, "dcgmi_health")}


def test_dcgmi_dmon_xid_field() -> None:
    p = one("dcgmi-dmon-xider-temp.txt")
    assert [(f.component, f.attrs["xid"]) for f in facts(p, "xid_metric")] == [("gpu1", 79)]  # once, not per sample
    assert {f.attrs["field"] for f in facts(p, "dmon_value")} == {"TMPTR", "XIDER"}


def test_sysfs_aer_tree_grep_dump_and_old_names() -> None:
    tree = sysfs_snapshot.parse_files(sysfs_snapshot.read_tree(FIX / "sysfs-aer-gpu"))
    [dev] = tree.sample.aer
    assert dev.fatal == {"Undefined": 0, "Surprise Down Error": 1, "TOTAL_ERR_FATAL": 1}  # multi-word name kept
    assert (dev.link_gen_current, dev.link_width_current) == (5, 16)
    dump = one("sysfs-aer-grep-dump.txt")
    assert dump.format == "sysfs-aer"
    [d] = dump.sample.aer
    assert d.pci_addr == "0000:3b:00.0" and d.correctable["BadTLP"] == 4 and d.fatal["CmpltTO"] == 1
    old = one("sysfs-aer-cat-old-kernel-names.txt")
    [o] = old.sample.aer
    assert o.pci_addr == "0000:17:00.0" and o.correctable["Replay Timer Timeout"] == 7
    assert o.correctable["TOTAL_ERR_COR"] == 9
    assert parse_aer_counters("RxErr 3\nBad TLP 1\nnot a count x\n") == {"RxErr": 3, "Bad TLP": 1}


def test_lspci_lnksta_whole_and_fragment() -> None:
    whole = one("lspci-gpu-x8.txt")
    assert any(d.link_width_current is not None for d in whole.sample.aer)
    frag = one("lspci-grep-lnksta-fragment.txt")
    [d] = frag.sample.aer
    assert (d.pci_addr, d.link_gen_current, d.link_gen_max, d.link_width_current, d.link_width_max) == (
        "0000:3b:00.0", 5, 5, 8, 16)


def test_nvidia_smi_query_csv_without_header() -> None:
    p = one("nvsmi-query-gpu-csv-noheader.txt")
    rows = {f.component: f.attrs for f in facts(p, "gpu_query")}
    assert rows["gpu1"]["gpu_recovery_action"] == "Reset" and rows["gpu0"]["pci.bus_id"] == "00000000:18:00.0"


def test_lines_are_bounded_before_any_parser() -> None:
    text = "NIC statistics:\n     rx_crc_errors_phy: 1\n     " + "x" * 100_000 + ": 5\n"
    [p] = parse_captures(text)
    assert p.format == "ethtool-stats" and any("cut" in w for w in p.warnings)


def test_perfquery_grepped_without_header() -> None:
    p = one("perfquery-grep-no-header.txt")
    assert p.sample.net_ports[0].counters == {"symbol_error": 65535, "link_error_recovery": 255,
                                              "link_downed": 17, "port_rcv_errors": 3}  # saturated values kept raw
