"""Shared pytest setup. Service fixtures (kafka_bootstrap, prometheus_url, slurm_conf, ...) live in
tests/services.py so that this file stays small; add other shared fixtures below."""

import fcntl as _fcntl
import os as _os
import re as _re
import tempfile as _tempfile
from collections.abc import Iterator as _Iterator
from pathlib import Path as _Path

import pytest as _pytest

from tests.services import *  # noqa: F403

# What a clean clone in CI must have: the shared corpus and reference (beside the repo, as CI lays
# them), the shipped datasets and models. A test that skips because one of them is missing would
# silently drop the only checks against real captures, so under CI=true such a skip is a failure.
# So is a missing headless Chromium (scripts/services.sh deps installs it; the report's screenshot
# test needs it).
_MISSING_ARTEFACT = _re.compile(r"shared|corpus|reference|not shipped|no shipped|not built|dataset|model|chromium",
                               _re.I)


@_pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    outcome = yield
    rep = outcome.get_result()
    if _os.environ.get("CI", "").lower() != "true" or not rep.skipped or hasattr(rep, "wasxfail"):
        return  # an expected failure (xfail) is reported as a skip too: it is not a missing artefact
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    if _MISSING_ARTEFACT.search(reason):
        rep.outcome = "failed"
        rep.longrepr = f"CI=true: a required artefact is missing, not skipped: {reason}"


# pytest-xdist: `make test` runs `-n 2 --dist loadfile`, so the tests of one file stay on one worker
# (a module fixture is built once; tests/dashboards/test_queries_against_prometheus.py serves on the
# fixed ports 9403/9404 from one). xdist_group marks cannot be used: pytest-xdist 3.8 adds the group
# to `item._nodeid`, which pytest 9 no longer reads, so --dist loadgroup silently ignores them.
# The Slurm tests are spread over several files and share one cluster: they drain and resume its
# nodes, wait for a cluster with no unavailable node (the drain cap counts every node), run jobs on
# the one real slurmd and skip when it is busy. So each takes a lock for its whole run, fixtures
# included (an autouse fixture is set up before the others of its scope and torn down after them):
# one at a time across workers, and across test runs of other checkouts on this machine.
_SLURM_LOCK = _Path(_tempfile.gettempdir()) / "fleethealth-tests-slurm.lock"


@_pytest.fixture(autouse=True)
def _slurm_one_test_at_a_time(request: _pytest.FixtureRequest) -> _Iterator[None]:
    if request.node.get_closest_marker("slurm") is None and "slurm_conf" not in request.fixturenames:
        yield
        return
    with _SLURM_LOCK.open("a") as fh:
        _fcntl.flock(fh, _fcntl.LOCK_EX)  # released when the file is closed
        yield
