"""The Prometheus mapping table (parsers/prom_map.tsv) and the last-value Xid tracker.

Every series the table maps is decoded from a line in dcgm-exporter's / node_exporter's real scrape
shape (the label set is taken from the shared corpus's captures at test time); a series a scrape
does not carry comes out None ("not available"), never 0; a bad table row names file:line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleethealth.schema import Sample, decode_sample, encode
from parsers import load, parse_text
from parsers.prom import parse_metrics
from parsers.prom_map import PromMapError, build, load_map, parse_map
from parsers.prom_xid import XidGaugeTracker

CORPUS = Path(__file__).resolve().parents[2] / ".." / "shared" / "corpus" / "dcgm-exporter"
L40S = CORPUS / "l40s-upcloud-1gpu-healthy.prom"
VGPU = CORPUS / "grid-a100-10c-vgpu-vks-healthy.prom"
needs_corpus = pytest.mark.skipif(not L40S.exists(), reason="shared corpus not present")


def _corpus_labels() -> str:
    """The label block of the first DCGM sample in a real scrape (gpu, UUID, pci_bus_id, device,
    modelName, Hostname, DCGM_FI_DRIVER_VERSION)."""
    line = next(ln for ln in L40S.read_text().splitlines() if ln.startswith("DCGM_FI_"))
    return re.search(r"\{(.*)\}", line).group(1)  # type: ignore[union-attr]


def _value_for(kind: str) -> str:
    return {"flag": "1", "small": "4", "gauge": "42.5", "bitmask": "96", "xid_last": "79"}.get(kind, "7")


def _contract_value(sample: Sample, contract: str) -> object:
    obj: object = sample.gpus[0]
    for part in contract.split(".")[1:]:
        part = part.removesuffix("[n]")
        obj = getattr(obj, part)
    return obj


@needs_corpus
def test_every_mapped_dcgm_field_decodes_from_a_real_scrape_line() -> None:
    table = load_map()
    labels = _corpus_labels()
    rows = [r for r in table.rows if r.target == "gpu" and r.kind not in ("xid_window",)]
    assert len(rows) >= 30
    for r in rows:
        name = r.series.replace("{n}", "3")
        text = f"# HELP {name} x\n# TYPE {name} gauge\n{name}{{{labels}}} {_value_for(r.kind)}\n"
        p = parse_text(text)  # sniffed as the dcgm-exporter format, the one parser
        assert p.format == "dcgm-exporter" and len(p.sample.gpus) == 1, r.series
        assert p.sample.gpus[0].uuid == "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43"
        if r.kind == "xid_last":
            assert [f.attrs["xid"] for f in p.facts if f.kind == "xid_metric"] == [79]
            continue
        got = _contract_value(p.sample, r.contract)
        want = {"flag": True, "small": 4, "gauge": 42.5, "bitmask": 96}.get(r.kind, 7)
        if r.per_link:
            assert got == [None, None, None, 7], r.series  # links 0-2 not exported: not available
        elif r.struct == "nvlink":
            assert got == [7], r.series
        else:
            assert got == want, r.series
        decode_sample(encode(p.sample))  # and it is a valid contract sample


@needs_corpus
def test_fields_a_scrape_does_not_carry_are_not_available() -> None:
    p = load(VGPU)  # a real vGPU guest: no ECC, no remap-pending, no NVLink series
    g = p.sample.gpus[0]
    assert g.ecc is None and g.nvlink is None and g.retired_pages is None
    assert g.remapped_rows is None or g.remapped_rows.pending is None
    assert g.temperature_c is None and g.utilization_pct == 0.0  # what it does export is read
    real = load(L40S)
    rr = real.sample.gpus[0].remapped_rows
    assert rr is not None and rr.uncorrectable == 0 and rr.failure is False
    assert rr.pending is None  # ROW_REMAP_PENDING is not in the default CSV: not available, not "no"
    assert real.sample.gpus[0].ecc is None


def test_mig_series_fold_and_bad_values_are_counted() -> None:
    mig = CORPUS / "a800-8gpu-gpu0-mig-excerpt.prom"
    if not mig.exists():
        pytest.skip("shared corpus not present")
    p = load(mig)
    assert [g.index for g in p.sample.gpus] == list(range(8))
    assert p.skipped_lines > 0  # ERROR - FAILED TO CONVERT TO STRING lines


NODE = """\
# HELP node_infiniband_state_id State of the InfiniBand port
# TYPE node_infiniband_state_id gauge
node_infiniband_state_id{device="mlx5_0",port="1"} 4
node_infiniband_state_id{device="mlx5_1",port="1"} 1
node_infiniband_physical_state_id{device="mlx5_0",port="1"} 5
node_infiniband_physical_state_id{device="mlx5_1",port="1"} 2
node_infiniband_rate_bytes_per_second{device="mlx5_0",port="1"} 5e+10
node_infiniband_symbol_error_total{device="mlx5_0",port="1"} 12
node_infiniband_link_downed_total{device="mlx5_0",port="1"} 1
node_infiniband_port_data_received_bytes_total{device="mlx5_0",port="1"} 4000
node_edac_correctable_errors_total{controller="0"} 3
node_edac_uncorrectable_errors_total{controller="0"} 0
node_edac_csrow_correctable_errors_total{controller="0",csrow="0"} 2
node_edac_csrow_correctable_errors_total{controller="0",csrow="unknown"} 1
node_edac_csrow_uncorrectable_errors_total{controller="0",csrow="0"} 0
node_boot_time_seconds 1.7e+09
node_network_carrier{device="eno2"} 0
"""


def test_node_exporter_series() -> None:
    p = parse_text(NODE)
    ports = {(n.device, n.port): n for n in p.sample.net_ports}
    a, b = ports[("mlx5_0", 1)], ports[("mlx5_1", 1)]
    assert (a.state, a.phys_state, a.rate_gbps) == ("ACTIVE", "LinkUp", 400.0)
    assert (b.state, b.phys_state, b.rate_gbps) == ("DOWN", "Polling", None)
    assert a.counters == {"symbol_error": 12, "link_downed": 1, "port_rcv_data": 1000}
    assert b.counters == {}  # not exported: absent, not 0
    (mc,) = p.sample.edac
    assert (mc.ce_count, mc.ue_count, mc.ce_noinfo_count, mc.ue_noinfo_count) == (3, 0, 1, None)
    assert [(d.label, d.ce, d.ue) for d in mc.dimms] == [("mc0/csrow0", 2, 0)]
    assert p.sample.boot_id == "btime:1700000000"
    decode_sample(encode(p.sample))


def test_per_link_beats_the_total_and_dev_beats_total() -> None:
    lab = 'gpu="0",UUID="GPU-a"'
    text = (f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{lab}}} 9\n"
            f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L1{{{lab}}} 9\n"
            f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0{{{lab}}} 0\n"
            f"DCGM_FI_DEV_ECC_DBE_VOL_DEV{{{lab}}} 2\nDCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{lab}}} 5\n")
    g = build(parse_metrics(text)[0]).gpus[0]
    assert g.nvlink is not None and g.nvlink.crc_flit == [0, 9]
    assert g.ecc is not None and g.ecc.dram_uncorrected_volatile == 2


HEAD = "series\tkind\tcontract\tunit\tscale\tdcgm_csv\tnote\n"


@pytest.mark.parametrize("row, msg", [
    ("DCGM_FI_X\tcountr\tgpu.ecc.dram_corrected_volatile\terrors\t1\tabsent\tn", "unknown kind"),
    ("DCGM_FI_X\tcounter\tgpu.ecc.dram_corrected_volatil\terrors\t1\tabsent\tn", "has no field"),
    ("DCGM_FI_X\tcounter\tgpu.ecc.dram_corrected_volatile\terrors\t1\tmaybe\tn", "dcgm_csv"),
    ("DCGM_FI_X\tcounter\tgpu.ecc.dram_corrected_volatile\terrors\t0\tabsent\tn", "positive"),
    ("DCGM_FI_X\tcounter\tgpu.ecc.dram_corrected_volatile\terrors\t1\tnode_exporter\tn", "node_exporter"),
    ("DCGM_FI_X\tunmapped\tgpu.temperature_c\tC\t1\tabsent\tn", "contract must be '-'"),
    ("DCGM_FI_X_L{n}\tcounter\tgpu.nvlink.crc_flit\terrors\t1\tabsent\tn", "needs [n]"),
    ("node_x\tcounter\tnet_port.state\tenum\t1\tnode_exporter\tn", "takes kind ib_state"),
    ("DCGM_FI_X\tcounter\tgpu.ecc.dram_corrected_volatile\terrors\t1\tabsent", "columns"),
])
def test_bad_rows_name_file_and_line(row: str, msg: str) -> None:
    with pytest.raises(PromMapError, match=rf"^map.tsv:3: .*{re.escape(msg)}"):
        parse_map("# comment\n" + HEAD + row + "\n", "map.tsv")


def test_duplicate_series_is_refused() -> None:
    row = "DCGM_FI_X\tgauge\tgpu.temperature_c\tC\t1\tabsent\tn\n"
    with pytest.raises(PromMapError, match=r"map.tsv:3: DCGM_FI_X is already mapped at line 2"):
        parse_map(HEAD + row + row, "map.tsv")


def test_shipped_table_covers_the_default_csv_state() -> None:
    rows = {r.series: r for r in load_map().rows}
    assert rows["DCGM_FI_DEV_XID_ERRORS"].dcgm_csv == "default"
    assert rows["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"].dcgm_csv == "commented"
    assert rows["DCGM_FI_DEV_ROW_REMAP_PENDING"].dcgm_csv == "absent"
    assert {r.dcgm_csv for r in rows.values() if r.series.startswith("node_")} == {"node_exporter"}
    assert any(s.startswith("node_edac_") for s in rows) and any(s.startswith("node_network_") for s in rows)


# --------------------------------------------------------------------------- the Xid gauge tracker


def _xid_parts(value: int, uuid: str = "GPU-a"):
    return build(parse_metrics(f'DCGM_FI_DEV_XID_ERRORS{{gpu="0",UUID="{uuid}"}} {value}\n')[0], evidence=False)


def _run(values: list[int], t: XidGaugeTracker | None = None) -> list[list[int]]:
    t = t or XidGaugeTracker()
    out = []
    for i, v in enumerate(values):
        p = _xid_parts(v)
        t.apply(p, 1000.0 + i)
        out.append([e.xid for e in p.gpus[0].xids])
    return out


def test_a_change_is_one_event_a_repeat_is_not() -> None:
    assert _run([0, 0, 79, 79, 79, 48, 48, 79]) == [[], [], [79], [], [], [48], [], [79]]


def test_a_reset_to_zero_is_not_an_event_and_the_old_value_after_it_is_new() -> None:
    assert _run([0, 13, 0, 13]) == [[], [13], [], [13]]


def test_a_latched_value_at_the_first_scrape_is_one_event_with_unknown_time() -> None:
    t = XidGaugeTracker()
    p = _xid_parts(94)
    t.apply(p, 5.0)
    (ev,) = p.gpus[0].xids
    assert ev.xid == 94 and "time unknown" in ev.message


def test_state_survives_a_restart() -> None:
    t = XidGaugeTracker()
    _run([0, 79], t)
    saved = t.to_json()
    again = XidGaugeTracker.from_json(saved)
    assert _run([79, 79, 31], again) == [[], [], [31]]  # no repeat of 79 after the restart
    assert XidGaugeTracker.from_json({"v": 1, "gpus": "garbage"}).to_json()["gpus"] == {}
    assert XidGaugeTracker.from_json(None).to_json()["gpus"] == {}


def test_window_counts_rise_into_events_and_replace_the_gauge() -> None:
    t = XidGaugeTracker()

    def scrape(last: int, window: dict[int, int], ts: float) -> list[int]:
        lines = [f'DCGM_FI_DEV_XID_ERRORS{{gpu="0",UUID="GPU-w"}} {last}']
        lines += [f'DCGM_FI_DEV_XID_ERRORS_ACTIVE{{gpu="0",UUID="GPU-w",window_size_in_ms="300000",xid="{x}"}} {n}'
                  for x, n in window.items()]
        p = build(parse_metrics("\n".join(lines) + "\n")[0], evidence=False)
        t.apply(p, ts)
        return sorted(e.xid for e in p.gpus[0].xids)

    assert scrape(0, {}, 1) == []
    assert scrape(42, {42: 1}, 2) == [42]  # seen through both series: one event, not two
    assert scrape(42, {42: 3}, 3) == [42, 42]
    assert scrape(42, {42: 1}, 4) == []  # ageing out
    assert scrape(42, {}, 5) == []
    assert scrape(42, {42: 1}, 6) == [42]
