"""Machine-check and EDAC records: kernel ``mce:`` lines, ``EDAC ... MCn:`` lines, ``mcelog`` records,
``ras-mc-ctl --errors`` / ``--error-count`` (pure).

MCA status decoding follows the architectural layout both vendors share (bit 63 VAL, 61 UC, 57 PCC;
bits 15:0 the MCA error code). Intel: a code of the form ``0000 0000 1MMM CCCC`` is a memory-
controller error (channel CCCC); ``0000 01xx xxxx xxxx`` is a CPU-internal error. AMD SMCA: the
IPID's hardware id (bits 43:32) 0x96 is the Unified Memory Controller (UMC), so a bank-17-style
record is a DRAM error only when its IPID or bank name says UMC. A CPU-internal MCE is NOT a DRAM
error and yields a fact with ``memory=False``.
"""

from __future__ import annotations

import re
from typing import Any

from parsers.base import Fact, Parsed, ParseError, new_parsed, to_count

_KMCE = re.compile(r"(?:mce|MCE): \[Hardware Error\]: (?P<body>.*)$")
_KREC = re.compile(r"CPU (?P<cpu>\d+): Machine Check(?: Event)?: \d+ Bank (?P<bank>\d+): (?P<status>[0-9a-f]{16})", re.I)
_IPID = re.compile(r"IPID (?P<ipid>[0-9a-f]+)", re.I)
_EDAC_LINE = re.compile(r"EDAC (?:\w+ )?MC(?P<mc>\d+): (?P<n>\d+) (?P<t>CE|UE) (?P<what>.*?) on (?P<label>\S+)")
_SBRIDGE = re.compile(r"EDAC \w+ MC\d+: CPU (?P<cpu>\d+): Machine Check Event: \d+ Bank (?P<bank>\d+): "
                      r"(?P<status>[0-9a-f]{16})", re.I)


def is_mce_line(msg: str) -> bool:
    return bool(_KMCE.search(msg) or _EDAC_LINE.search(msg) or _SBRIDGE.search(msg))


def decode_status(status: int, ipid: int | None = None, bank_name: str = "") -> dict[str, Any]:
    """Decode an IA32_MCi_STATUS value. ``memory`` is True (DRAM), False (not DRAM) or None (unknown)."""
    uc = bool(status >> 61 & 1)
    pcc = bool(status >> 57 & 1)
    code = status & 0xFFFF
    memory: bool | None = None
    desc = f"MCA code 0x{code:04x}"
    if ipid is not None or "memory controller" in bank_name.lower() or "umc" in bank_name.lower():
        hwid = (ipid >> 32) & 0xFFF if ipid is not None else None
        memory = hwid == 0x96 or "unified memory controller" in bank_name.lower() or "umc" in bank_name.lower()
        desc = "AMD UMC (DRAM) error" if memory else f"AMD bank hwid 0x{hwid or 0:x}"
    elif code & 0xFF80 == 0x0080:
        memory = True
        ch = code & 0xF
        desc = f"memory controller error, channel {'unspecified' if ch == 0xF else ch}"
    elif 0x0400 <= code <= 0x07FF:
        memory = False
        desc = "CPU internal error"
    elif code & 0xFF00 == 0x0100 or code & 0xFFF0 == 0x0010:
        memory = False
        desc = "cache/TLB error"
    return {"corrected": not uc, "uncorrected": uc, "pcc": pcc, "memory": memory, "desc": desc,
            "status": f"0x{status:016x}"}


def decode_kernel_mce(msgs: list[str]) -> list[Fact]:
    """Kernel-log MCE / EDAC messages (prefixes already stripped) -> facts."""
    facts: list[Fact] = []
    pending: Fact | None = None
    for msg in msgs:
        if (m := _EDAC_LINE.search(msg)) is not None:
            n = to_count(m["n"]) or 1
            facts.append(Fact("dram_error", m["label"], {
                "count": n, "uncorrected": m["t"] == "UE", "source": "edac", "mc": int(m["mc"]),
                "what": m["what"]}, msg.strip()))
            continue
        rec = _KREC.search(msg) or _SBRIDGE.search(msg)
        if rec is not None:
            st = int(rec["status"], 16)
            pending = Fact("mce_record", f"CPU {rec['cpu']} bank {rec['bank']}",
                           {"bank": int(rec["bank"]), "status_int": st, "source": "kernel"}, msg.strip())
            pending.attrs.update(decode_status(st))
            facts.append(pending)
            continue
        if pending is not None and (ip := _IPID.search(msg)) is not None:
            pending.attrs.update(decode_status(pending.attrs["status_int"], int(ip["ipid"], 16)))
            pending = None
    for f in facts:
        f.attrs.pop("status_int", None)
    return facts


# ------------------------------------------------------------------------------ mcelog records
_ML_STATUS = re.compile(r"STATUS (?P<status>[0-9a-f]+)", re.I)
_ML_BANK = re.compile(r"CPU (?P<cpu>\d+) BANK (?P<bank>\d+)")
_ML_MCA = re.compile(r"MCA: (?P<mca>.*)$")
_ML_PREFIX = re.compile(r"^.*?mcelog(?:\[\d+\])?: ")


def parse_mcelog(text: str) -> Parsed:
    out = new_parsed("mcelog")
    lines = [_ML_PREFIX.sub("", ln).strip() for ln in text.splitlines()]
    # a record holds one STATUS line; split the capture at the record markers around it
    records: list[list[str]] = [[]]
    for ln in lines:
        if re.match(r"^(?:MCE \d+|Hardware event\.)", ln) and any(_ML_STATUS.search(x) for x in records[-1]):
            records.append([])
        records[-1].append(ln)
    for rec in records:
        status = next((m for ln in rec if (m := _ML_STATUS.search(ln))), None)
        if status is None:
            continue
        bank = next((m for ln in rec if (m := _ML_BANK.search(ln))), None)
        mca = next((m["mca"] for ln in rec if (m := _ML_MCA.search(ln))), "")
        attrs = decode_status(int(status["status"][-16:], 16))
        if "MEMORY CONTROLLER" in mca.upper():
            attrs["memory"] = True
        elif "internal" in mca.lower():
            attrs["memory"] = False
        attrs.update({"mca": mca, "source": "mcelog"})
        comp = f"CPU {bank['cpu']} bank {bank['bank']}" if bank else "cpu"
        out.facts.append(Fact("mce_record", comp, attrs, f"MCA: {mca} STATUS {status['status']}"))
    if not out.facts:
        raise ParseError("mcelog", "no mcelog record with a STATUS line")
    return out


# ----------------------------------------------------------------------------------- ras-mc-ctl
_RAS_BANK = re.compile(r"^(?P<bank>.{0,128}?)(?: \(bank=(?P<n>\d{1,4})\))?$")


def _ras_mce(s: str) -> tuple[str, str | None, int] | None:
    """An MCE event line of ``ras-mc-ctl --errors`` (``N date error: … error…, CPU n, bank NAME
    (bank=17), …, status=0x…``) -> (bank name, bank number, status), by splitting at ``, `` rather
    than one backtracking pattern (security review F13: lines of untrusted artifacts)."""
    if not _RAS_REC.match(s) and not re.match(r"^\d{1,12} ", s):
        return None
    i = s.find("error: ")
    if i < 0:
        return None
    fields = s[i + 7:].split(", ")
    if "error" not in fields[0].lower():
        return None
    bank = next((f[5:] for f in fields[1:] if f.startswith("bank ")), None)
    status = _RAS_STATUS.search(s)
    if bank is None or status is None:
        return None
    b = _RAS_BANK.match(bank.strip())
    return (b["bank"], b["n"], int(status["status"], 16)) if b else (bank[:128], None, int(status["status"], 16))
_RAS_MEM = re.compile(r"^\d{1,12} [^\n]{0,96}? (?P<n>\d{1,12}) (?P<kind>Corrected|Uncorrected) error\(s\): "
                      r"(?P<what>[^\n]{0,512}?) at (?P<label>\S{1,256})",
                      re.I)
_RAS_COUNT = re.compile(r"^(?P<label>\S{1,256}) {0,64}\t(?P<ce>\d{1,20})\t(?P<ue>\d{1,20})\s*$")


_RAS_REC = re.compile(r"^\d{1,12} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} ")
_RAS_STATUS = re.compile(r"\bstatus=(?P<status>0x[0-9a-f]{1,16})", re.I)
_RAS_BANKNUM = re.compile(r"\bbank=(?P<n>0x[0-9a-f]{1,8}|\d{1,4})\b", re.I)
_RAS_SUMMARY = re.compile(r"^\s*(?P<kind>Corrected|Uncorrected) on DIMM Label\(s\): '(?P<label>[^']{0,256})'"
                          r"(?: location: (?P<loc>\S{1,64}))? errors: (?P<n>\d{1,12})", re.I)
_RAS_MCE_SUMMARY = re.compile(r"^\s*(?P<n>\d{1,12}) (?P<what>.{1,200}?) errors?\s*$")


def _join_records(lines: list[str]) -> list[str]:
    """``ras-mc-ctl --errors`` wraps a long record over several lines (a terminal, a pasted ticket):
    a line that does not start a record (``N YYYY-MM-DD hh:mm:ss +zzzz``) continues the one before."""
    out: list[str] = []
    in_rec = False
    for line in lines:
        if _RAS_REC.match(line):
            out.append(line.rstrip())
            in_rec = True
        elif in_rec and line.strip() and not line.strip().endswith(":") and not line.startswith("No "):
            out[-1] = f"{out[-1]} {line.strip()}"[:8192]
        else:
            out.append(line)
            in_rec = False
    return out


def parse_ras_mc_ctl(text: str) -> Parsed:
    """``ras-mc-ctl --errors`` (memory-controller and MCE event lists, wrapped records joined),
    ``--error-count`` and ``--summary``."""
    out = new_parsed("ras-mc-ctl")
    count_table = False
    section = ""
    for line in _join_records(text.splitlines()):
        st = line.strip()
        if st.endswith(":") and not st.startswith(("Label", "Transaction")):
            section = st.lower()
        if (m := _RAS_SUMMARY.match(line)) is not None:
            n = int(m["n"])
            unc = m["kind"].lower() == "uncorrected"
            out.facts.append(Fact("dimm_counts", m["label"] or m["loc"] or "dimm",
                                  {"ce": 0 if unc else n, "ue": n if unc else 0, "source": "ras-mc-ctl --summary"}, st))
            continue
        if "summary" in section and "mce" in section and (m := _RAS_MCE_SUMMARY.match(line)) is not None:
            out.facts.append(Fact("mce_summary", "host", {"count": int(m["n"]), "what": m["what"]}, st))
            continue
        s = line.strip()
        if s.startswith("Label") and "CE" in s and "UE" in s:
            count_table = True
            continue
        if count_table and (m := _RAS_COUNT.match(line.strip("\n"))) is not None:
            ce, ue = int(m["ce"]), int(m["ue"])
            if ce or ue:
                out.facts.append(Fact("dimm_counts", m["label"], {"ce": ce, "ue": ue}, s))
            continue
        if (m := _RAS_MEM.match(s)) is not None:
            out.facts.append(Fact("dram_error", m["label"], {
                "count": int(m["n"]), "uncorrected": m["kind"].lower() == "uncorrected", "source": "ras-mc-ctl",
                "what": m["what"]}, s))
            continue
        if (rec := _ras_mce(s)) is not None:
            bank_name, bank_n, status = rec
            attrs = decode_status(status, bank_name=bank_name)
            attrs["source"] = "ras-mc-ctl"
            attrs["record_id"] = int(s.split(" ", 1)[0])  # ras-mc-ctl's event number: how many it has stored
            out.facts.append(Fact("mce_record", f"bank {bank_n or bank_name}", attrs, s))
        elif _RAS_REC.match(s) and (st2 := _RAS_STATUS.search(s)) is not None:
            # Intel records name the bank only as "bank=0x0000000d": the MCA error code in the status decides
            bank = _RAS_BANKNUM.search(s)
            attrs = decode_status(int(st2["status"], 16))
            attrs["source"] = "ras-mc-ctl"
            attrs["record_id"] = int(s.split(" ", 1)[0])
            comp = f"bank {int(bank['n'], 0)}" if bank else "bank"
            out.facts.append(Fact("mce_record", comp, attrs, s[:1024]))
    if not count_table and not out.facts and "ras-mc-ctl" not in text and not re.search(r"^(No |MCE events:|Memory controller events)",
                                                                    text, re.M):
        raise ParseError("ras-mc-ctl", "neither an error-count table nor ras-mc-ctl event sections")
    return out
