"""Every query of every dashboard, run against the real Prometheus scraping a running pipeline.

`fleethealth run` on a simulated fleet with faults serves the collector-style metrics on 9404 and
the fleet services' metrics on 9403 — the ports deploy/prometheus/prometheus.yml scrapes every
second. Each panel's PromQL (template variables filled in with a real host) must parse and return
data, and the fleet overview must show the failure modes the pipeline detected.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.build import all_queries
from fleetcli.pipeline import RunOptions, RunResult, run

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
COLLECTOR_PORT, SERVICES_PORT = 9404, 9403
WINDOW = "5m"  # $__rate_interval / $__interval: covers the whole run


def _scraped_ports() -> set[int]:
    cfg = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    return {int(t.rsplit(":", 1)[1]) for job in cfg["scrape_configs"] for sc in job["static_configs"]
            for t in sc["targets"]}


def _query(url: str, expr: str, at: float | None = None) -> dict[str, Any]:
    """An instant query, at wall time ``at`` (default: now)."""
    q = urllib.parse.urlencode({"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {}))
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:  # a parse error comes back as 400 with a JSON body
        return json.loads(exc.read() or b"{}") | {"http_status": exc.code}


def _wait(pred, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def served(prometheus_url: str):
    assert {COLLECTOR_PORT, SERVICES_PORT} <= _scraped_ports(), "prometheus.yml no longer scrapes 9404/9403"
    ready, finished, stop = threading.Event(), threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            run(RunOptions(simulate=True, hosts=12, duration="1h", interval=10.0,
                                           fault_rate=3000.0, seed=3, speed=300.0, quiet=True,
                                           metrics_port=SERVICES_PORT, exporter_port=COLLECTOR_PORT,
                                           keep_serving=300.0),
                                ready=ready, on_finished=lambda r: (box.update(result=r), finished.set()), stop=stop)
        except BaseException as exc:
            box["error"] = exc
            ready.set()
            finished.set()

    t = threading.Thread(target=work, name="fleethealth-run", daemon=True)
    t.start()
    try:
        assert ready.wait(30)
        assert "error" not in box, box.get("error")

        def up(job: str) -> bool:
            r = _query(prometheus_url, f'up{{job="{job}", instance=~".*:({COLLECTOR_PORT}|{SERVICES_PORT})"}} == 1')
            return bool(r.get("data", {}).get("result"))

        _wait(lambda: up("fleethealth-collector") and up("fleethealth-services"), "Prometheus to scrape 9404 and 9403")
        assert finished.wait(120), "the run did not finish"
        assert "error" not in box, box.get("error")
        done_at = time.time()

        def final_snapshot() -> float | None:
            # A moment at which both targets' latest scrape succeeded and began 2.5 s (a few 1 s scrapes)
            # after the run finished, so rate()/increase() have two points of the final state. The tests
            # query at that moment, not "now": on a loaded machine a scrape can pass its 1 s timeout,
            # and a failed scrape marks every series stale until the next one. The moment is 1.5 s in
            # the past, so every scrape begun by then has ended (scrape_timeout 1 s).
            at = time.time() - 1.5
            for job in ("fleethealth-collector", "fleethealth-services"):
                r = _query(prometheus_url, f'timestamp(up{{job="{job}", instance=~".*:({COLLECTOR_PORT}|{SERVICES_PORT})"}}'
                                           ' == 1)', at)
                ts = [float(x["value"][1]) for x in r.get("data", {}).get("result", [])]
                if not ts or min(ts) < done_at + 2.5:
                    return None
            return at

        snap: list[float] = []

        def found() -> bool:
            at = final_snapshot()
            if at is not None:
                snap.append(at)
            return bool(snap)

        _wait(found, "a successful scrape of the final state")
        yield prometheus_url, box["result"], snap[0]
    finally:
        stop.set()
        t.join(30)
        assert not t.is_alive(), "the run did not release its ports"


def _host_with_xids(url: str, at: float) -> str:
    r = _query(url, "sort_desc(sum by (host) (fleethealth_gpu_xid_events_total))", at)
    hosts = [s["metric"]["host"] for s in r["data"]["result"]]
    assert hosts, "no Xid events exported: the simulated fleet should have some at this fault rate"
    return hosts[0]


def _fill(expr: str, host: str) -> str:
    for var in ("$__rate_interval", "$__interval", "$__range"):
        expr = expr.replace(var, WINDOW)
    return expr.replace("$host", host).replace("$cluster", ".*")  # the variable's All


def test_every_dashboard_query_parses_and_returns_data(served) -> None:
    url, _, at = served
    host = _host_with_xids(url, at)
    problems, n = [], 0
    for dash, items in all_queries().items():
        for where, expr in items:
            n += 1
            r = _query(url, _fill(expr, host), at)
            if r.get("status") != "success":
                problems.append(f"{dash} {where}: {r.get('errorType')}: {r.get('error')}  [{expr}]")
            elif not r["data"]["result"]:
                problems.append(f"{dash} {where}: no data  [{_fill(expr, host)}]")
    assert n >= 30
    assert not problems, "\n".join(problems)


def test_fleet_overview_shows_the_injected_faults(served) -> None:
    url, res, at = served
    assert isinstance(res, RunResult)
    detected = {i.failure_mode for i in res.incidents}
    assert detected, "the simulated faults produced no incidents"
    r = _query(url, 'sum by (failure_mode) (fleethealth_fleet_incident_messages_total{state="open"})', at)
    shown = {s["metric"]["failure_mode"]: float(s["value"][1]) for s in r["data"]["result"]}
    for mode in detected:
        assert shown.get(mode, 0) > 0, f"{mode} detected but not on the fleet overview: {shown}"
    opened = {i.failure_mode for i in res.incidents if i.state == "open"}
    assert set(shown) == opened
    states = _query(url, "sum by (state) (fleethealth_fleet_hosts)", at)["data"]["result"]
    per_state = {s["metric"]["state"]: float(s["value"][1]) for s in states}
    assert sum(per_state.values()) == 12
    assert per_state["healthy"] < 12, "faulty hosts should not all show healthy"
