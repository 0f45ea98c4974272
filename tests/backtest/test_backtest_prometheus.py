"""Backtest on a REAL Prometheus: a private instance scrapes a local exporter that serves
dcgm-exporter and node_exporter text (tests/backtest/fixture_exporter.py) with four faults that
appear part-way; ``fleethealth import prometheus`` reads the history back, the detectors raise the
right incidents at the right times, and the same exporter scraped by ``fleethealth collect
--source dcgm-exporter=... --source node-exporter=...`` gives the same incidents.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from typing import Any

import pytest

from detectors.scoring.backtest import backtest
from fleetcli.cli import main as cli_main
from fleetcli.commands.prom_import import ImportSpec, PromClient, run_import
from fleethealth.errors import UserError
from fleethealth.schema import decode_sample
from tests.backtest.fixture_exporter import FAULTS, FAULTY, HOSTS, FixtureExporter, uuid
from tests.backtest.private_prometheus import BINARY, PrivatePrometheus, free_port
from tests.services import require_services

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
RUN_S = 32  # seconds of fleet history
LEAD_S = 3.0  # the faults' clock starts this long after every collector has scraped once

EXPECTED = {  # (component, failure mode) on FAULTY -> the fault it comes from
    (uuid(FAULTY, 2), "gpu_dram_uce"): "gpu_dram_uce",
    (uuid(FAULTY, 1), "gpu_row_remap_pending"): "gpu_row_remap_pending",
    (uuid(FAULTY, 3), "gpu_fell_off_bus"): "xid",
    ("mlx5_1/1", "net_link_bad_cable"): "net_link_bad_cable",
}


def _collector(host: str, ex: FixtureExporter, tmp: Path) -> subprocess.Popen[bytes]:
    (tmp / "sys").mkdir(exist_ok=True)
    (tmp / "proc").mkdir(exist_ok=True)
    (tmp / "kmsg.log").touch()
    cmd = [sys.executable, "-m", "fleetcli.cli", "--log-level", "warning", "collect",
           "--source", f"dcgm-exporter={ex.url(host, 'dcgm')}", "--source", f"node-exporter={ex.url(host, 'node')}",
           "--host", host, "--interval", "1",
           "--sink", f"jsonl:{tmp / f'collect-{host}.jsonl'}", "--state-dir", str(tmp / f"state-{host}"),
           "--sysfs-root", str(tmp / "sys"), "--proc-root", str(tmp / "proc"), "--kmsg-file", str(tmp / "kmsg.log"),
           "--exporter-port", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHEALTH_")}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not Path(BINARY).exists():
        msg = f"{BINARY} is not installed (scripts/services.sh deps)"
        if require_services():
            pytest.fail(msg)
        pytest.skip(msg)
    tmp = tmp_path_factory.mktemp("backtest")
    ex = FixtureExporter(t0=time.time() + 1e6)  # no fault until the clock is started below
    targets = [(f"{kind}-{h}", f"127.0.0.1:{ex.port}", f"/{h}/{kind}", f"{h}:{9400 if kind == 'dcgm' else 9100}")
               for h in HOSTS for kind in ("dcgm", "node")]
    prom = PrivatePrometheus(tmp / "prom", targets)
    procs = {h: _collector(h, ex, tmp) for h in HOSTS}
    try:
        deadline = time.monotonic() + 180  # the CLI's start-up on a busy 2-core machine
        while set(ex.agent_hits) != set(HOSTS):
            assert time.monotonic() < deadline, "the collectors never scraped the exporter"
            assert all(p.poll() is None for p in procs.values()), "a collector exited early"
            time.sleep(0.2)
        ex.t0 = time.time() + LEAD_S
        time.sleep(LEAD_S + RUN_S + 1)
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for h, p in procs.items():
            out, _ = p.communicate(timeout=60)
            assert p.returncode == 0, f"collect {h} exited {p.returncode}: {out.decode()[-2000:]}"
        time.sleep(1.5)  # the last scrape lands
        assert prom.up_targets() == len(targets)
        out = tmp / "history.jsonl.gz"
        spec = ImportSpec(url=prom.url, start=ex.t0 - 2, end=ex.t0 + RUN_S, step=1.0, max_points=1_000)
        st = run_import(spec, out, PromClient(prom.url))
        collected = tmp / "collected.jsonl"
        lines = []
        for h in HOSTS:
            lines += (tmp / f"collect-{h}.jsonl").read_text().splitlines()
        collected.write_text("\n".join(sorted(lines, key=lambda s: json.loads(s)["ts"])) + "\n")
        yield {"t0": ex.t0, "prom": prom, "ex": ex, "tmp": tmp, "out": out, "stats": st, "spec": spec,
               "collected": collected}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        prom.stop()
        ex.close()


def _found(eps: list[Any]) -> dict[tuple[str, str, str], Any]:
    return {(e.host, e.component, e.failure_mode): e for e in eps}


def test_import_then_replay_raises_the_faults_at_their_times(scenario: dict[str, Any]) -> None:
    st, t0 = scenario["stats"], scenario["t0"]
    assert st.hosts == 2 and st.samples >= 2 * (RUN_S - 2) and st.points > 0
    assert st.peak_chunk_points <= 1_000 and st.chunks > 3  # bounded chunks
    assert st.xid_events == 1  # the gauge changed once (0 -> 79) and then held: not one event per step
    res, eps, page = backtest(scenario["out"], scenario["tmp"] / "report-import")
    assert page is not None and page.exists() and (page.parent / "incidents.jsonl").exists()
    found = _found(eps)
    assert {k for k in found if k[0] != FAULTY} == set(), "an incident on the healthy host"
    assert {(c, m) for h, c, m in found} == set(EXPECTED), found.keys()
    for (comp, mode), fault in EXPECTED.items():
        e = found[(FAULTY, comp, mode)]
        lag = e.first_seen - (t0 + FAULTS[fault][0])
        assert -1.5 <= lag <= 5.0, f"{mode} on {comp} raised {lag:+.1f} s from its fault"
    xid = found[(FAULTY, uuid(FAULTY, 3), "gpu_fell_off_bus")]
    assert xid.xid == 79
    page_text = page.read_text()
    assert uuid(FAULTY, 2) in page_text and "gpu_dram_uce" in page_text
    print(f"\nbacktest fixture: {len(eps)} incidents; import {st.points} points, {st.samples} host-samples in "
          f"{st.seconds:.2f} s ({st.points / st.seconds:.0f} points/s, {st.samples / st.seconds:.0f} host-samples/s)")
    for e in eps:
        print(f"  {e.failure_mode:24s} {e.component:40s} {e.first_seen - t0:+6.1f} s after t0 [{e.detector}]")


def test_collect_from_the_same_exporter_gives_the_same_incidents(scenario: dict[str, Any]) -> None:
    _, imp, _ = backtest(scenario["out"], None)
    res, col, _ = backtest(scenario["collected"], None)
    assert res.samples >= 2 * RUN_S and res.invalid == 0
    a, b = _found(imp), _found(col)
    assert set(a) == set(b)
    for k in a:
        assert abs(a[k].first_seen - b[k].first_seen) <= 3.0, (k, a[k].first_seen, b[k].first_seen)
    with open(scenario["collected"]) as fh:
        samples = [decode_sample(line) for line in fh if line.strip()]
    assert all(s.source_errors == [] for s in samples)
    xids = [x.xid for s in samples for g in s.gpus for x in g.xids]
    assert xids == [79]  # one event for one change, across ~36 polls of a held gauge
    assert all(g.ecc is not None and g.ecc.sram_uncorrected_volatile is None for s in samples for g in s.gpus)


def test_resume_continues_where_a_stopped_import_left_off(scenario: dict[str, Any]) -> None:
    spec, url = scenario["spec"], scenario["prom"].url
    part = scenario["tmp"] / "resumed.jsonl.gz"
    st1 = run_import(spec, part, PromClient(url), stop_after_chunks=2)
    assert st1.chunks == 2
    with open(part, "ab") as fh:
        fh.write(b"\x1f\x8b torn tail of a killed run")  # cut off on resume
    st2 = run_import(spec, part, PromClient(url))
    assert st2.resumed_from is not None
    with gzip.open(scenario["out"]) as a, gzip.open(part) as b:
        whole = [json.loads(x) for x in a.read().splitlines()]
        again = [json.loads(x) for x in b.read().splitlines()]
    assert again == whole
    with pytest.raises(UserError, match="exists and is not a resumable import"):
        run_import(ImportSpec(url=url, start=spec.start, end=spec.end, step=2.0), part, PromClient(url))


def test_cli_import_and_replay_report(scenario: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    out = scenario["tmp"] / "cli.jsonl.gz"
    t0 = scenario["t0"]
    assert cli_main(["import", "prometheus", "--url", scenario["prom"].url, "--start", f"{t0:.0f}", "--end",
                     f"{t0 + RUN_S:.0f}", "--step", "2s", "--out", str(out), "--quiet"]) == 0
    assert "imported" in capsys.readouterr().out
    rep = scenario["tmp"] / "cli-report"
    assert cli_main(["replay", str(out), "--report", str(rep), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "gpu_dram_uce" in text and "net_link_bad_cable" in text and (rep / "index.html").exists()


def _cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_clear_one_line_errors(scenario: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["import", "prometheus", "--start", "now-1h", "--out", str(tmp_path / "x.jsonl.gz"), "--quiet"]
    assert "cannot reach Prometheus" in _cli_error(base + ["--url", f"http://127.0.0.1:{free_port()}"], capsys)
    ex = scenario["ex"]
    assert "not a Prometheus API" in _cli_error(base + ["--url", f"http://127.0.0.1:{ex.port}"], capsys)
    err = _cli_error(base + ["--url", scenario["prom"].url, "--match", '{__name__="DCGM_FI_NOT_THERE"}'], capsys)
    assert "no DCGM or node_exporter series" in err
    assert "not a time" in _cli_error(base[:3] + ["yesterday", *base[4:], "--url", scenario["prom"].url], capsys)


def test_bearer_and_basic_auth_are_sent_and_refusal_is_clear(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []

    class Auth(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            seen.append(self.headers.get("Authorization", ""))
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Authorization") not in ("Bearer s3cret", "Basic dTpw"):
                self.send_error(401)
                return
            body = b'{"status":"success","data":[]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Auth)
    Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    base = ["import", "prometheus", "--url", url, "--start", "now-1h", "--out", str(tmp_path / "a.jsonl.gz"), "--quiet"]
    try:
        assert "refused the credentials (HTTP 401)" in _cli_error(base, capsys)
        assert "no DCGM or node_exporter series" in _cli_error(base + ["--bearer-token", "s3cret"], capsys)
        os.environ["FLEETHEALTH_PROM_BASIC_AUTH"] = "u:p"
        try:
            assert "no DCGM or node_exporter series" in _cli_error(base, capsys)
        finally:
            del os.environ["FLEETHEALTH_PROM_BASIC_AUTH"]
        assert list(dict.fromkeys(seen)) == ["", "Bearer s3cret", "Basic dTpw"]
    finally:
        srv.shutdown()
        srv.server_close()
