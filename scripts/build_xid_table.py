#!/usr/bin/env python3
"""Build fleethealth/data/xid_catalog.tsv from NVIDIA's published Xid catalog.

Source: NVIDIA "Xid Errors" deployment documentation, "Analyzing the Xid Catalog" spreadsheet
(factual columns kept in ../shared/reference/nvidia-xid-catalog.tsv). Every Xid in the catalog is
carried over with NVIDIA's immediate and investigatory resolution buckets; we add one column,
``failure_mode``, our vocabulary label for the Xid when it is seen alone on a GPU. Co-occurrence
rules (48 with 63/64, 94 vs 95 on DRAM vs SRAM, 45 following another Xid) live in the detector
rules, not here.

Usage: python scripts/build_xid_table.py [CATALOG_TSV] [OUT_TSV]
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SRC = ROOT.parent / "shared" / "reference" / "nvidia-xid-catalog.tsv"
DEFAULT_OUT = ROOT / "fleethealth" / "data" / "xid_catalog.tsv"

# Xids whose label does not follow from the bucket alone (why: DESIGN.md's vocabulary table).
OVERRIDES: dict[int, str] = {
    79: "gpu_fell_off_bus",
    48: "gpu_dram_uce",
    171: "gpu_dram_uce",  # UNCORRECTABLE_DRAM_ERROR
    172: "gpu_sram_uce",  # UNCORRECTABLE_SRAM_ERROR
    94: "gpu_dram_uce",  # contained ECC error; location refined by counters/message (SRAM -> gpu_sram_uce)
    95: "gpu_dram_uce",  # uncontained ECC error; same refinement
    64: "gpu_row_remap_failure",
    157: "gpu_row_remap_failure",  # RESOURCE_RETIREMENT_FAILURE (Blackwell's 64)
    156: "gpu_row_remap_pending",  # RESOURCE_RETIREMENT_EVENT: needs a GPU reset to take effect
    63: "",  # row-remap / page-retirement event: informational alone, evidence with 48
    92: "gpu_ecc_sbe_storm",
    74: "gpu_nvlink_error",
    136: "gpu_nvlink_error",  # ALI_TRAINING_FAIL: NVLink training
    155: "gpu_nvlink_error",
    166: "gpu_nvlink_error",
    170: "gpu_nvlink_error",
    119: "gpu_gsp_error",
    120: "gpu_gsp_error",
    167: "pcie_fatal",  # PCIE_FATAL_TIMEOUT
    45: "app_error",  # WORKFLOW_XID_45: alone -> restart FM / app; with others, follow the others
    154: "",  # informational, names the recovery action of another Xid
    121: "",  # C2C_ERROR: IGNORE immediate
    162: "", 163: "", 164: "", 165: "",  # power-smoothing (PSHC) state notices
    168: "gpu_hw_error",  # REDUCED_GPU_MEMORY_CAPACITY
    169: "gpu_hw_error",  # SEC2_HALT_ERROR
}

BUCKET_DEFAULT = {
    "RESTART_APP": "app_error",
    "RESTART_VM": "app_error",
    "CHECK_UVM": "app_error",
    "UPDATE_SWFW": "app_error",
    "IGNORE": "",
    "RESET_GPU": "gpu_hw_error",
    "RESTART_BM": "gpu_hw_error",
    "CONTACT_SUPPORT": "gpu_hw_error",
    "CHECK_MECHANICALS": "gpu_hw_error",
    "WORKFLOW_NVLINK_ERR": "gpu_nvlink_error",
    "WORKFLOW_NVLINK5_ERR": "gpu_nvlink_error",
    "XID_154": "",
    "": "gpu_hw_error",
}

COLUMNS = ["xid", "mnemonic", "a100", "h100", "b100", "gb200", "immediate_action",
           "investigatory_action", "failure_mode"]


def build(src: Path, out: Path) -> int:
    with src.open(newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    tmp = out.with_suffix(".tmp")
    with tmp.open("w", newline="") as fh:
        fh.write("# Built by scripts/build_xid_table.py from NVIDIA's Xid catalog (docs.nvidia.com,\n")
        fh.write("# 'Xid Errors' > 'Analyzing the Xid Catalog'). failure_mode is fleethealth's label.\n")
        w = csv.writer(fh, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_NONE, escapechar="\\")
        w.writerow(COLUMNS)
        for r in rows:
            xid = int(r["xid"])
            mode = OVERRIDES.get(xid, BUCKET_DEFAULT.get(r["immediate_action"].strip(), "gpu_hw_error"))
            w.writerow([xid, r["mnemonic"].strip(), r["a100"], r["h100"], r["b100"], r["gb200"],
                        r["immediate_action"].strip(), r["investigatory_action"].strip(), mode])
    tmp.replace(out)
    return len(rows)


if __name__ == "__main__":
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SRC
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_OUT
    print(f"wrote {build(src, out)} Xids to {out}")
