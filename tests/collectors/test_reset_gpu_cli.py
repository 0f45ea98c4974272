"""``fleethealth reset-gpu`` on a GPU host: the reset command runs only while the (real, running)
collector has let go of NVML, the pause file is gone afterwards and the collector takes NVML back;
a GPU id that could smuggle an option or a shell word is refused before anything is paused."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from collectors.daemon import Collector, CollectorSettings
from fleetcli.cli import main
from fleethealth.nvml_pause import released_marker
from simulator.nvml import SimNvml


class _Null:
    def send_batch(self, records):
        return len(records)

    def close(self):
        pass


def test_reset_gpu_runs_the_reset_while_nvml_is_released(tmp_path: Path, capsys) -> None:
    sim = SimNvml(2)
    kmsg = tmp_path / "kern.log"
    kmsg.write_text("")
    state = tmp_path / "st"
    c = Collector(CollectorSettings(host="n1", sysfs_root=str(tmp_path / "nosys"), proc_root=str(tmp_path / "p"),
                                    kmsg_path=str(kmsg), state_dir=str(state), fsync=False), sink=_Null(), nvml=sim)
    c.poll_once()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            c.poll_once()
            stop.wait(0.05)
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    seen = tmp_path / "seen.txt"
    script = tmp_path / "fake-nvidia-smi"
    pause = state / "nvml.pause"
    script.write_text(f"#!{sys.executable}\nimport os, sys\nopen({str(seen)!r}, 'w').write("
                      f"' '.join(sys.argv[1:]) + ' released=%s' % os.path.exists({str(released_marker(pause))!r}))\n")
    script.chmod(0o755)
    try:
        rc = main(["reset-gpu", "GPU-5d3c2a1e-0000-4c2a-9b1e-000000000001", "--state-dir", str(state), "--wait", "10",
                   "--reset-command", f"{script} -r -i {{gpu}}"])
        out = capsys.readouterr().out
        assert rc == 0, out
        assert seen.read_text() == "-r -i GPU-5d3c2a1e-0000-4c2a-9b1e-000000000001 released=True"
        assert not pause.exists() and "NVML released around it" in out
        for _ in range(100):
            if sim._inited == 1:
                break
            stop.wait(0.05)
        assert sim._inited == 1
    finally:
        stop.set()
        t.join(5)
        c.close(flush_timeout=0.1)


def test_reset_gpu_refuses_a_gpu_id_that_is_not_one(tmp_path: Path, capsys) -> None:
    for bad in ("-r", "0; reboot", "all", "GPU-x y"):
        assert main(["reset-gpu", "--state-dir", str(tmp_path), "--reset-command", "true {gpu}", "--", bad]) == 2
    assert not (tmp_path / "nvml.pause").exists()


def test_reset_gpu_without_a_collector_answering_resets_nothing(tmp_path: Path, capsys) -> None:
    rc = main(["reset-gpu", "0", "--state-dir", str(tmp_path), "--wait", "0.3", "--reset-command", "false"])
    assert rc == 1 and "did not release NVML" in capsys.readouterr().out
    assert not (tmp_path / "nvml.pause").exists()
