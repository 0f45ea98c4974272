"""fleethealth.datacache: a parsed data file is reused only while its sources are unchanged, and the
cache never changes a result (off, damaged, foreign or unwritable: the value is built again)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleethealth.datacache import cached
from fleethealth.lazyregex import lazy

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "parsers" / "dmesg-T-xid79-aer.log"


class Builds:
    def __init__(self, path: Path) -> None:
        self.path, self.calls = path, 0

    def __call__(self) -> dict[str, str]:
        self.calls += 1
        return {"text": self.path.read_text()}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("FLEETHEALTH_CACHE_DIR", str(d))
    return d


def test_reused_until_a_source_changes_even_at_the_same_size_and_mtime(tmp_path: Path, cache: Path) -> None:
    src = tmp_path / "widths.yaml"
    src.write_text("a: 1\n")
    b = Builds(src)
    assert cached("t", [src], b) == {"text": "a: 1\n"} and b.calls == 1
    assert cached("t", [src], b) == {"text": "a: 1\n"} and b.calls == 1  # from the cache
    st = src.stat()
    src.write_text("a: 2\n")  # same size; mtime put back: the CRC still sees it
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cached("t", [src], b) == {"text": "a: 2\n"} and b.calls == 2
    assert [p.name for p in cache.iterdir()] == [next(cache.iterdir()).name]  # one file, replaced


def test_off_damaged_foreign_and_unwritable_caches_build_afresh(tmp_path: Path, cache: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "f.txt"
    src.write_text("x")
    b = Builds(src)
    cached("t", [src], b)
    (f,) = cache.iterdir()
    f.write_bytes(b"not a pickle")
    assert cached("t", [src], b) == {"text": "x"} and b.calls == 2
    f.chmod(0o666)  # writable by others: not read
    assert cached("t", [src], b) == {"text": "x"} and b.calls == 3
    monkeypatch.setenv("FLEETHEALTH_CACHE_DIR", "off")
    assert cached("t", [src], b) == {"text": "x"} and b.calls == 4
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder would go")
    monkeypatch.setenv("FLEETHEALTH_CACHE_DIR", str(blocked / "sub"))
    assert cached("t", [src], b) == {"text": "x"} and b.calls == 5


def test_a_failed_build_is_not_stored(tmp_path: Path, cache: Path) -> None:
    src = tmp_path / "f.txt"
    src.write_text("x")

    def bad() -> None:
        raise ValueError("f.txt:1: broken")

    with pytest.raises(ValueError, match="broken"):
        cached("t", [src], bad)
    assert not cache.exists() or list(cache.iterdir()) == []
    with pytest.raises(OSError):  # a source that is gone: build reports it, as without a cache
        cached("t", [tmp_path / "gone"], lambda: (tmp_path / "gone").read_text())


def test_rule_files_edited_after_caching_are_read_again(tmp_path: Path, cache: Path) -> None:
    from detectors.engine.rulefile import RuleError, load_rule_files

    rule = tmp_path / "r.yaml"
    body = ("rules:\n  - id: t.kern\n    kind: kernel_event\n    failure_mode: gpu_hw_error\n"
            "    evidence: '{line}'\n    match: 'GPU has fallen'\n")
    rule.write_text(body)
    first = load_rule_files([rule])
    assert load_rule_files([rule]) == first and first[0].params["match"] == "GPU has fallen"
    rule.write_text(body.replace("'GPU has fallen'", "'GPU (has'"))
    with pytest.raises(RuleError, match=rf"{re.escape(str(rule))}:6: rule 't.kern': bad regex"):
        load_rule_files([rule])


def test_lazy_patterns_match_like_compiled_ones() -> None:
    text = "NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\nsecond line 79"
    for pattern, flags in ((r"Xid \(PCI:(?P<pci>[0-9a-f:]+)\): (?P<xid>\d+)", 0), (r"^second", re.M),
                           (r"gpu HAS", re.I)):
        lz, rx = lazy(pattern, flags), re.compile(pattern, flags)
        assert lz._rx is None  # nothing compiled until used
        for fn in ("match", "search", "fullmatch"):
            a, b = getattr(lz, fn)(text), getattr(rx, fn)(text)
            assert (a and a.group(0)) == (b and b.group(0))
        assert [m.span() for m in lz.finditer(text)] == [m.span() for m in rx.finditer(text)]
        assert lz.findall(text) == rx.findall(text) and lz.split(text) == rx.split(text)
        assert lz.sub("#", text) == rx.sub("#", text) and lz.groupindex == rx.groupindex


def test_diagnose_with_a_warm_cache_imports_no_yaml(tmp_path: Path) -> None:
    """The rule files, counter widths, precedence and Xid table come from the cache: no PyYAML."""
    env = dict(os.environ, FLEETHEALTH_CACHE_DIR=str(tmp_path / "cache"))
    probe = ("import sys\nfrom fleetcli.cli import main\nrc = main(sys.argv[1:])\n"
             "print('RC', rc, 'YAML', sorted(m for m in sys.modules if m.split('.')[0] == 'yaml')[:1])")
    runs = [subprocess.run([sys.executable, "-c", probe, "diagnose", "--json", str(FIXTURE)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120) for _ in range(2)]
    cold, warm = (r.stdout.splitlines()[-1] for r in runs)
    assert cold == "RC 1 YAML ['yaml']", runs[0].stdout[-500:] + runs[0].stderr
    assert warm == "RC 1 YAML []", runs[1].stdout[-500:] + runs[1].stderr
    findings = [r.stdout.splitlines()[:-1] for r in runs]
    assert findings[0] and findings[0] == findings[1]  # the same findings from a cold and a warm start


def test_a_module_level_lazy_pattern_becomes_the_compiled_one_on_first_use() -> None:
    ns: dict[str, object] = {"lazy": lazy}
    exec("X = lazy(r'a(b)')\nfound = lambda s: X.search(s)", ns)  # noqa: S102 - a module body, literally
    assert not isinstance(ns["X"], re.Pattern)
    assert ns["found"]("xab").group(1) == "b"  # type: ignore[operator]
    assert isinstance(ns["X"], re.Pattern) and ns["X"].pattern == "a(b)"  # type: ignore[union-attr]
