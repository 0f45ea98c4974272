"""What ``nvidia-smi -q``'s text report and its XML form (``-q -x``) share: the same fields under two
spellings, read the same way (pure). :mod:`parsers.nvsmi_text` and :mod:`parsers.nvsmi_xml` find the
values; this module turns them into contract values, so the two readings cannot drift apart."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from fleethealth.schema import EccCounters, GpuSample
from parsers.base import GpuInfo, Parsed, new_parsed, to_count, yes_no

T = TypeVar("T")


def report(fmt: str, blocks: Sequence[T], attached: str | None, driver: str | None,
           gpu: Callable[[int, T, list[str]], tuple[GpuSample, GpuInfo]], mismatch: str) -> Parsed:
    """The parsed report: one GPU per block (``gpu(index, block, warnings)``), the driver version, and
    the expected GPU count from the attached-GPU header (``mismatch``, formatted with ``attached`` and
    ``n``, warns when the header and the blocks disagree: captures get trimmed)."""
    out = new_parsed(fmt)
    n_attached = to_count(attached)
    if n_attached is not None and n_attached != len(blocks):
        out.warnings.append(mismatch.format(attached=n_attached, n=len(blocks)))
    if driver:
        out.sample.driver_version = driver[:256]
    for index, block in enumerate(blocks):
        g, info = gpu(index, block, out.warnings)
        out.sample.gpus.append(g)
        out.gpu_info[index] = info
    out.sample.expected_gpus = min(n_attached, 64) if n_attached is not None else len(blocks)
    return out


def sum_present(*vals: int | None) -> int | None:
    """The sum of the counters that are there; None when none is."""
    present = [v for v in vals if v is not None]
    return sum(present) if present else None


def old_layout(dram: int | None, total: int | None, parts: Sequence[int | None] = ()) -> tuple[int | None, int | None]:
    """Pre-Ampere ECC: Device Memory is DRAM; Total minus Device Memory is on-chip SRAM (without a
    Total: the on-chip parts listed, summed)."""
    if total is None:
        return dram, sum_present(*parts)
    return dram, max(total - (dram or 0), 0)


def set_scope(ecc: EccCounters, scope: str, dram_c: int | None, dram_u: int | None, sram_c: int | None,
              sram_u: int | None) -> None:
    """The four counters of one scope (``volatile`` or ``aggregate``)."""
    setattr(ecc, f"dram_corrected_{scope}", dram_c)
    setattr(ecc, f"dram_uncorrected_{scope}", dram_u)
    setattr(ecc, f"sram_corrected_{scope}", sram_c)
    setattr(ecc, f"sram_uncorrected_{scope}", sram_u)


def retirement_pending(blacklist: str | None, retirement: str | None) -> bool | None:
    """Pages waiting to be retired: the older "Pending Page Blacklist" or the newer "... Retirement"."""
    pending = yes_no(blacklist)
    return yes_no(retirement) if pending is None else pending
