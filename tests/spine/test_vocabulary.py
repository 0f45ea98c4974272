import csv
from pathlib import Path

import pytest

from fleethealth.taxonomy import ALL_LABELS, DRAIN_WORTHY, MODES, FailureMode, UnknownFailureMode, parse_mode
from fleethealth.xid import XidTableError, load_xid_table, xid_table

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO.parent / "shared" / "reference" / "nvidia-xid-catalog.tsv"


def test_vocabulary_matches_design():
    assert "healthy" in ALL_LABELS and len(ALL_LABELS) == 19
    assert FailureMode.GPU_FELL_OFF_BUS in DRAIN_WORTHY
    assert FailureMode.GPU_ECC_SBE_STORM not in DRAIN_WORTHY  # predictive: ticket, no drain
    assert FailureMode.APP_ERROR not in DRAIN_WORTHY
    assert all(MODES[m].actions for m in FailureMode if m is not FailureMode.HEALTHY)


def test_unknown_label_lists_the_vocabulary():
    with pytest.raises(UnknownFailureMode, match="gpu_dram_uce"):
        parse_mode("gpu_melted")


def test_xid_table_covers_every_catalog_entry():
    if not CATALOG.exists():
        pytest.skip(f"{CATALOG} not present (shared reference folder absent on this machine)")
    with CATALOG.open() as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    table = xid_table()
    assert {int(r["xid"]) for r in rows} == set(table)
    for r in rows:
        assert table[int(r["xid"])].immediate == r["immediate_action"].strip()


@pytest.mark.parametrize(
    "xid, mode, bucket",
    [(79, "gpu_fell_off_bus", "RESTART_BM"), (48, "gpu_dram_uce", "WORKFLOW_XID_48"),
     (64, "gpu_row_remap_failure", "RESET_GPU"), (13, "app_error", "RESTART_APP"),
     (43, "", "IGNORE"), (74, "gpu_nvlink_error", "WORKFLOW_NVLINK_ERR"), (119, "gpu_gsp_error", "RESET_GPU"),
     (62, "gpu_hw_error", "RESET_GPU"), (92, "gpu_ecc_sbe_storm", "IGNORE"), (95, "gpu_dram_uce", "RESET_GPU")],
)
def test_known_xids(xid, mode, bucket):
    info = xid_table()[xid]
    assert (info.failure_mode, info.immediate) == (mode, bucket)


@pytest.mark.parametrize(
    "body, words",
    [
        ("xid\tmnemonic\n1\tX\n", "header must be"),
        ("xid\tmnemonic\ta100\th100\tb100\tgb200\timmediate_action\tinvestigatory_action\tfailure_mode\n"
         "x1\tM\tYES\tYES\tYES\tYES\tRESET_GPU\t\tgpu_hw_error\n", "is not an integer"),
        ("xid\tmnemonic\ta100\th100\tb100\tgb200\timmediate_action\tinvestigatory_action\tfailure_mode\n"
         "1\tM\tYES\tYES\tYES\tYES\tPRAY\t\tgpu_hw_error\n", "unknown NVIDIA bucket"),
        ("xid\tmnemonic\ta100\th100\tb100\tgb200\timmediate_action\tinvestigatory_action\tfailure_mode\n"
         "1\tM\tYES\tYES\tYES\tYES\tRESET_GPU\t\tgpu_gremlins\n", "not in the vocabulary"),
        ("xid\tmnemonic\ta100\th100\tb100\tgb200\timmediate_action\tinvestigatory_action\tfailure_mode\n"
         "1\tM\tYES\tYES\tYES\tYES\tRESET_GPU\t\t\n1\tM\tYES\tYES\tYES\tYES\tRESET_GPU\t\t\n", "listed twice"),
        ("xid\tmnemonic\ta100\th100\tb100\tgb200\timmediate_action\tinvestigatory_action\tfailure_mode\n"
         "1\tM\tYES\n", "expected 9 columns"),
    ],
)
def test_bad_xid_table_names_file_and_line(tmp_path, body, words):
    p = tmp_path / "xid.tsv"
    p.write_text(body)
    with pytest.raises(XidTableError, match=words) as err:
        load_xid_table(p)
    assert f"{p}:" in str(err.value)
