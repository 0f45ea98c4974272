"""One rule set, two ways in: every test fixture and every labelled shared-corpus capture that the
collector can read (as ``--kmsg-file`` or ``--sysfs-root``) goes once through ``diagnose`` and once
through the real collector into the streaming engine; both must name the same failure modes,
except the documented exceptions in ``diagnose_vs_stream.yaml`` (each with its reason)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from detectors.engine.ruleset import RuleSet
from tests.diagnose.streampath import captures, diagnose_modes, stream_kind, stream_modes

HERE = Path(__file__).resolve().parent
EXCEPTIONS = yaml.safe_load((HERE / "diagnose_vs_stream.yaml").read_text())["exceptions"]


def test_diagnose_and_stream_name_the_same_failure_modes() -> None:
    rules = RuleSet.load()
    agree, differ, seen = 0, [], set()
    readable = 0
    for name, path in captures():
        kind = stream_kind(path)
        if kind is None:
            continue
        readable += 1
        d, s = diagnose_modes(path), stream_modes(path, kind, rules)
        exc = EXCEPTIONS.get(name)
        if exc is not None:
            seen.add(name)
            if d == s:
                differ.append(f"{name}: listed as an exception but both now say {sorted(d)}: remove it")
            elif d - s != set(exc.get("diagnose_only", [])) or s - d != set(exc.get("stream_only", [])):
                differ.append(f"{name} [{kind}]: diagnose {sorted(d)} stream {sorted(s)} (exception says "
                              f"diagnose_only {exc.get('diagnose_only')}, stream_only {exc.get('stream_only')})")
            continue
        if d == s:
            agree += 1
        else:
            differ.append(f"{name} [{kind}]: diagnose {sorted(d)} stream {sorted(s)}")
    print(f"diagnose vs stream: {agree} of {readable} captures agree, {len(seen)} documented exceptions")
    assert readable >= 20, "the fixtures / corpus the collector reads are missing"
    assert not differ, "\n".join(differ)
    assert all(e.get("reason") for e in EXCEPTIONS.values())


@pytest.mark.parametrize("name", sorted(EXCEPTIONS))
def test_exceptions_name_captures_that_exist(name: str) -> None:
    if name.startswith("corpus/") and not any(n == name for n, _ in captures()):
        pytest.skip("shared corpus not present")
    assert any(n == name for n, _ in captures()), f"{name}: no such capture"
