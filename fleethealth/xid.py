"""NVIDIA's Xid catalog as data: loaded from ``fleethealth/data/xid_catalog.tsv`` and validated.

The table is built by ``scripts/build_xid_table.py`` from NVIDIA's published Xid catalog ("Xid
Errors" deployment guide, "Analyzing the Xid Catalog"); it keeps NVIDIA's resolution buckets and
adds fleethealth's failure-mode label for a Xid seen alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from fleethealth import taxonomy
from fleethealth.datacache import cached
from fleethealth.taxonomy import ALL_LABELS

CATALOG = Path(__file__).parent / "data" / "xid_catalog.tsv"

KNOWN_IMMEDIATE = frozenset({
    "", "RESTART_APP", "RESET_GPU", "RESTART_BM", "RESTART_VM", "IGNORE", "CONTACT_SUPPORT",
    "CHECK_MECHANICALS", "CHECK_UVM", "UPDATE_SWFW", "WORKFLOW_XID_48", "WORKFLOW_XID_45",
    "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR", "XID_154",
})
COLUMNS = ("xid", "mnemonic", "a100", "h100", "b100", "gb200", "immediate_action",
           "investigatory_action", "failure_mode")


class XidTableError(ValueError):
    """The Xid table file is malformed; the message names file and line."""


@dataclass(frozen=True, slots=True)
class XidInfo:
    xid: int
    mnemonic: str
    applies_to: tuple[str, ...]  # GPU generations NVIDIA marks YES
    immediate: str  # NVIDIA's immediate resolution bucket
    investigatory: str
    failure_mode: str  # fleethealth label when seen alone; "" = informational

    @property
    def bucket(self) -> str:
        return self.immediate or "UNSPECIFIED"


def load_xid_table(path: Path | None = None) -> dict[int, XidInfo]:
    """Read and validate the Xid table; raise XidTableError naming file and line on any fault."""
    import csv

    if path is None:
        text = CATALOG.read_text()
        name = "fleethealth/data/xid_catalog.tsv"
    else:
        text, name = path.read_text(), str(path)
    table: dict[int, XidInfo] = {}
    header_seen = False
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cells = next(csv.reader([line], delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\"))
        if not header_seen:
            if tuple(cells) != COLUMNS:
                raise XidTableError(f"{name}:{lineno}: header must be the columns {', '.join(COLUMNS)}")
            header_seen = True
            continue
        if len(cells) != len(COLUMNS):
            raise XidTableError(f"{name}:{lineno}: expected {len(COLUMNS)} columns, got {len(cells)}")
        row = dict(zip(COLUMNS, cells, strict=True))
        try:
            xid = int(row["xid"])
        except ValueError:
            raise XidTableError(f"{name}:{lineno}: xid {row['xid']!r} is not an integer") from None
        if xid in table:
            raise XidTableError(f"{name}:{lineno}: Xid {xid} listed twice")
        if row["immediate_action"] not in KNOWN_IMMEDIATE:
            raise XidTableError(f"{name}:{lineno}: unknown NVIDIA bucket {row['immediate_action']!r}")
        if row["failure_mode"] and row["failure_mode"] not in ALL_LABELS:
            raise XidTableError(f"{name}:{lineno}: failure_mode {row['failure_mode']!r} is not in the vocabulary")
        gens = tuple(g for g in ("a100", "h100", "b100", "gb200") if row[g].upper() == "YES")
        table[xid] = XidInfo(xid, row["mnemonic"], gens, row["immediate_action"],
                             row["investigatory_action"], row["failure_mode"])
    if not table:
        raise XidTableError(f"{name}: no Xids")
    return table


@cache
def xid_table() -> dict[int, XidInfo]:
    """The shipped table, loaded once per process (parsed once per change: fleethealth.datacache)."""
    return cached("xid-table", [CATALOG, Path(__file__), Path(taxonomy.__file__)], load_xid_table)


def lookup(xid: int) -> XidInfo | None:
    return xid_table().get(xid)
