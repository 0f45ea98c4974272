"""Ticket lifecycle, the `fleethealth tickets` command, and the webhook sink against a real local
HTTP server that is down, slow, then healthy: retries with backoff, outbox, nothing lost."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from remediation.store import RemediationStore
from remediation.tickets import TicketError, TicketStore, WebhookSink
from tests.remediation.helpers import incident


class Receiver:
    """A real HTTP server on 127.0.0.1 collecting POSTed JSON; can be made slow."""

    def __init__(self, port: int = 0) -> None:
        self.got: list[dict] = []
        self.keys: list[str] = []
        self.delay = 0.0
        self.answers: dict[str, list[int]] = {}  # component -> statuses to answer first (then 201)
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(outer.delay)
                doc = json.loads(body)
                queue = outer.answers.get(doc["ticket"]["component"], [])
                code = queue.pop(0) if queue else 201
                if code == 201:
                    outer.got.append(doc)
                    outer.keys.append(self.headers["Idempotency-Key"])
                self.send_response(code)
                self.end_headers()
                try:
                    self.wfile.write(b"{}")
                except OSError:
                    pass

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _free_port() -> int:
    r = Receiver()
    port = r.port
    r.stop()
    return port


def test_lifecycle_and_one_open_ticket_per_component(tmp_path: Path) -> None:
    st = RemediationStore.open(tmp_path / "s.sqlite")
    tk = TicketStore(st.conn)
    a = incident(mode="host_dram_uce", component="DIMM_A1")
    with st.tx():
        t, ev = tk.open_or_update(a, "normal", 1.0)
        t2, ev2 = tk.open_or_update(incident(mode="host_dram_uce", component="DIMM_A1"), "normal", 2.0)
    assert (ev, ev2, t.id) == ("opened", "updated", t2.id)
    with st.tx():
        tk.set_state(t.id, "in_repair", 3.0)
        tk.set_state(t.id, "repaired", 4.0)
    with pytest.raises(TicketError, match="cannot become open"), st.tx():
        tk.set_state(t.id, "open", 5.0)
    events = [h["event"] for h in tk.history(t.id)]
    assert events == ["opened", "updated", "in_repair", "repaired"]
    with st.tx():  # after repair, a new fault opens a new ticket
        t3, ev3 = tk.open_or_update(incident(mode="host_dram_uce", component="DIMM_A1"), "normal", 6.0)
    assert ev3 == "opened" and t3.id != t.id


def test_tickets_cli_list_show_close(tmp_path: Path) -> None:
    db = tmp_path / "s.sqlite"
    st = RemediationStore.open(db)
    with st.tx():
        t, _ = TicketStore(st.conn).open_or_update(incident(mode="gpu_thermal"), "normal", time.time())
    st.close()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fleetcli.cli", "tickets", "--state-db", str(db), *args],
                              capture_output=True, text=True, timeout=60)

    out = cli("list")
    assert out.returncode == 0 and "gpu_thermal" in out.stdout and " open " in out.stdout
    shown = json.loads(cli("show", str(t.id)).stdout)
    assert shown["evidence"][0]["line"].startswith("NVRM: Xid") and shown["history"][0]["event"] == "opened"
    assert cli("close", str(t.id), "--repaired", "--note", "reseated").stdout.strip() == f"ticket {t.id}: repaired"
    again = cli("close", str(t.id))
    assert again.returncode == 2 and "is repaired; it cannot become closed" in again.stderr
    assert cli("show", "999").returncode == 2


def test_tickets_list_escapes_control_characters_and_a_corrupt_db_is_a_clean_error(tmp_path: Path) -> None:
    db = tmp_path / "s.sqlite"
    st = RemediationStore.open(db)
    evil = "gpu-node-007\x1b[2J\x1b[H\x1b]0;owned\x07 GPU-1\r\u202e"
    with st.tx():  # written straight to the store: the contract's own checks are not what is tested here
        TicketStore(st.conn).open_or_update(incident(evil, "gpu_thermal"), "normal", time.time())
    st.close()
    out = subprocess.run([sys.executable, "-m", "fleetcli.cli", "tickets", "--state-db", str(db), "list"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "\x1b" not in out.stdout and "\r" not in out.stdout and "\u202e" not in out.stdout
    assert "gpu-node-007\\x1b[2J" in out.stdout  # shown escaped
    bad = tmp_path / "garbage.sqlite"
    bad.write_bytes(b"this is not an SQLite file" * 100)
    out = subprocess.run([sys.executable, "-m", "fleetcli.cli", "tickets", "--state-db", str(bad), "list"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "not a usable remediation state DB" in out.stderr
    assert "Traceback" not in out.stderr


def _three_events(st: RemediationStore) -> None:
    tk = TicketStore(st.conn)
    with st.tx():
        for comp in ("GPU-a", "GPU-b", "GPU-c"):
            tk.open_or_update(incident(mode="gpu_thermal", component=comp), "normal", time.time())


def test_webhook_down_then_up_loses_nothing(tmp_path: Path) -> None:
    st = RemediationStore.open(tmp_path / "s.sqlite")
    _three_events(st)
    port = _free_port()
    slept: list[float] = []
    sink = WebhookSink(st.conn, f"http://127.0.0.1:{port}/tickets", timeout_s=1, attempts=3, backoff_s=0.01,
                       sleep=slept.append)
    rep = sink.deliver()
    assert (rep.sent, rep.failed, rep.pending) == (0, 1, 3)
    assert slept == [0.01, 0.02]  # exponential backoff between attempts
    row = st.conn.execute("SELECT attempts, last_error FROM outbox ORDER BY seq LIMIT 1").fetchone()
    assert row[0] == 1 and "ConnectionError" in row[1]
    assert sink.deliver().sent == 0  # not due yet: backoff holds the retry back
    st.conn.execute("UPDATE outbox SET next_attempt=0")
    recv = Receiver(port)
    try:
        rep = sink.deliver()
        assert (rep.sent, rep.pending) == (3, 0)
        assert [g["ticket"]["component"] for g in recv.got] == ["GPU-a", "GPU-b", "GPU-c"]
        assert len(set(recv.keys)) == 3
    finally:
        recv.stop()


def test_slow_webhook_times_out_is_retried_and_delivered(tmp_path: Path) -> None:
    st = RemediationStore.open(tmp_path / "s.sqlite")
    _three_events(st)
    recv = Receiver()
    recv.delay = 0.6
    try:
        sink = WebhookSink(st.conn, f"http://127.0.0.1:{recv.port}/", timeout_s=0.2, attempts=2, backoff_s=0.01)
        rep = sink.deliver()
        assert rep.sent == 0 and rep.pending == 3
        assert "Timeout" in st.conn.execute("SELECT last_error FROM outbox ORDER BY seq LIMIT 1").fetchone()[0]
        recv.delay = 0.0
        st.conn.execute("UPDATE outbox SET next_attempt=0")
        assert sink.deliver().pending == 0
        # the slow server may have processed timed-out posts too: at-least-once, deduplicable by key
        assert {g["ticket"]["component"] for g in recv.got} == {"GPU-a", "GPU-b", "GPU-c"}
        assert len(set(recv.keys)) == 3
    finally:
        recv.stop()


def test_webhook_4xx_dead_letters_that_event_and_later_events_go_through(tmp_path: Path) -> None:
    st = RemediationStore.open(tmp_path / "s.sqlite")
    _three_events(st)
    recv = Receiver()
    recv.answers = {"GPU-a": [413, 413, 413]}  # the receiver refuses the first event for good
    try:
        sink = WebhookSink(st.conn, f"http://127.0.0.1:{recv.port}/", timeout_s=2, attempts=3, backoff_s=0.01,
                           sleep=lambda _s: None)
        rep = sink.deliver()
        assert (rep.sent, rep.dead, rep.pending) == (2, 1, 0)
        assert [g["ticket"]["component"] for g in recv.got] == ["GPU-b", "GPU-c"]
        [dead] = sink.dead()
        assert dead["status"] == 413 and "HTTP 413" in dead["reason"]
        assert json.loads(dead["payload"])["ticket"]["component"] == "GPU-a"
        assert recv.answers["GPU-a"] == [413, 413]  # one POST: a 4xx is not retried
    finally:
        recv.stop()


def test_webhook_5xx_retries_with_backoff_and_keeps_order(tmp_path: Path) -> None:
    st = RemediationStore.open(tmp_path / "s.sqlite")
    _three_events(st)
    recv = Receiver()
    recv.answers = {"GPU-a": [503, 503, 503, 500]}
    slept: list[float] = []
    try:
        sink = WebhookSink(st.conn, f"http://127.0.0.1:{recv.port}/", timeout_s=2, attempts=3, backoff_s=0.01,
                           sleep=slept.append)
        rep = sink.deliver()
        assert (rep.sent, rep.dead, rep.pending) == (0, 0, 3) and slept == [0.01, 0.02]
        assert recv.got == []  # the rest waits behind the event being retried
        st.conn.execute("UPDATE outbox SET next_attempt=0")
        rep = sink.deliver()
        assert (rep.sent, rep.pending) == (3, 0)
        assert [g["ticket"]["component"] for g in recv.got] == ["GPU-a", "GPU-b", "GPU-c"]
        assert sink.dead() == []
    finally:
        recv.stop()
