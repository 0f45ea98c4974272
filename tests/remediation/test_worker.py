"""The worker without a scheduler: tickets exactly once, recurrence escalation, hooks, guards,
dead letters, audit immutability, metrics. Real SQLite, real subprocess hooks, in-process bus."""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from fleethealth.bus import ACTIONS, DEADLETTER, INCIDENTS, InProcessBus
from fleethealth.schema import decode_action, encode
from remediation.settings import AllSettings, GuardSettings, HookSettings, RemediationSettings
from tests.remediation.helpers import Clock, incident, kinds, make_worker

DAY = 86400.0


def test_replayed_incident_opens_one_ticket_and_records_once(tmp_path: Path) -> None:
    w = make_worker(tmp_path)
    inc = incident(mode="gpu_ecc_sbe_storm", severity="minor")
    first = w.handle(inc)
    assert kinds(first) == [("ticket_opened", "done")]
    assert w.handle(inc) == [] and w.handle(inc) == []
    assert len(w.tickets.list()) == 1
    assert len(w.store.audit_rows(incident_id=inc.id)) == 1
    assert len(w.bus.records(ACTIONS)) == 1  # type: ignore[attr-defined]


def test_incident_update_adds_evidence_to_the_same_ticket(tmp_path: Path) -> None:
    w = make_worker(tmp_path)
    inc = incident(mode="gpu_thermal", severity="minor")
    w.handle(inc)
    upd = incident(mode="gpu_thermal", severity="minor", id=inc.id, state="updated", update_seq=1)
    assert kinds(w.handle(upd)) == [("ticket_updated", "done")]
    [t] = w.tickets.list()
    assert t.occurrences == 1 and len(t.evidence) == 2


def test_second_dram_uce_on_same_gpu_escalates_open_ticket_to_rma(tmp_path: Path) -> None:
    clock = Clock()
    w = make_worker(tmp_path, clock=clock)
    a = incident(mode="gpu_dram_uce", now=clock.t - 10 * DAY)
    w.handle(a)  # first episode: drain + reset (no scheduler, no hook) -> no ticket
    assert w.tickets.list() == []
    b = incident(mode="gpu_dram_uce", now=clock.t)
    recs = w.handle(b)
    assert ("ticket_opened", "done") in kinds(recs)
    [t] = w.tickets.list()
    assert t.priority == "rma"
    c = incident(mode="gpu_dram_uce", now=clock.t + 1)
    recs = w.handle(c)
    [t] = w.tickets.list()  # still one ticket: updated, not a second one
    assert t.occurrences == 2 and set(t.incidents) == {b.id, c.id}


def test_recurrence_outside_window_does_not_escalate(tmp_path: Path) -> None:
    clock = Clock()
    w = make_worker(tmp_path, clock=clock)
    w.handle(incident(mode="gpu_dram_uce", now=clock.t - 40 * DAY))
    w.handle(incident(mode="gpu_dram_uce", now=clock.t))
    assert w.tickets.list() == []


def test_open_ticket_escalates_when_recurrence_raises_priority(tmp_path: Path) -> None:
    clock = Clock()
    w = make_worker(tmp_path, clock=clock)
    x = incident(mode="gpu_hw_error", now=clock.t - DAY, nvidia_bucket="CONTACT_SUPPORT")
    w.handle(x)  # CONTACT_SUPPORT: ticket rma
    [t] = w.tickets.list()
    assert t.priority == "rma"
    y = incident(mode="gpu_ecc_sbe_storm", severity="minor", now=clock.t)
    recs = w.handle(y)
    assert kinds(recs) == [("ticket_updated", "done")]
    assert w.tickets.list()[0].priority == "rma"  # never lowered


def test_reset_request_without_a_drain_in_place_is_refused_and_the_hook_not_run(tmp_path: Path) -> None:
    out = tmp_path / "requests.txt"
    script = tmp_path / "request-reset"
    script.write_text(f"#!{sys.executable}\nimport sys\nopen({str(out)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n")
    script.chmod(0o755)
    s = AllSettings(remediation=RemediationSettings(hooks=HookSettings(reset_gpu=[str(script), "{host}", "{component}"])))
    w = make_worker(tmp_path, s)
    recs = w.handle(incident(mode="gpu_row_remap_pending", severity="major"))
    # no scheduler: nothing can show the drain in place, so no reset goes to a node that may run jobs
    assert kinds(recs) == [("drain", "skipped"), ("reset_gpu", "refused")]
    assert "drain is in place" in recs[1].reason
    assert not out.exists()


def test_reset_refused_for_the_same_reason_is_recorded_once_across_updates(tmp_path: Path) -> None:
    # broker-restart drill: with --scheduler none every update of a reset incident re-audited the
    # same refusal under the same idempotency key (4 rows for one key)
    w = make_worker(tmp_path)
    inc = incident(mode="gpu_row_remap_pending", severity="major")
    assert kinds(w.handle(inc)) == [("drain", "skipped"), ("reset_gpu", "refused")]
    for seq in (1, 2, 3):
        upd = incident(mode="gpu_row_remap_pending", severity="major", id=inc.id, state="updated", update_seq=seq)
        assert [k for k in kinds(w.handle(upd)) if k[0] in ("drain", "reset_gpu")] == []
    rows = w.store.audit_rows(incident_id=inc.id, kind="reset_gpu")
    assert len(rows) == 1 and rows[0]["outcome"] == "refused"


def test_kill_switch_file_refuses_effects_but_records(tmp_path: Path) -> None:
    switch = tmp_path / "STOP"
    switch.touch()
    s = AllSettings(guards=GuardSettings(kill_switch_file=str(switch)))
    w = make_worker(tmp_path, s)
    recs = w.handle(incident(mode="gpu_gsp_error"))
    assert kinds(recs) == [("drain", "refused"), ("reset_gpu", "refused")]
    assert all("kill switch" in r.reason for r in recs)
    assert b'guard="kill_switch"' in generate_latest(w.metrics.registry)


def test_stale_incident_is_refused(tmp_path: Path) -> None:
    clock = Clock()
    w = make_worker(tmp_path, clock=clock)
    recs = w.handle(incident(mode="gpu_gsp_error", now=clock.t - 3600))
    assert kinds(recs) == [("drain", "refused"), ("reset_gpu", "refused")]
    assert "stale" in recs[0].reason


def test_dry_run_records_and_changes_nothing(tmp_path: Path) -> None:
    s = AllSettings(remediation=RemediationSettings(dry_run=True), guards=GuardSettings(nodes=["gpu-node-[001-010]"]))
    w = make_worker(tmp_path, s)
    recs = w.handle(incident(mode="net_link_down"))
    assert kinds(recs) == [("drain", "dry_run"), ("ticket_opened", "dry_run")]
    assert "would drain" in recs[0].reason
    assert w.tickets.list() == []
    assert [d.node for d in w.store.active_drains()] == ["gpu-node-001"]  # the dry run's own bookkeeping


def test_dry_run_evaluates_the_caps_as_live(tmp_path: Path) -> None:
    """10-node static inventory: the cap is 1 node; forged cluster/rack labels change nothing."""
    s = AllSettings(remediation=RemediationSettings(dry_run=True), guards=GuardSettings(nodes=["gpu-node-[001-010]"]))
    w = make_worker(tmp_path, s)
    incs = [incident(f"gpu-node-00{i}", "gpu_fell_off_bus", cluster=f"forged-{i}", rack=f"r{i}") for i in (1, 2, 3)]
    recs = [r for inc in incs for r in w.handle(inc)]
    drains = [(r.host, r.outcome) for r in recs if r.kind == "drain"]
    assert drains == [("gpu-node-001", "dry_run"), ("gpu-node-002", "queued"), ("gpu-node-003", "queued")]
    assert [r.outcome for r in recs if r.kind == "alert"] == ["dry_run"]  # one alert when the cap trips
    assert w.tick() == [] and len(w.store.queued("drain")) == 2
    # the would-be drain's episode resolves -> would-be resume -> the next queued drain goes (as a dry run)
    w.handle(incident("gpu-node-001", "gpu_fell_off_bus", id=incs[0].id, state="resolved"))
    recs = w.tick()
    assert ("drain", "dry_run") in kinds(recs) and len(w.store.queued("drain")) == 1
    dry = w.store.conn.execute("SELECT COUNT(*) FROM audit WHERE kind='drain' AND outcome='dry_run'").fetchone()[0]
    assert dry == 2


def test_node_outside_the_static_inventory_is_refused(tmp_path: Path) -> None:
    s = AllSettings(remediation=RemediationSettings(dry_run=True), guards=GuardSettings(nodes=["gpu-node-[001-010]"]))
    w = make_worker(tmp_path, s)
    recs = w.handle(incident("forged-host-77", "gpu_fell_off_bus"))
    assert kinds(recs)[0] == ("drain", "refused") and "not in" in recs[0].reason


def test_audit_table_is_append_only(tmp_path: Path) -> None:
    w = make_worker(tmp_path)
    w.handle(incident(mode="gpu_thermal", severity="minor"))
    conn = sqlite3.connect(tmp_path / "state.sqlite")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("UPDATE audit SET outcome='done'")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("DELETE FROM audit")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_malformed_and_unknown_mode_are_dead_lettered_and_worker_carries_on(tmp_path: Path) -> None:
    bus = InProcessBus()
    w = make_worker(tmp_path, bus=bus)
    good = incident(mode="gpu_thermal", severity="minor")
    unknown = json.loads(encode(incident(mode="gpu_thermal")))
    unknown["failure_mode"] = "gpu_possessed"
    bus.publish(INCIDENTS, "h", b"{not json")
    bus.publish(INCIDENTS, "h", json.dumps(unknown).encode())
    bus.publish(INCIDENTS, "h", b'{"v": 1, "id": "x"}')
    bus.publish(INCIDENTS, good.host, encode(good))
    stats = w.run(bus.consumer([INCIDENTS], "g"), exit_when_idle_s=0.2, poll_timeout=0.05)
    assert stats.dead_letters == 3 and stats.incidents == 4
    reasons = [json.loads(r.value)["reason"] for r in bus.records(DEADLETTER)]
    assert any("not valid JSON" in r for r in reasons)
    assert any("unknown failure mode 'gpu_possessed'" in r for r in reasons)
    assert any("required field" in r for r in reasons)
    assert [decode_action(r.value).kind for r in bus.records(ACTIONS)] == ["ticket_opened"]
    assert b"fleethealth_remediation_dead_letters_total 3.0" in generate_latest(w.metrics.registry)


def test_run_stops_on_event(tmp_path: Path) -> None:
    bus = InProcessBus()
    w = make_worker(tmp_path, bus=bus)
    stop = threading.Event()
    t = threading.Thread(target=w.run, args=(bus.consumer([INCIDENTS], "g"),), kwargs={"stop": stop,
                                                                                       "poll_timeout": 0.05})
    t.start()
    bus.publish(INCIDENTS, "h", encode(incident(mode="host_dram_ce_storm", severity="minor")))
    stop.set()
    t.join(5)
    assert not t.is_alive()


def test_rack_cap_counts_the_configured_racks_not_the_message_label(tmp_path: Path) -> None:
    g = GuardSettings(nodes=["gpu-node-[001-040]"], max_drained_per_rack=1,
                      racks={"r1": ["gpu-node-[001-004]"], "r2": ["gpu-node-[005-040]"]})
    w = make_worker(tmp_path, AllSettings(remediation=RemediationSettings(dry_run=True), guards=g))
    a = w.handle(incident("gpu-node-001", "gpu_fell_off_bus", rack="r2"))[0]
    b = w.handle(incident("gpu-node-002", "gpu_fell_off_bus", rack="forged-elsewhere"))[0]
    c = w.handle(incident("gpu-node-005", "gpu_fell_off_bus", rack="r1"))[0]
    assert (a.outcome, b.outcome, c.outcome) == ("dry_run", "queued", "dry_run")
    assert b.details["guard"] == "rack_cap" and "rack 'r1'" in b.reason
    d = w.handle(incident("gpu-node-039", "gpu_fell_off_bus"))[0]  # r2 has one already: the rack cap holds
    assert (d.outcome, d.details["guard"]) == ("queued", "rack_cap")


def test_bus_errors_are_counted_and_the_loop_carries_on(tmp_path: Path) -> None:
    """Each bus call of the loop failing once, as the Kafka adapters fail while a broker restarts (they
    raise BusError; tests/drills/test_broker_restart.py has the real broker): the worker counts and logs
    each, handles every incident once, and the redelivery after a failed commit repeats nothing."""
    from fleethealth.bus import BusError

    class Flaky(InProcessBus):
        fail_flush = fail_publish = 1

        def flush(self, timeout: float | None = None) -> None:
            if self.fail_flush:
                self.fail_flush -= 1
                raise BusError("Kafka flush: 1 message(s) not delivered within 10 s")
            super().flush(timeout)

        def publish(self, topic, key, value, headers=()):  # type: ignore[no-untyped-def]
            if topic == ACTIONS and self.fail_publish:
                self.fail_publish -= 1
                raise BusError("Kafka send to fleet.actions.v1: the producer queue stayed full for 60 s")
            return super().publish(topic, key, value, headers)

    class FlakyConsumer:
        def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
            self.inner, self.fail_poll, self.fail_commit, self.uncommitted = inner, 1, 1, []  # type: ignore[var-annotated]

        def poll(self, timeout: float = 1.0, max_records: int = 500):  # type: ignore[no-untyped-def]
            if self.fail_poll:
                self.fail_poll -= 1
                raise BusError("Kafka poll failed: Local: Broker transport failure")
            return self.inner.poll(timeout, max_records)

        def commit(self) -> None:
            if self.fail_commit:
                self.fail_commit -= 1
                raise BusError('Kafka commit failed: KafkaError{code=_WAIT_COORD,str="Waiting for coordinator"}')
            self.inner.commit()

    bus = Flaky()
    incs = [incident(host=f"gpu-node-{i:03d}", mode="gpu_thermal", severity="minor") for i in range(3)]
    for inc in incs:
        bus.publish(INCIDENTS, inc.host, encode(inc))
    w = make_worker(tmp_path, bus=bus)
    stats = w.run(FlakyConsumer(bus.consumer([INCIDENTS], "g")), exit_when_idle_s=0.3, poll_timeout=0.05)  # type: ignore[arg-type]
    assert stats.bus_errors == 4 and stats.incidents == 3
    text = generate_latest(w.metrics.registry).decode()
    for op in ("poll", "publish", "flush", "commit"):
        assert f'fleethealth_remediation_bus_errors_total{{op="{op}"}} 1.0' in text
    assert len(w.tickets.list()) == 3  # every incident decided once
    # the uncommitted batch, delivered again by a new owner: nothing is decided twice
    again = w.run(bus.consumer([INCIDENTS], "g"), exit_when_idle_s=0.3, poll_timeout=0.05)
    assert again.actions == 0 and len(w.tickets.list()) == 3
    assert len(w.store.audit_rows()) == 3
    assert len(bus.records(ACTIONS)) == 2  # one announcement lost to the failed publish; the audit has all three
