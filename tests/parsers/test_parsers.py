"""Parsers: contract-shaped values from captured output, format sniffing, and bad input -> ParseError."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.schema import decode_sample, encode
from parsers import PARSERS, ParseError, detect_format, load, parse_captures, parse_text
from parsers.mce import decode_status

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "parsers"


def test_nvsmi_text_ampere_layout() -> None:
    p = load(FIX / "a100-q-dbe-remap-pending.txt")
    assert p.format == "nvidia-smi-q"
    g0, g1 = p.sample.gpus
    assert g0.pci_bus_id == "0000:07:00.0" and g0.uuid.startswith("GPU-1111")
    assert g0.ecc is not None and g0.ecc.dram_uncorrected_volatile == 2 and g0.ecc.dram_corrected_aggregate == 40
    assert g0.retired_pages is not None and g0.retired_pages.dbe is None  # "N/A" is not 0
    assert g0.remapped_rows is not None and g0.remapped_rows.pending is True and g0.remapped_rows.uncorrectable == 1
    assert g0.clocks_event_reasons == 0 and g0.utilization_pct == 97
    assert g1.pcie is not None and (g1.pcie.gen_current, g1.pcie.gen_max) == (1, 4)
    assert p.gpu_info[1].pstate == "P8"
    assert p.warnings == []


def test_nvsmi_text_old_single_double_bit_layout() -> None:
    p = load(FIX / "v100-q-old-ecc-layout-healthy.txt")
    e = p.sample.gpus[0].ecc
    assert e is not None
    assert (e.dram_corrected_volatile, e.sram_corrected_volatile) == (3, 1)  # Total 4 - Device Memory 3
    assert (e.dram_uncorrected_volatile, e.sram_uncorrected_volatile) == (0, 0)
    assert p.gpu_info[0].temp_max_operating_c == 83


def test_nvsmi_text_misaligned_field_is_parse_error() -> None:
    good = (FIX / "v100-q-old-ecc-layout-healthy.txt").read_text()
    bad = good.replace("        SW Thermal Slowdown         : Not Active",
                       "        Bogus SW Thermal Slowdown           : Not Active")
    with pytest.raises(ParseError, match="aligned to column"):
        parse_text(bad, "nvidia-smi-q")


def test_nvsmi_xml_old_dtd_and_count_mismatch() -> None:
    p = load(FIX / "t4-q-x-v10-thermal.xml")
    g = p.sample.gpus[0]
    assert g.clocks_event_reasons == 0x8 | 0x40
    assert g.temperature_c == 91 and p.gpu_info[0].temp_slowdown_c == 93
    assert any("attached_gpus" in w for w in p.warnings)
    with pytest.raises(ParseError):
        parse_text("<nvidia_smi_log><gpu>", "nvidia-smi-xml")


def test_table_lost_gpu_and_nvlink() -> None:
    t = load(FIX / "table-gpu-lost.txt")
    assert [f.kind for f in t.facts] == ["gpu_no_handle"] and t.facts[0].component == "0000:86:00.0"
    assert t.sample.expected_gpus == 2
    n = load(FIX / "nvlink-e-crc-recovery.txt")
    nv = n.sample.gpus[0].nvlink
    assert nv is not None and nv.crc_flit == [0, 9871] and nv.recovery == [0, 3]
    s = load(FIX / "nvlink-s-one-inactive.txt")
    assert s.sample.gpus[0].nvlink.active == [True, False, True]  # type: ignore[union-attr]


def test_infiniband_tools() -> None:
    ib = load(FIX / "ibstat-port-down.txt")
    assert [(p.device, p.state, p.phys_state, p.rate_gbps) for p in ib.sample.net_ports] == [
        ("mlx5_0", "DOWN", "Polling", 10), ("mlx5_1", "ACTIVE", "LinkUp", 400)]
    pq = load(FIX / "perfquery-symbol-errors.txt")
    c = pq.sample.net_ports[0].counters
    assert c["symbol_error"] == 65535 and c["link_downed"] == 2 and c["port_xmit_wait"] == 4294967295
    sy = load(FIX / "sysfs-ib-flap")
    assert sy.sample.net_ports[0].counters == {"link_downed": 255, "symbol_error": 0, "port_xmit_wait": 4294967295}
    assert sy.skipped_lines == 1  # "N/A (no PMA)" is skipped and counted, not parsed as an error count


def test_prometheus_lenient() -> None:
    p = load(FIX / "dcgm-exporter-dbe-xid.prom")
    assert p.skipped_lines == 1 and p.warnings
    assert [f.attrs["xid"] for f in p.facts if f.kind == "xid_metric"] == [95]


def test_kernel_log_prefixes_and_aer_detail() -> None:
    k = load(FIX / "dmesg-T-xid79-aer.log")
    kinds = [e.kind for e in k.sample.kernel_events]
    assert "xid" in kinds and "aer" in kinds
    (item,) = [f for f in k.facts if f.kind == "aer_error"]
    assert item.attrs == {"severity": "fatal", "layer": "Transaction Layer", "bit": 5, "name": "SDES"}
    raw = load(FIX / "kmsg-raw-app-xid13.log")
    assert [e.xid for e in raw.sample.kernel_events] == [13, 13]


def test_mca_decoding() -> None:
    intel_mem = decode_status(0x8C00004000010092)
    assert intel_mem["memory"] is True and intel_mem["corrected"] and "channel 2" in intel_mem["desc"]
    internal = decode_status(0xFA00000000400405)
    assert internal["memory"] is False and internal["uncorrected"]
    amd_umc = decode_status(0xDC2040000000011B, ipid=0x9600050F00)
    assert amd_umc["memory"] is True and amd_umc["corrected"]
    amd_other = decode_status(0xDC2040000000011B, ipid=0xB000000000)
    assert amd_other["memory"] is False
    m = load(FIX / "mcelog-internal-only.txt")
    assert m.facts[0].attrs["memory"] is False


def test_lspci_and_sysfs_edac() -> None:
    lp = load(FIX / "lspci-gpu-x8.txt")
    d = lp.sample.aer[0]
    assert (d.link_gen_current, d.link_gen_max, d.link_width_current, d.link_width_max) == (5, 5, 8, 16)
    assert d.correctable == {"RxErr": 1}
    ed = load(FIX / "sysfs-edac-healthy")
    assert ed.sample.edac[0].dimms[0].label == "CPU_SrcID#0_MC#0_Chan#0_DIMM#0"
    assert ed.sample.edac[0].dimms[0].ce == 3


@pytest.mark.parametrize("name", sorted(p.name for p in FIX.iterdir() if p.is_file()))
def test_detect_format_from_content_not_name(name: str, tmp_path: Path) -> None:
    text = (FIX / name).read_text()
    parts = parse_captures(text, name)
    assert [p.format for p in parse_captures(text, "capture.bin.txt")] == [p.format for p in parts]
    assert any(not p.format.endswith("(fallback)") for p in parts), name
    for parsed in parts:
        assert decode_sample(encode(parsed.sample)) == parsed.sample  # contract-valid
    if len(parts) == 1 and "(fallback)" not in parts[0].format and "$ " not in text and "# " not in text:
        renamed = tmp_path / "capture.bin.txt"
        renamed.write_text(text)
        assert load(renamed).format == detect_format(text) == parts[0].format


def test_unknown_format_is_parse_error() -> None:
    with pytest.raises(ParseError, match="unrecognised"):
        detect_format("just some words\n", "x.txt")


_texts = st.one_of(
    st.text(max_size=400),
    st.binary(max_size=400).map(lambda b: b.decode("utf-8", "replace")),
    st.lists(st.sampled_from([
        "GPU 00000000:07:00.0", "    ECC Errors", "        Volatile", "            DRAM Uncorrectable : 9x",
        "Attached GPUs : 99999999999999999999", "<nvidia_smi_log>", "<gpu id='x'>", "</gpu>",
        "NVRM: Xid (PCI:0000:07:00): 99999999, pid=1", "Link 99: <inactive>", "GPU 3: X (UUID: G)",
        "# Port counters: Lid 1 port 1", "SymbolErrorCounter:....-5", "=== ./link_downed ===", "abc",
        "DCGM_FI_DEV_XID_ERRORS{gpu=\"-1\"} 1e400", "CA 'x'", "\tPort 1:", "\t\tRate: 1e999",
        "EDAC MC0: 99999999999999999999999 CE x on y", "mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 1: "
        "ffffffffffffffff", "STATUS zz", "Label\tCE\tUE", "a\t-1\t2", "| PCIe | Fail |", "gpuId 1:", "  U D X",
        "NIC statistics:", "     rx_crc_errors_phy: -3", "Settings for eth0:", "\tSpeed: Unknown!",
        "00:01.0 3D controller: x", "\t\tLnkSta:\tSpeed 2.5GT/s, Width x99", "ibqueryerrors",
    ]), max_size=30).map("\n".join),
)


@settings(max_examples=150, deadline=None)
@given(text=_texts)
def test_every_parser_returns_or_raises_parse_error(text: str) -> None:
    for parser in PARSERS.values():
        try:
            parser(text)
        except ParseError:
            pass
    try:
        parse_text(text)
    except ParseError:
        pass
