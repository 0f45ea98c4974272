"""A requested GPU reset holds NVML released around the operator's reset hook: the worker writes the
collector's pause file itself, calls the hook only once the (real) collector confirmed it let go,
and removes the file afterwards -- and refuses, without calling the hook, when another reset holds
the pause or no collector confirms the release. Real collector on the simulated driver, real
subprocess hook, real SQLite."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from collectors.daemon import Collector, CollectorSettings
from fleethealth.nvml_pause import released_marker
from remediation.settings import AllSettings, HookSettings, RemediationSettings
from simulator.nvml import SimNvml
from tests.remediation.helpers import incident, make_worker


class _NullSink:
    def send_batch(self, records):
        return len(records)

    def close(self):
        pass


def _hook(tmp: Path, pause: Path) -> tuple[Path, Path]:
    """A reset hook that records what it saw: was NVML released when it ran?"""
    seen = tmp / "seen.txt"
    script = tmp / "request-reset"
    script.write_text(f"#!{sys.executable}\nimport os, sys\n"
                      f"open({str(seen)!r}, 'a').write(' '.join(sys.argv[1:]) + ' pause=%s released=%s\\n' % ("
                      f"os.path.exists({str(pause)!r}), os.path.exists({str(pause) + '.released'!r})))\n")
    script.chmod(0o755)
    return script, seen


def _worker(tmp: Path, script: Path, pause: Path, wait_s: float = 10.0):
    hooks = HookSettings(reset_gpu=[str(script), "{host}", "{component}"], nvml_pause_file=str(pause),
                         nvml_release_wait_s=wait_s)
    return make_worker(tmp, AllSettings(remediation=RemediationSettings(hooks=hooks)))


def _fields(inc):
    return {"host": inc.host, "component": inc.component, "incident": inc.id, "failure_mode": inc.failure_mode,
            "node": inc.host, "reason": "test"}


def test_the_reset_hook_runs_while_the_collector_has_let_go_and_nvml_resumes_after(tmp_path: Path) -> None:
    sim = SimNvml(2)
    kmsg = tmp_path / "kern.log"
    kmsg.write_text("")
    c = Collector(CollectorSettings(host="n1", sysfs_root=str(tmp_path / "nosys"), proc_root=str(tmp_path / "noproc"),
                                    kmsg_path=str(kmsg), state_dir=str(tmp_path / "st"), fsync=False),
                  sink=_NullSink(), nvml=sim)
    pause = Path(c.s.nvml_pause_file)
    c.poll_once()
    assert sim._inited == 1
    stop = threading.Event()

    def collector_loop() -> None:
        while not stop.is_set():
            c.poll_once()
            stop.wait(0.05)
    t = threading.Thread(target=collector_loop, daemon=True)
    t.start()
    try:
        script, seen = _hook(tmp_path, pause)
        w = _worker(tmp_path, script, pause)
        inc = incident(mode="gpu_dram_uce")
        res = w._call_reset_hook(inc, _fields(inc))
        assert res.ok, res.detail
        assert seen.read_text() == f"{inc.host} {inc.component} pause=True released=True\n"
        assert not pause.exists() and "NVML released" in res.detail
        for _ in range(100):  # the collector takes NVML back at its next poll
            if sim._inited == 1 and not released_marker(pause).exists():
                break
            stop.wait(0.05)
        assert sim._inited == 1 and not released_marker(pause).exists()
    finally:
        stop.set()
        t.join(5)
        c.close(flush_timeout=0.1)


def test_no_confirmed_release_means_no_reset_and_the_pause_is_removed(tmp_path: Path) -> None:
    pause = tmp_path / "nvml.pause"  # no collector answers on this host
    script, seen = _hook(tmp_path, pause)
    w = _worker(tmp_path, script, pause, wait_s=0.3)
    inc = incident(mode="gpu_dram_uce")
    res = w._call_reset_hook(inc, _fields(inc))
    assert not res.ok and "did not release NVML" in res.detail
    assert not seen.exists() and not pause.exists()


def test_a_second_reset_while_one_holds_the_pause_is_refused_and_the_file_left_alone(tmp_path: Path) -> None:
    pause = tmp_path / "nvml.pause"
    pause.write_text("operator 4242 abc\n")
    released_marker(pause).touch()
    script, seen = _hook(tmp_path, pause)
    w = _worker(tmp_path, script, pause)
    inc = incident(mode="gpu_dram_uce")
    res = w._call_reset_hook(inc, _fields(inc))
    assert not res.ok and "another GPU reset" in res.detail and "operator 4242" in res.detail
    assert not seen.exists() and pause.read_text() == "operator 4242 abc\n"
