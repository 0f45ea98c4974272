"""Drill: property-based fuzzing of every artifact parser of ``fleethealth diagnose``, end to end.

tests/parsers fuzzes each parser with generic text; this drill mutates *real-shaped* inputs (the
fixture captures of every format, so the parsers get past their headers into the deep paths) and
also runs the diagnose rules on whatever parses, and covers the sysfs-snapshot parser (a folder:
a dict of file texts), which the text fuzz does not reach. Property: a parser returns a value or
raises ParseError; the rules never raise on a parsed value.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detectors.diagnose.doctor import evaluate
from parsers import PARSERS, parse_captures, parse_text
from parsers.base import ParseError
from parsers.detect import detect_format
from parsers.sysfs_snapshot import parse_files, read_tree

pytestmark = pytest.mark.drill
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "parsers"
FILES = sorted(p for p in FIXTURES.iterdir() if p.is_file())
TREES = sorted(p for p in FIXTURES.iterdir() if p.is_dir())
CORPUS = Path(__file__).resolve().parents[2] / ".." / "shared" / "corpus"
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NUMBER = re.compile(r"\d+(\.\d+)?")
ODD_NUMBERS = ["18446744073709551615", "18446744073709551616", "-1", "99999999999999999999999999", "nan", "inf",
               "1e999", "0x", "", "N/A", "[Not Supported]", "0" * 400]


def _fmt(path: Path) -> str:
    """The format of a capture: from its content, else (a grep'd fragment under its command line)
    the format diagnose's entry gives its first part that a parser claims."""
    text = path.read_text(errors="replace")
    try:
        return detect_format(text, str(path))
    except ParseError:
        found = [p.format for p in parse_captures(text) if not p.format.endswith("(fallback)")]
        if not found:
            raise
        return found[0]


def _corpus_seeds() -> list[Path]:
    """One real capture per format the fixtures lack, from ../shared/corpus (read, never copied)."""
    if not CORPUS.is_dir():
        return []
    have = {_fmt(p) for p in FILES}
    out: dict[str, Path] = {}
    for p in sorted(CORPUS.rglob("*")):
        if not p.is_file() or p.name in ("MANIFEST.tsv", "README.md") or p.stat().st_size > 512 << 10:
            continue
        try:
            fmt = _fmt(p)
        except (ParseError, UnicodeError, OSError):
            continue
        if fmt not in have and fmt not in out:
            out[fmt] = p
    return list(out.values())


SEEDS = _corpus_seeds()


@st.composite
def mutated(draw: st.DrawFn, text: str) -> str:
    lines = text.splitlines(keepends=True)
    for _ in range(draw(st.integers(0, 6))):
        if not lines:
            break
        op = draw(st.sampled_from(["drop", "dup", "numbers", "truncate", "junk", "swap"]))
        i = draw(st.integers(0, len(lines) - 1))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "numbers":
            odd = draw(st.sampled_from(ODD_NUMBERS))
            lines[i] = NUMBER.sub(odd, lines[i])
        elif op == "truncate":
            cut = draw(st.integers(0, len(lines[i])))
            lines = lines[:i] + [lines[i][:cut]]
        elif op == "junk":
            lines.insert(i, draw(st.text(max_size=60)) + "\n")
        else:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
    return "".join(lines)


def test_fixtures_cover_every_parser() -> None:
    covered = {_fmt(p) for p in FILES + SEEDS}
    missing = sorted(set(PARSERS) - covered)
    if not SEEDS:
        pytest.skip(f"../shared/corpus absent: formats {missing} get only tests/parsers' generic text fuzz")
    # a format with neither a fixture nor a corpus capture still gets tests/parsers' generic fuzz
    print(f"structured fuzz seeds for {len(covered)} of {len(PARSERS)} formats; generic fuzz only: {missing}")
    assert len(covered) >= len(PARSERS) - 4, missing


@pytest.mark.parametrize("path", FILES + SEEDS, ids=lambda p: p.name)
@FUZZ
@given(data=st.data())
def test_mutated_capture_parses_or_parse_error_and_rules_never_raise(path: Path, data: st.DataObject) -> None:
    text = data.draw(mutated(path.read_text(errors="replace")))
    fmt = _fmt(path)
    for part in parse_captures(text):  # diagnose's entry never raises: it splits, falls back, bounds lines
        evaluate(part, host="fuzz")
    try:
        parsed = parse_text(text, fmt)
    except ParseError as exc:
        assert str(exc)
        return
    evaluate(parsed, host="fuzz")  # the diagnose rules take any parsed value


@pytest.mark.parametrize("tree", TREES, ids=lambda p: p.name)
@FUZZ
@given(data=st.data())
def test_mutated_sysfs_snapshot(tree: Path, data: st.DataObject) -> None:
    files = dict(read_tree(tree))
    keys = sorted(files)
    for _ in range(data.draw(st.integers(1, 8))):
        k = data.draw(st.sampled_from(keys))
        op = data.draw(st.sampled_from(["drop", "odd", "text", "newpath"]))
        if op == "drop":
            files.pop(k, None)
        elif op == "odd":
            files[k] = data.draw(st.sampled_from(ODD_NUMBERS)) + data.draw(st.sampled_from(["", "\n", " x\n"]))
        elif op == "text":
            files[k] = data.draw(st.text(max_size=80))
        else:  # an unexpected file beside the known ones
            files[k.rsplit("/", 1)[0] + "/" + data.draw(st.text("abc_/.", min_size=1, max_size=12))] = "1\n"
    try:
        parsed = parse_files(files)
    except ParseError as exc:
        assert str(exc)
        return
    evaluate(parsed, host="fuzz")
